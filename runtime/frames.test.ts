// The frame codec on in-memory buffers (the daemon tests exercise it on a real socket).
import { describe, expect, it } from "vitest";
import { encodeFrame, FrameDecoder, FrameError, MAX_FRAME_BYTES } from "./frames.js";

function rawFrame(payload: Buffer | string): Buffer {
  const bytes = typeof payload === "string" ? Buffer.from(payload, "utf8") : payload;
  const header = Buffer.alloc(4);
  header.writeUInt32BE(bytes.length, 0);
  return Buffer.concat([header, bytes]);
}

function drain(decoder: FrameDecoder): unknown[] {
  const frames: unknown[] = [];
  for (let frame = decoder.next(); frame !== undefined; frame = decoder.next()) frames.push(frame);
  return frames;
}

function frameError(fn: () => unknown): FrameError {
  try {
    fn();
  } catch (error) {
    if (error instanceof FrameError) return error;
    throw error;
  }
  throw new Error("expected a FrameError");
}

describe("frames", () => {
  it("encodes a big-endian length followed by the UTF-8 JSON payload", () => {
    const frame = encodeFrame({ type: "hello", protocol: 1, note: "é" });
    const payload = '{"type":"hello","protocol":1,"note":"é"}';
    expect(frame.readUInt32BE(0)).toBe(Buffer.byteLength(payload));
    expect(frame.subarray(4).toString("utf8")).toBe(payload);
  });

  it("reassembles frames split at every byte and several frames in one chunk", () => {
    const messages = [{ id: 1, type: "health" }, { id: 2, type: "stats", text: "ünïcode ✓" }, {}];
    const stream = Buffer.concat(messages.map((m) => encodeFrame(m)));

    const byteByByte = new FrameDecoder();
    const decoded: unknown[] = [];
    for (let i = 0; i < stream.length; i++) {
      byteByByte.push(stream.subarray(i, i + 1));
      decoded.push(...drain(byteByByte));
    }
    expect(decoded).toEqual(messages);
    expect(byteByByte.pendingBytes).toBe(0);

    const allAtOnce = new FrameDecoder();
    allAtOnce.push(stream);
    expect(drain(allAtOnce)).toEqual(messages);
  });

  it("waits for the rest of a partial frame", () => {
    const decoder = new FrameDecoder();
    const frame = encodeFrame({ id: 7, type: "execution" });
    decoder.push(frame.subarray(0, 6));
    expect(decoder.next()).toBeUndefined();
    expect(decoder.pendingBytes).toBe(6);
    decoder.push(frame.subarray(6));
    expect(decoder.next()).toEqual({ id: 7, type: "execution" });
  });

  it("refuses a length over 16 MiB before buffering the payload", () => {
    const decoder = new FrameDecoder();
    const header = Buffer.alloc(4);
    header.writeUInt32BE(MAX_FRAME_BYTES + 1, 0);
    decoder.push(header);
    const error = frameError(() => decoder.next());
    expect(error.kind).toBe("oversized");
    expect(error.message).toContain(String(MAX_FRAME_BYTES + 1));
  });

  it("accepts a payload of exactly 16 MiB", () => {
    const filler = "x".repeat(MAX_FRAME_BYTES - '{"s":""}'.length);
    const frame = encodeFrame({ s: filler });
    expect(frame.length).toBe(4 + MAX_FRAME_BYTES);
    const decoder = new FrameDecoder();
    decoder.push(frame);
    expect((decoder.next() as { s: string }).s.length).toBe(filler.length);
  });

  it("refuses to encode a message larger than a frame", () => {
    const error = frameError(() => encodeFrame({ s: "x".repeat(MAX_FRAME_BYTES) }));
    expect(error.kind).toBe("oversized");
  });

  it("types each malformed payload and goes on with the next frame", () => {
    const decoder = new FrameDecoder();
    decoder.push(
      Buffer.concat([
        rawFrame(Buffer.from([0x7b, 0xff, 0x7d])),
        rawFrame("{not json"),
        rawFrame("[1,2]"),
        rawFrame("null"),
        encodeFrame({ ok: true }),
      ]),
    );
    expect(frameError(() => decoder.next()).kind).toBe("not_utf8");
    expect(frameError(() => decoder.next()).kind).toBe("not_json");
    expect(frameError(() => decoder.next()).kind).toBe("not_object");
    expect(frameError(() => decoder.next()).kind).toBe("not_object");
    expect(decoder.next()).toEqual({ ok: true });
  });
});
