// The load tests' HTTP/1.1 client: keep-alive connections over plain sockets, one request at a
// time on each, the request written in one piece and the answer read by its content-length (or
// its chunks). It stands in for k6's client (the k6 binary does not install here) and is as lean
// as the runtime client the "daemon alone" baseline uses, so that an HTTP p50 compared with the
// daemon's does not carry the client's own weight: Node's http client held the plain Hono
// baseline to a third of what the server answers (README, Performance).
import { connect, type Socket } from "node:net";

export type Call = (
  method: "GET" | "POST",
  url: string,
  headers?: Record<string, string>,
  body?: string,
) => Promise<Answer>;

interface Answer {
  status: number;
  body: string;
  /** The Retry-After header, where the answer has one. */
  retryAfter?: string;
}

/** The request on a connection, waiting for its answer. */
interface Reading {
  resolve(answer: Answer): void;
  reject(error: Error): void;
}

const HEAD_END = Buffer.from("\r\n\r\n");
const CRLF = Buffer.from("\r\n");

/**
 * The answer at the start of `data`, and how many bytes it took; undefined while it is not all
 * there. `ended`: the peer closed, which ends a body that has neither a length nor chunks.
 */
export function parseAnswer(
  data: Buffer,
  ended = false,
): { answer: Answer; length: number; close: boolean } | undefined {
  const headEnd = data.indexOf(HEAD_END);
  if (headEnd < 0) return undefined;
  const [statusLine = "", ...lines] = data.subarray(0, headEnd).toString("latin1").split("\r\n");
  const status = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1];
  if (status === undefined)
    throw new Error(`not an HTTP/1.1 answer: ${JSON.stringify(statusLine)}`);
  const headers = new Map<string, string>();
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon > 0)
      headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
  }
  const close = headers.get("connection")?.toLowerCase() === "close";
  const start = headEnd + HEAD_END.length;
  const retryAfter = headers.get("retry-after");
  const answer = (body: Buffer, length: number) => ({
    answer: {
      status: Number(status),
      body: body.toString("utf8"),
      ...(retryAfter === undefined ? {} : { retryAfter }),
    },
    length,
    close,
  });
  // These have no body, whatever their headers say (RFC 9112, 6.3).
  if (status === "204" || status === "304") return answer(Buffer.alloc(0), start);
  const declared = headers.get("content-length");
  if (declared !== undefined) {
    const size = Number(declared);
    if (!Number.isSafeInteger(size) || size < 0) throw new Error(`a content-length of ${declared}`);
    return data.length < start + size
      ? undefined
      : answer(data.subarray(start, start + size), start + size);
  }
  if (headers.get("transfer-encoding")?.toLowerCase().includes("chunked")) {
    const chunks: Buffer[] = [];
    let at = start;
    for (;;) {
      const lineEnd = data.indexOf(CRLF, at);
      if (lineEnd < 0) return undefined;
      const size = Number.parseInt(data.subarray(at, lineEnd).toString("latin1"), 16);
      if (!Number.isSafeInteger(size) || size < 0) throw new Error("a malformed chunk size");
      const next = lineEnd + CRLF.length + size + CRLF.length;
      if (data.length < next) return undefined;
      if (size === 0) return answer(Buffer.concat(chunks), next);
      chunks.push(data.subarray(lineEnd + CRLF.length, lineEnd + CRLF.length + size));
      at = next;
    }
  }
  // Neither: the body runs to the end of the connection.
  return ended ? { ...answer(data.subarray(start), data.length), close: true } : undefined;
}

/** One keep-alive connection, serving one request at a time. */
class Connection {
  private readonly socket: Socket;
  private received: Buffer = Buffer.alloc(0);
  private reading: Reading | undefined;
  closed = false;

  constructor(
    host: string,
    port: number,
    private readonly onClosed: (connection: Connection) => void,
  ) {
    this.socket = connect({ host, port, noDelay: true });
    this.socket.on("data", (chunk: Buffer) => {
      this.received = this.received.length === 0 ? chunk : Buffer.concat([this.received, chunk]);
      this.read(false);
    });
    this.socket.on("end", () => this.read(true));
    this.socket.on("error", (error) => this.fail(error));
    this.socket.on("close", () => {
      this.fail(new Error("the connection closed before the answer was whole"));
      this.markClosed();
    });
  }

