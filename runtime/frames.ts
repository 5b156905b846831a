// The daemon protocol's framing (native-vmm/PROTOCOL.md, "Framing"): a u32 big-endian length,
// then that many bytes holding one UTF-8 JSON object, at most 16 MiB, in both directions.
// The decoder is fed socket chunks as they arrive and returns whole frames; it checks the length
// against the cap before buffering a payload, so a broken peer cannot make it allocate without
// bound.

/** The largest payload, in either direction (16 MiB). */
export const MAX_FRAME_BYTES = 16 * 1024 * 1024;
const HEADER_BYTES = 4;

export type FrameErrorKind = "oversized" | "not_utf8" | "not_json" | "not_object";

/** A frame that cannot be encoded or decoded. */
export class FrameError extends Error {
  readonly kind: FrameErrorKind;

  constructor(kind: FrameErrorKind, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "FrameError";
    this.kind = kind;
  }
}

export type FrameObject = Record<string, unknown>;

/** One frame holding `message`; throws FrameError("oversized") beyond MAX_FRAME_BYTES. */
export function encodeFrame(message: FrameObject): Buffer {
  const payload = Buffer.from(JSON.stringify(message), "utf8");
  if (payload.length > MAX_FRAME_BYTES) {
    throw new FrameError(
      "oversized",
      `the message is ${payload.length} bytes; a frame holds at most ${MAX_FRAME_BYTES}`,
    );
  }
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  frame.writeUInt32BE(payload.length, 0);
  payload.copy(frame, HEADER_BYTES);
  return frame;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

function decodePayload(payload: Buffer): FrameObject {
  let text: string;
  try {
    text = utf8.decode(payload);
  } catch (error) {
    throw new FrameError("not_utf8", "the frame payload is not UTF-8", { cause: error });
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new FrameError("not_json", `the frame payload is not JSON: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new FrameError("not_object", "the frame payload is not a JSON object");
  }
  return value as FrameObject;
}

/**
 * Reassembles frames from a byte stream. After an "oversized" error the frame boundary is lost
 * and the decoder must not be used again; after the other errors the bad frame was consumed
 * whole and decoding may go on.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;

  /** Bytes received but not yet part of a returned frame. */
  get pendingBytes(): number {
    return this.buffered;
  }

  /** Adds bytes received from the peer. */
  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.buffered += chunk.length;
  }

  /** The next whole frame, or undefined until more bytes arrive. Throws FrameError for a bad frame. */
  next(): FrameObject | undefined {
    if (this.buffered < HEADER_BYTES) return undefined;
    const length = this.peekLength();
    if (length > MAX_FRAME_BYTES) {
      throw new FrameError(
        "oversized",
        `frame length ${length} exceeds the limit of ${MAX_FRAME_BYTES} bytes`,
      );
    }
    if (this.buffered < HEADER_BYTES + length) return undefined;
    return decodePayload(this.take(HEADER_BYTES + length).subarray(HEADER_BYTES));
  }

  private peekLength(): number {
    const first = this.chunks[0];
    if (first !== undefined && first.length >= HEADER_BYTES) return first.readUInt32BE(0);
    return this.take(HEADER_BYTES, false).readUInt32BE(0);
  }

  /** The first `n` buffered bytes; removed from the buffer unless `consume` is false. */
  private take(n: number, consume = true): Buffer {
    const joined =
      this.chunks.length === 1
        ? (this.chunks[0] as Buffer)
        : Buffer.concat(this.chunks, this.buffered);
    const taken = joined.subarray(0, n);
    if (consume) {
      const rest = joined.subarray(n);
      this.chunks = rest.length > 0 ? [rest] : [];
      this.buffered = rest.length;
    } else {
      this.chunks = [joined];
    }
    return taken;
  }
}
