// API key format: "sfk_" + 32 base62 characters of randomness (~190 bits) + 6 base62 characters of
// checksum (the first 32 bits of SHA-256 over prefix and body). The checksum lets the gateway turn
// away typos and truncated keys without a database lookup; secret scanners can match the shape.
// Keys are stored only as SHA-256 hex; listings show a hint made of the prefix and the last four
// characters (checksum characters, which carry no bits of the random body).
import { createHash, randomInt } from "node:crypto";

export const API_KEY_PREFIX = "sfk_";
const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const BODY_LENGTH = 32;
const CHECKSUM_LENGTH = 6; // 62^6 > 2^32
export const API_KEY_LENGTH = API_KEY_PREFIX.length + BODY_LENGTH + CHECKSUM_LENGTH;
const API_KEY_SHAPE = new RegExp(
  `^${API_KEY_PREFIX}[0-9A-Za-z]{${BODY_LENGTH + CHECKSUM_LENGTH}}$`,
);

export interface MintedApiKey {
  /** The secret, shown to its owner once. */
  key: string;
  hash: string;
  hint: string;
}

function checksum(prefixAndBody: string): string {
  let value = createHash("sha256").update(prefixAndBody).digest().readUInt32BE(0);
  let encoded = "";
  for (let i = 0; i < CHECKSUM_LENGTH; i++) {
    encoded = BASE62[value % 62] + encoded;
    value = Math.floor(value / 62);
  }
  return encoded;
}

export function hashApiKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

function apiKeyHint(key: string): string {
  return `${API_KEY_PREFIX}…${key.slice(-4)}`;
}

/** The key with this 32-character base62 body: prefix, body, checksum. */
export function apiKeyWithBody(body: string): string {
  return API_KEY_PREFIX + body + checksum(API_KEY_PREFIX + body);
}

export function mintApiKey(): MintedApiKey {
  let body = "";
  // randomInt draws without modulo bias from the CSPRNG.
  for (let i = 0; i < BODY_LENGTH; i++) body += BASE62[randomInt(62)];
  const key = apiKeyWithBody(body);
  return { key, hash: hashApiKey(key), hint: apiKeyHint(key) };
}

export function looksLikeApiKey(credential: string): boolean {
  return credential.startsWith(API_KEY_PREFIX);
}

/** Shape and checksum only; whether the key exists is the store's question. */
export function hasValidChecksum(key: string): boolean {
  if (!API_KEY_SHAPE.test(key)) return false;
  const split = key.length - CHECKSUM_LENGTH;
  return checksum(key.slice(0, split)) === key.slice(split);
}
