// One connection to `sandfork-vmm serve` (its Unix socket, or a node's TLS endpoint): the hello
// handshake, then requests multiplexed by id, answered in any order (native-vmm/PROTOCOL.md).
import type { Socket } from "node:net";
import type { DaemonEndpoint } from "./daemon-endpoint.js";
import {
  RuntimeConnectionLostError,
  RuntimeProtocolError,
  RuntimeRequestError,
  RuntimeUnavailableError,
} from "./errors.js";
import { encodeFrame, FrameDecoder, FrameError, type FrameObject } from "./frames.js";
import {
  errorFromFrame,
  helloFrame,
  parseHello,
  RESPONSE_TYPE,
  type RequestType,
} from "./protocol.js";

/** What to do with a request's answer. */
export interface ResponseHandler {
  /** The daemon's response frame of the expected type. */
  resolve(frame: FrameObject): void;
  /** An error frame (as a typed error), or the connection closing before the answer. */
  reject(error: Error): void;
  /** An `output` frame before the answer (streamed executions only). */
  output?(frame: FrameObject): void;
}

interface InFlight {
  type: RequestType;
  /** Null once the caller stopped waiting: the daemon is still working on it, the answer is dropped. */
  handler: ResponseHandler | null;
}

/** Largest request id; ids are JSON integers within 0..2^53 (PROTOCOL.md). */
const MAX_ID = Number.MAX_SAFE_INTEGER;

export class DaemonConnection {
  /** The daemon's name and version from its hello. */
  readonly server: string;
  /** Called once when the connection is gone, with why. */
  onClose: (reason: string) => void = () => {};
  /** Called after each answer (also one nobody waits for any more): a request slot is free. */
  onAnswer: () => void = () => {};

  private readonly inFlight = new Map<number, InFlight>();
  private nextId = 1;
  private closed = false;

  private constructor(
    private readonly socket: Socket,
    private readonly decoder: FrameDecoder,
    server: string,
  ) {
    this.server = server;
    socket.on("data", (chunk: Buffer) => this.receive(chunk));
    socket.on("error", (error) => this.shutDown(`socket error: ${error.message}`));
    socket.on("close", () => this.shutDown("the daemon closed the connection"));
    // Bytes that arrived together with the hello.
    this.receive(Buffer.alloc(0));
  }

