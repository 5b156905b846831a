// A node's TLS front: each gateway connection that presents a gateway's certificate signed by the
// cluster's authority (cluster/tls.ts) is joined to a connection of its own to the local daemon's
// Unix socket, byte for byte. The daemon checks every frame as it does for a local gateway.
import { connect, type Socket } from "node:net";
import { createServer, type Server, type TLSSocket } from "node:tls";
import { type ClusterTls, isGatewayCertificate } from "./tls.js";

export interface NodeServerOptions {
  tls: ClusterTls;
  /** The local daemon's socket. */
  socketPath: string;
  host: string;
  /** 0: any free port (`port` then says which). */
  port: number;
  log?: (line: string) => void;
}

export class NodeServer {
  private readonly server: Server;
  /** Both ends of every joined connection. */
  private readonly open = new Set<Socket>();
  private readonly log: (line: string) => void;

  private constructor(private readonly options: NodeServerOptions) {
    this.log = options.log ?? (() => {});
    this.server = createServer({
      ca: options.tls.ca,
      cert: options.tls.cert,
      key: options.tls.key,
      requestCert: true,
      rejectUnauthorized: true,
      minVersion: "TLSv1.3",
    });
    this.server.on("secureConnection", (remote: TLSSocket) => this.join(remote));
    // A connection closed before any handshake (a TCP liveness probe) is not worth a line.
    this.server.on("tlsClientError", (error, socket) => {
      if ((error as NodeJS.ErrnoException).code === "ECONNRESET") return;
      this.log(`TLS handshake from ${socket.remoteAddress} failed: ${error.message}`);
    });
  }

  static async listen(options: NodeServerOptions): Promise<NodeServer> {
    const node = new NodeServer(options);
    await new Promise<void>((resolve, reject) => {
      node.server.once("error", reject);
      node.server.listen(options.port, options.host, () => {
        node.server.off("error", reject);
        resolve();
      });
    });
    return node;
  }

  /** The port it listens on. */
  get port(): number {
    const address = this.server.address();
    return typeof address === "object" && address !== null ? address.port : this.options.port;
  }

  private join(remote: TLSSocket): void {
    if (!isGatewayCertificate(remote)) {
      this.log(`refused a client from ${remote.remoteAddress}: not a gateway's certificate`);
      remote.destroy();
      return;
    }
    remote.setKeepAlive(true, 1_000);
    remote.setNoDelay(true);
    const local = connect({ path: this.options.socketPath });
    this.open.add(remote);
    this.open.add(local);
    const close = () => {
      remote.destroy();
      local.destroy();
      this.open.delete(remote);
      this.open.delete(local);
    };
    remote.on("error", close).on("close", close);
    local.on("error", close).on("close", close);
    remote.pipe(local);
    local.pipe(remote);
  }

  /** Stops accepting and closes every joined connection. */
  close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const socket of this.open) socket.destroy();
    return closed;
  }
}
