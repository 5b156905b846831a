import { describe, expect, it } from "vitest";
import {
  API_KEY_LENGTH,
  API_KEY_PREFIX,
  hashApiKey,
  hasValidChecksum,
  mintApiKey,
} from "./api-key.js";

describe("API key format", () => {
  it("is the prefix, 32 random base62 characters and a 6-character checksum", () => {
    const { key, hash, hint } = mintApiKey();
    expect(key).toMatch(/^sfk_[0-9A-Za-z]{38}$/);
    expect(key).toHaveLength(API_KEY_LENGTH);
    expect(hasValidChecksum(key)).toBe(true);
    expect(hash).toBe(hashApiKey(key));
    expect(hash).toMatch(/^[0-9a-f]{64}$/);
    expect(hint).toBe(`${API_KEY_PREFIX}…${key.slice(-4)}`);
    expect(hint).not.toContain(key.slice(4, 36));
  });

  it("has at least 128 bits of randomness: no repeats and every base62 character in use", () => {
    const bodies = Array.from({ length: 2000 }, () => mintApiKey().key.slice(4, 36));
    expect(new Set(bodies).size).toBe(bodies.length);
    expect(new Set(bodies.join("")).size).toBe(62);
    expect(32 * Math.log2(62)).toBeGreaterThan(128);
  });

  it("rejects a key with one character changed, a truncated key and a foreign shape", () => {
    const { key } = mintApiKey();
    const i = 10;
    const flipped = key.slice(0, i) + (key[i] === "a" ? "b" : "a") + key.slice(i + 1);
    expect(hasValidChecksum(flipped)).toBe(false);
    expect(hasValidChecksum(key.slice(0, -1))).toBe(false);
    expect(hasValidChecksum(`${key}x`)).toBe(false);
    expect(hasValidChecksum(key.replace("sfk_", "sfx_"))).toBe(false);
    expect(hasValidChecksum(`${key.slice(0, -6)}${"0".repeat(6)}`)).toBe(false);
  });
});