  /** Connects to `endpoint` and completes the handshake; rejects with a typed runtime error. */
  static open(endpoint: DaemonEndpoint, timeoutMs: number): Promise<DaemonConnection> {
    return new Promise((resolve, reject) => {
      const socket = endpoint.dial();
      const decoder = new FrameDecoder();
      let settled = false;
      const fail = (error: Error) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.destroy();
        reject(error);
      };
      const timer = setTimeout(
        () =>
          fail(
            new RuntimeUnavailableError(
              `sandfork-vmm at ${endpoint.label} did not complete the handshake within ${timeoutMs} ms`,
            ),
          ),
        timeoutMs,
      );
      socket.once("error", (error) =>
        fail(
          new RuntimeUnavailableError(
            `cannot connect to sandfork-vmm at ${endpoint.label}: ${error.message}`,
          ),
        ),
      );
      socket.once("close", () =>
        fail(
          new RuntimeUnavailableError(
            `sandfork-vmm at ${endpoint.label} closed the connection during the handshake`,
          ),
        ),
      );
      socket.once(endpoint.readyEvent, () => socket.write(encodeFrame(helloFrame())));
      const onData = (chunk: Buffer) => {
        decoder.push(chunk);
        let frame: FrameObject | undefined;
        try {
          frame = decoder.next();
          if (frame === undefined) return;
          const { server } = parseHello(frame);
          settled = true;
          clearTimeout(timer);
          socket.off("data", onData);
          socket.removeAllListeners("error");
          socket.removeAllListeners("close");
          resolve(new DaemonConnection(socket, decoder, server));
        } catch (error) {
          fail(
            error instanceof FrameError
              ? new RuntimeProtocolError(`bad hello from sandfork-vmm: ${error.message}`)
              : (error as Error),
          );
        }
      };
      socket.on("data", onData);
    });
  }

  /** Requests sent and not yet answered, including those whose caller stopped waiting. */
  get pending(): number {
    return this.inFlight.size;
  }

  /**
   * Sends one request; `handler` gets its answer. Returns the request's id. Throws (without
   * sending) a RuntimeRequestError for a request too large for a frame.
   */
  send(type: RequestType, fields: FrameObject, handler: ResponseHandler): number {
    if (this.closed)
      throw new RuntimeConnectionLostError("the connection to sandfork-vmm is closed");
    const id = this.nextId;
    let frame: Buffer;
    try {
      frame = encodeFrame({ ...fields, id, type });
    } catch (error) {
      if (error instanceof FrameError)
        throw new RuntimeRequestError("frame_too_large", error.message);
      throw error;
    }
    this.nextId = id === MAX_ID ? 1 : id + 1;
    this.inFlight.set(id, { type, handler });
    this.socket.write(frame);
    return id;
  }

  /** The caller stopped waiting for request `id`; its answer, when it comes, is dropped. */
  abandon(id: number): void {
    const request = this.inFlight.get(id);
    if (request !== undefined) request.handler = null;
  }

  /** Closes the connection; requests in flight fail with RuntimeConnectionLostError. */
  close(reason = "the client closed the connection"): void {
    this.shutDown(reason);
  }

  private receive(chunk: Buffer): void {
    if (this.closed) return;
    this.decoder.push(chunk);
    for (;;) {
      let frame: FrameObject | undefined;
      try {
        frame = this.decoder.next();
      } catch (error) {
        this.shutDown(`the daemon sent a bad frame: ${(error as Error).message}`);
        return;
      }
      if (frame === undefined) return;
      const violation = this.dispatch(frame);
      if (violation !== null) {
        this.shutDown(`the daemon broke protocol v1: ${violation}`);
        return;
      }
    }
  }

  /** Hands one frame to its request; returns a description of a protocol violation, or null. */
  private dispatch(frame: FrameObject): string | null {
    const id = frame.id;
    if (id === null && frame.type === "error") {
      // `bad_frame` without an id: the daemon could not read one of our frames (a client bug).
      // If it lost the frame boundary it closes the connection, and the close fails what is in flight.
      return null;
    }
    if (typeof id !== "number") return `a ${String(frame.type)} frame without an id`;
    const request = this.inFlight.get(id);
    if (request === undefined) return `an answer to request ${id}, which is not in flight`;
    if (frame.type === "output") {
      if (request.type !== "execute") return `an output frame for a ${request.type} request`;
      request.handler?.output?.(frame);
      return null;
    }
    this.inFlight.delete(id);
    const handler = request.handler;
    if (frame.type === "error") {
      let error: Error;
      try {
        error = errorFromFrame(frame);
      } catch (parseError) {
        error = parseError as Error;
      }
      handler?.reject(error);
    } else if (frame.type === RESPONSE_TYPE[request.type]) {
      handler?.resolve(frame);
    } else {
      handler?.reject(
        new RuntimeProtocolError(
          `the daemon answered a ${request.type} request with a ${String(frame.type)} frame`,
        ),
      );
    }
    this.onAnswer();
    return null;
  }

  private shutDown(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.socket.destroy();
    const lost = [...this.inFlight.values()];
    this.inFlight.clear();
    const waiting = lost.filter((r) => r.handler !== null).length;
    for (const request of lost) {
      request.handler?.reject(
        new RuntimeConnectionLostError(
          `lost the connection to sandfork-vmm with ${waiting} request(s) in flight (${reason}); retry`,
        ),
      );
    }
    this.onClose(reason);
  }
}
