// Where a daemon client dials: the local daemon's Unix socket, or (cluster/tls.ts: nodeEndpoint)
// a node serving its daemon over mutual TLS. Either way the protocol on the stream is the same.
import { connect, type Socket } from "node:net";

export interface DaemonEndpoint {
  /** Names the endpoint in messages ("sandfork-vmm at <label>"). */
  readonly label: string;
  /** Opens a stream to the daemon. */
  dial(): Socket;
  /** The socket's event after which requests may be written ("connect"; "secureConnect" for TLS). */
  readonly readyEvent: "connect" | "secureConnect";
}

export function unixEndpoint(socketPath: string): DaemonEndpoint {
  return { label: socketPath, dial: () => connect({ path: socketPath }), readyEvent: "connect" };
}