  send(request: string): Promise<Answer> {
    return new Promise((resolve, reject) => {
      this.reading = { resolve, reject };
      this.socket.write(request);
    });
  }

  /** Closed from this side: at once out of its pool, though its "close" comes later. */
  destroy(): void {
    this.markClosed();
    this.socket.destroy();
  }

  private markClosed(): void {
    if (this.closed) return;
    this.closed = true;
    this.onClosed(this);
  }

  private read(ended: boolean): void {
    const reading = this.reading;
    if (reading === undefined) {
      // Bytes nobody asked for would be read as the next request's answer.
      if (this.received.length > 0) this.destroy();
      return;
    }
    let parsed: ReturnType<typeof parseAnswer>;
    try {
      parsed = parseAnswer(this.received, ended);
    } catch (error) {
      this.fail(error as Error);
      this.destroy();
      return;
    }
    if (parsed === undefined) return;
    this.received = this.received.subarray(parsed.length);
    this.reading = undefined;
    // One request at a time: bytes past the answer are nobody's.
    if (parsed.close || this.received.length > 0) this.destroy();
    reading.resolve(parsed.answer);
  }

  private fail(error: Error): void {
    const reading = this.reading;
    this.reading = undefined;
    reading?.reject(error);
  }
}

interface Pool {
  host: string;
  port: number;
  idle: Connection[];
  open: Set<Connection>;
  waiting: ((connection: Connection) => void)[];
}

/** A client keeping up to `maxSockets` connections open to each host; `destroy` closes them. */
export function keepAliveClient(maxSockets: number): { call: Call; destroy(): void } {
  const pools = new Map<string, Pool>();

  const open = (pool: Pool) => {
    const connection = new Connection(pool.host, pool.port, (closed) => {
      pool.open.delete(closed);
      pool.idle = pool.idle.filter((c) => c !== closed);
    });
    pool.open.add(connection);
    return connection;
  };
  const acquire = (pool: Pool): Connection | Promise<Connection> => {
    let connection = pool.idle.pop();
    while (connection?.closed) connection = pool.idle.pop();
    if (connection !== undefined) return connection;
    if (pool.open.size < maxSockets) return open(pool);
    return new Promise((resolve) => pool.waiting.push(resolve));
  };
  // Handed on to a waiting request (a new one in place of a closed one), or kept for the next.
  const release = (pool: Pool, connection: Connection) => {
    const next = pool.waiting.shift();
    if (next !== undefined) next(connection.closed ? open(pool) : connection);
    else if (!connection.closed) pool.idle.push(connection);
  };

  // Where each URL goes, parsed once: the load tests send the same few again and again.
  const targets = new Map<string, { pool: Pool; requestLine: string }>();
  const targetOf = (url: string) => {
    let target = targets.get(url);
    if (target === undefined) {
      const parsed = new URL(url);
      if (parsed.protocol !== "http:")
        throw new Error(`the load-test client speaks plain http, not ${parsed.protocol}`);
      let pool = pools.get(parsed.host);
      if (pool === undefined) {
        pool = {
          host: parsed.hostname,
          port: Number(parsed.port || 80),
          idle: [],
          open: new Set(),
          waiting: [],
        };
        pools.set(parsed.host, pool);
      }
      target = {
        pool,
        requestLine: ` ${parsed.pathname}${parsed.search} HTTP/1.1\r\nhost: ${parsed.host}\r\n`,
      };
      targets.set(url, target);
    }
    return target;
  };

  const call: Call = async (method, url, headers = {}, body) => {
    const { pool, requestLine } = targetOf(url);
    const connection = await acquire(pool);
    let head = method + requestLine;
    for (const name in headers) head += `${name}: ${headers[name]}\r\n`;
    if (body !== undefined) head += `content-length: ${Buffer.byteLength(body)}\r\n`;
    try {
      return await connection.send(`${head}\r\n${body ?? ""}`);
    } finally {
      release(pool, connection);
    }
  };

  return {
    call,
    destroy: () => {
      for (const pool of pools.values()) for (const connection of pool.open) connection.destroy();
      pools.clear();
      targets.clear();
    },
  };
}
