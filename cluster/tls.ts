// The cluster's mutual TLS: one certificate authority signs every node's and every gateway's
// certificate. Nodes present a certificate for the name NODE_SERVER_NAME (whatever address a
// gateway dials, so that node addresses need not be in certificates) and accept only clients
// whose certificate's common name is GATEWAY_CLIENT_NAME; nothing crosses hosts in plain text.
import { readFileSync } from "node:fs";
import { connect, type PeerCertificate, type TLSSocket } from "node:tls";
import type { DaemonEndpoint } from "../runtime/daemon-endpoint.js";

export const NODE_SERVER_NAME = "sandfork-node";
export const GATEWAY_CLIENT_NAME = "sandfork-gateway";

/** PEM material: the authority's certificate, this process's certificate and its key. */
export interface ClusterTls {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
}

/** From SANDFORK_CLUSTER_CA, SANDFORK_CLUSTER_CERT and SANDFORK_CLUSTER_KEY (file paths; all three). */
export function loadClusterTls(env: NodeJS.ProcessEnv): ClusterTls {
  const names = ["SANDFORK_CLUSTER_CA", "SANDFORK_CLUSTER_CERT", "SANDFORK_CLUSTER_KEY"] as const;
  const missing = names.filter((name) => !env[name]);
  if (missing.length > 0)
    throw new Error(`a cluster needs ${missing.join(", ")} (PEM files; docs/deployment.md)`);
  const read = (name: (typeof names)[number]) => {
    try {
      return readFileSync(env[name] as string);
    } catch (error) {
      throw new Error(`${name}: cannot read ${env[name]}: ${(error as Error).message}`);
    }
  };
  return {
    ca: read("SANDFORK_CLUSTER_CA"),
    cert: read("SANDFORK_CLUSTER_CERT"),
    key: read("SANDFORK_CLUSTER_KEY"),
  };
}

/** "host:port" or "[v6]:port" split; throws on anything else. */
export function parseAddress(address: string): { host: string; port: number } {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(address);
  const port = Number(match?.[3]);
  if (match === null || port < 1 || port > 65_535)
    throw new Error(`not a host:port address: ${JSON.stringify(address)}`);
  return { host: (match[1] ?? match[2]) as string, port };
}

/** A node's daemon, dialled over mutual TLS at `address`. */
export function nodeEndpoint(address: string, tls: ClusterTls): DaemonEndpoint {
  const { host, port } = parseAddress(address);
  return {
    label: `node ${address}`,
    readyEvent: "secureConnect",
    dial: () => {
      const socket = connect({
        host,
        port,
        ca: tls.ca,
        cert: tls.cert,
        key: tls.key,
        servername: NODE_SERVER_NAME,
        minVersion: "TLSv1.3",
      });
      socket.setKeepAlive(true, 1_000);
      socket.setNoDelay(true);
      return socket;
    },
  };
}

/** Whether a verified client certificate is a gateway's. */
export function isGatewayCertificate(socket: TLSSocket): boolean {
  const peer: PeerCertificate | undefined = socket.getPeerCertificate();
  return socket.authorized && peer?.subject?.CN === GATEWAY_CLIENT_NAME;
}
