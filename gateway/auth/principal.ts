// Who is calling: an API key, or a token minted from one (which carries its key's identity and
// limits, so it is verified without the database).
import type { KeyLimits, NetworkPolicy, Scope } from "../../db/keys.js";
import { ProblemError } from "../problems.js";

export interface TokenGrant {
  /** The token's jti. */
  id: string;
  /** Null: every template. */
  templates: string[] | null;
  /** Null: no limit. */
  maxExecutions: number | null;
  expiresAt: Date;
}

export interface Principal {
  keyId: string;
  accountId: string;
  scopes: Scope[];
  limits: KeyLimits;
  /**
   * What its executions may reach: the key's network policy, then a token's narrowing of it
   * (each narrows the ones before); empty: the key has none, so no network.
   */
  network: NetworkPolicy[];
  /** When the credential stops working; null: never. */
  expiresAt: Date | null;
  /** Null when the caller presented the API key itself. */
  token: TokenGrant | null;
}

export function hasScope(principal: Principal, scope: Scope): boolean {
  return principal.scopes.includes("admin") || principal.scopes.includes(scope);
}

export function requireScope(principal: Principal, scope: Scope): void {
  if (!hasScope(principal, scope))
    throw new ProblemError("insufficient-scope", `this operation needs the "${scope}" scope`);
}
