// The node's TLS front against a stand-in daemon (a Unix socket that echoes): mutual TLS with the
// cluster's authority, only gateways' certificates admitted, the bytes joined both ways.
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NodeServer } from "./node-server.js";
import { type ClusterCerts, makeClusterCerts, tlsEnv } from "./testing/certs.js";
import { type ClusterTls, loadClusterTls, NODE_SERVER_NAME } from "./tls.js";

let dir: string;
let certs: ClusterCerts;
let echo: Server;
let node: NodeServer;

function tlsOf(files: ClusterCerts["gateway"]): ClusterTls {
  return loadClusterTls(tlsEnv(files));
}

/** Connects as `client`, writes `text`, and resolves with what comes back before the close (or the error). */
function exchange(
  client: ClusterTls,
  text: string,
  servername = NODE_SERVER_NAME,
): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect({
      host: "127.0.0.1",
      port: node.port,
      ca: client.ca,
      cert: client.cert,
      key: client.key,
      servername,
    });
    let got = "";
    const timer = setTimeout(() => socket.destroy(), 3_000);
    socket.on("secureConnect", () => socket.write(text));
    socket.on("data", (chunk: Buffer) => {
      got += chunk.toString();
      if (got.length >= text.length) socket.end();
    });
    socket.on("error", (error) => {
      clearTimeout(timer);
      resolve(`error: ${error.message}`);
    });
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(got);
    });
  });
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-node-tls-"));
  certs = makeClusterCerts(join(dir, "certs"));
  echo = createServer((socket) => socket.pipe(socket));
  await new Promise<void>((resolve) => echo.listen(join(dir, "daemon.sock"), resolve));
  node = await NodeServer.listen({
    tls: tlsOf(certs.node),
    socketPath: join(dir, "daemon.sock"),
    host: "127.0.0.1",
    port: 0,
  });
});

afterAll(async () => {
  await node?.close();
  await new Promise<void>((resolve) => (echo ? echo.close(() => resolve()) : resolve()));
  await rm(dir, { recursive: true, force: true });
});

describe("a node's TLS front", () => {
  it("joins a gateway's connection to the daemon's socket, both ways", async () => {
    expect(await exchange(tlsOf(certs.gateway), "hello daemon")).toBe("hello daemon");
  });

  it("refuses a client certificate of another authority at the handshake", async () => {
    const answer = await exchange(tlsOf(certs.stranger), "let me in");
    expect(answer).not.toContain("let me in");
  });

  it("refuses a certificate of the cluster that is not a gateway's", async () => {
    expect(await exchange(tlsOf(certs.nodeAsClient), "let me in")).not.toContain("let me in");
  });

  it("is refused by a gateway that expects another server name", async () => {
    expect(await exchange(tlsOf(certs.gateway), "hi", "someone-else")).toMatch(
      /^error: .*altnames/i,
    );
  });

  it("refuses a client without a certificate", async () => {
    const answer = await new Promise<string>((resolve) => {
      const socket = connect({
        host: "127.0.0.1",
        port: node.port,
        ca: tlsOf(certs.gateway).ca,
        servername: NODE_SERVER_NAME,
      });
      let got = "";
      socket.on("secureConnect", () => socket.write("anonymous"));
      socket.on("data", (c: Buffer) => (got += c.toString()));
      socket.on("error", () => resolve(got));
      socket.on("close", () => resolve(got));
    });
    expect(answer).toBe("");
  });
});
