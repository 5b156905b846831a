// Issuing API keys: shared by POST /v1/keys, the first-start bootstrap and `npm run keys:create`.
import type { Database } from "../db/client.js";
import {
  accountExists,
  createAccount,
  grantCredits,
  insertKey,
  type KeyLimits,
  type NetworkPolicy,
  type Scope,
  type StoredKey,
} from "../db/keys.js";
import { mintApiKey } from "./auth/api-key.js";
import { ProblemError } from "./problems.js";

export interface IssueKeyOptions {
  name: string;
  scopes: Scope[];
  /** Existing account; undefined: a new account named after the key. */
  accountId?: string | undefined;
  credits?: number | undefined;
  expiresAt?: Date | null | undefined;
  limits: KeyLimits;
  /** Absent: the key's executions reach no network. */
  network?: NetworkPolicy | null | undefined;
}

export interface IssuedKey {
  key: string;
  stored: StoredKey;
}

/** Account, grant and key in one transaction: a failure leaves nothing behind. */
export async function issueKey(db: Database, options: IssueKeyOptions): Promise<IssuedKey> {
  const minted = mintApiKey();
  const stored = await db.transaction(async (transaction) => {
    const tx = transaction as unknown as Database;
    let accountId = options.accountId;
    if (accountId === undefined) accountId = await createAccount(tx, options.name);
    else if (!(await accountExists(tx, accountId)))
      throw new ProblemError("not-found", `no account ${accountId}`);
    if (options.credits !== undefined) await grantCredits(tx, accountId, options.credits);
    return insertKey(tx, {
      accountId,
      name: options.name,
      hash: minted.hash,
      hint: minted.hint,
      scopes: [...new Set(options.scopes)],
      expiresAt: options.expiresAt ?? null,
      limits: options.limits,
      network: options.network ?? null,
    });
  });
  return { key: minted.key, stored };
}
