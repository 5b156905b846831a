// Test support: an account with credits and one execute-scoped key on it.
import { randomUUID } from "node:crypto";
import type { Database } from "../client.js";
import { createAccount, grantCredits, insertKey } from "../keys.js";

const limits = { rateLimitPerMinute: 60, maxConcurrency: 4, maxBodyBytes: 1024 };

export async function accountWithKey(
  db: Database,
  credits: number,
): Promise<{ accountId: string; keyId: string }> {
  const accountId = await createAccount(db, "test");
  if (credits > 0) await grantCredits(db, accountId, credits);
  const key = await insertKey(db, {
    accountId,
    name: "k",
    hash: randomUUID(),
    hint: "sfk_…test",
    scopes: ["execute"],
    expiresAt: null,
    limits,
    network: null,
  });
  return { accountId, keyId: key.id };
}
