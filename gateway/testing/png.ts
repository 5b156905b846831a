// Test support: a PNG decoder for 8-bit RGB and RGBA images (what matplotlib's Agg writes), on
// node:zlib, so that a test can check a chart's size and the colour of a pixel it drew.
import { inflateSync } from "node:zlib";

export interface DecodedPng {
  width: number;
  height: number;
  /** [r, g, b, a] of the pixel at column x, row y (a is 255 for RGB). */
  pixel(x: number, y: number): [number, number, number, number];
}

const SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const CHANNELS: Record<number, number> = { 2: 3, 6: 4 };

function paeth(a: number, b: number, c: number): number {
  const p = a + b - c;
  const pa = Math.abs(p - a);
  const pb = Math.abs(p - b);
  const pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/** Decodes `png`; throws on anything but a non-interlaced 8-bit RGB or RGBA image. */
export function decodePng(png: Buffer): DecodedPng {
  if (!png.subarray(0, 8).equals(SIGNATURE)) throw new Error("not a PNG signature");
  let at = 8;
  let header: Buffer | undefined;
  const data: Buffer[] = [];
  while (at + 8 <= png.length) {
    const length = png.readUInt32BE(at);
    const type = png.toString("latin1", at + 4, at + 8);
    const body = png.subarray(at + 8, at + 8 + length);
    if (type === "IHDR") header = body;
    else if (type === "IDAT") data.push(body);
    else if (type === "IEND") break;
    at += 12 + length;
  }
  if (header === undefined) throw new Error("no IHDR chunk");
  const width = header.readUInt32BE(0);
  const height = header.readUInt32BE(4);
  const [depth, colour, , , interlace] = header.subarray(8, 13);
  const channels = CHANNELS[colour as number];
  if (depth !== 8 || channels === undefined || interlace !== 0)
    throw new Error(
      `unsupported PNG: depth ${depth}, colour type ${colour}, interlace ${interlace}`,
    );
  const raw = inflateSync(Buffer.concat(data));
  const stride = width * channels;
  if (raw.length !== height * (stride + 1)) throw new Error("image data of the wrong length");
  const pixels = Buffer.alloc(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    for (let i = 0; i < stride; i++) {
      const x = raw[y * (stride + 1) + 1 + i] as number;
      const left = i >= channels ? (pixels[y * stride + i - channels] as number) : 0;
      const up = y > 0 ? (pixels[(y - 1) * stride + i] as number) : 0;
      const upLeft =
        y > 0 && i >= channels ? (pixels[(y - 1) * stride + i - channels] as number) : 0;
      const predicted = [0, left, up, (left + up) >> 1, paeth(left, up, upLeft)][filter as number];
      if (predicted === undefined) throw new Error(`unknown filter ${filter} in row ${y}`);
      pixels[y * stride + i] = (x + predicted) & 0xff;
    }
  }
  return {
    width,
    height,
    pixel(x, y) {
      const o = y * stride + x * channels;
      return [
        pixels[o] as number,
        pixels[o + 1] as number,
        pixels[o + 2] as number,
        channels === 4 ? (pixels[o + 3] as number) : 255,
      ];
    },
  };
}
