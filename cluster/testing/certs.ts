// For tests: a cluster's certificates made with openssl (Debian's): an authority, a node's
// server certificate (NODE_SERVER_NAME), a gateway's client certificate (GATEWAY_CLIENT_NAME),
// and a stranger's client certificate from another authority.
import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { GATEWAY_CLIENT_NAME, NODE_SERVER_NAME } from "../tls.js";

/** Paths of one party's PEM files. */
export interface CertFiles {
  ca: string;
  cert: string;
  key: string;
}

export interface ClusterCerts {
  node: CertFiles;
  gateway: CertFiles;
  /** A node's certificate used as a client: signed by the authority, but not a gateway's. */
  nodeAsClient: CertFiles;
  /** A client certificate named like a gateway's, signed by another authority. */
  stranger: CertFiles;
}

function openssl(dir: string, args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/** `openssl req` making the P-256 key `name`.key and, for `cn`, the request or (`-x509`) certificate `out`. */
function newKey(dir: string, name: string, cn: string, out: string, more: string[] = []): void {
  openssl(dir, [
    "req",
    ...more,
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
    `${name}.key`,
    "-out",
    out,
    "-subj",
    `/CN=${cn}`,
  ]);
}

function authority(dir: string, name: string): void {
  newKey(dir, name, name, `${name}.pem`, ["-x509", "-days", "2"]);
}

function signed(dir: string, ca: string, name: string, cn: string, extensions: string): CertFiles {
  newKey(dir, name, cn, `${name}.csr`);
  writeFileSync(join(dir, `${name}.ext`), extensions);
  openssl(dir, [
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    `${ca}.pem`,
    "-CAkey",
    `${ca}.key`,
    "-CAcreateserial",
    "-out",
    `${name}.pem`,
    "-days",
    "2",
    "-extfile",
    `${name}.ext`,
  ]);
  return {
    ca: join(dir, `${ca}.pem`),
    cert: join(dir, `${name}.pem`),
    key: join(dir, `${name}.key`),
  };
}

/** Makes the certificates in `dir` (created). */
export function makeClusterCerts(dir: string): ClusterCerts {
  mkdirSync(dir, { recursive: true });
  authority(dir, "cluster-ca");
  authority(dir, "other-ca");
  const server = `subjectAltName=DNS:${NODE_SERVER_NAME}\nextendedKeyUsage=serverAuth,clientAuth\n`;
  const client = "extendedKeyUsage=clientAuth\n";
  const node = signed(dir, "cluster-ca", "node", NODE_SERVER_NAME, server);
  return {
    node,
    gateway: signed(dir, "cluster-ca", "gateway", GATEWAY_CLIENT_NAME, client),
    nodeAsClient: node,
    stranger: {
      ...signed(dir, "other-ca", "stranger", GATEWAY_CLIENT_NAME, client),
      ca: node.ca,
    },
  };
}

/** The environment that hands `files` to a node or a gateway. */
export function tlsEnv(files: CertFiles): Record<string, string> {
  return {
    SANDFORK_CLUSTER_CA: files.ca,
    SANDFORK_CLUSTER_CERT: files.cert,
    SANDFORK_CLUSTER_KEY: files.key,
  };
}
