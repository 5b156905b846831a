// Short-lived JWTs (EdDSA / Ed25519) that a key holder mints for an untrusted client or agent.
// Everything the gateway needs to serve the token is inside it: key and account ids, the key's
// limits and network policy (with the token's narrowing of it), allowed templates and an
// execution cap. Verification is a signature check, no database.
import {
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
  randomUUID,
} from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { errors, type JWTPayload, jwtVerify, SignJWT } from "jose";
import {
  type KeyLimits,
  type NetworkPolicy,
  readNetworkPolicy,
  SCOPES,
  type Scope,
} from "../../db/keys.js";
import { ProblemError } from "../problems.js";
import type { Principal } from "./principal.js";

const ALGORITHM = "EdDSA";
const SIGNING_KEY_FILE = "token-signing-key.pem";

export interface TokenRequest {
  ttlSeconds: number;
  templates: string[] | null;
  maxExecutions: number | null;
  /** Absent: execute only. */
  scopes?: Scope[];
  /** Narrows the key's network policy for the token's calls; absent: the key's as it is. */
  network?: NetworkPolicy | undefined;
}

export interface MintedToken {
  token: string;
  id: string;
  expiresAt: Date;
}

interface TokenClaims {
  acc: string;
  lim: { rpm: number; conc: number; body: number };
  tpl?: string[];
  mex?: number;
  /** Scopes beyond execute-only; absent on an execute-only token. */
  scp?: Scope[];
  /** The key's network policy, then the token's narrowing (allow, max connections, max bytes); absent: none. */
  net?: NetworkClaim[];
}

interface NetworkClaim {
  a: string[];
  c?: number;
  b?: number;
}

const networkClaim = (p: NetworkPolicy): NetworkClaim => ({
  a: p.allow,
  ...(p.maxConnections === undefined ? {} : { c: p.maxConnections }),
  ...(p.maxBytes === undefined ? {} : { b: p.maxBytes }),
});

/** The policies of a `net` claim, or undefined when it is malformed. */
function readNetworkClaim(net: unknown): NetworkPolicy[] | undefined {
  if (net === undefined) return [];
  if (!Array.isArray(net)) return undefined;
  const policies = net.map((claim: unknown) => {
    if (typeof claim !== "object" || claim === null) return null;
    const { a, c, b } = claim as Record<string, unknown>;
    return readNetworkPolicy({ allow: a, maxConnections: c, maxBytes: b });
  });
  return policies.every((p): p is NetworkPolicy => p !== null) ? policies : undefined;
}

/** The PEM from config, or the one kept in dataDir, created there (mode 0600) on first use. */
export function loadSigningKey(pem: string | undefined, dataDir: string): KeyObject {
  if (pem !== undefined) return createPrivateKey(pem);
  const path = join(dataDir, SIGNING_KEY_FILE);
  if (!existsSync(path)) {
    mkdirSync(dataDir, { recursive: true });
    const { privateKey } = generateKeyPairSync("ed25519");
    writeFileSync(path, privateKey.export({ type: "pkcs8", format: "pem" }), {
      mode: 0o600,
      flag: "wx",
    });
  }
  return createPrivateKey(readFileSync(path));
}

const positiveInt = (n: unknown): n is number =>
  typeof n === "number" && Number.isSafeInteger(n) && n > 0;

export class TokenService {
  private readonly publicKey: KeyObject;

  constructor(
    private readonly privateKey: KeyObject,
    private readonly issuer: string,
    private readonly audience: string,
  ) {
    if (privateKey.asymmetricKeyType !== "ed25519")
      throw new Error("the token signing key must be Ed25519");
    this.publicKey = createPublicKey(privateKey);
  }

  /** A token for `principal`'s key; it never outlives the key itself. */
  async mint(principal: Principal, request: TokenRequest, now = new Date()): Promise<MintedToken> {
    const requested = new Date(now.getTime() + request.ttlSeconds * 1000);
    const expiresAt =
      principal.expiresAt !== null && principal.expiresAt < requested
        ? principal.expiresAt
        : requested;
    const id = randomUUID();
    const network =
      request.network === undefined ? principal.network : [...principal.network, request.network];
    const claims: TokenClaims = {
      acc: principal.accountId,
      lim: {
        rpm: principal.limits.rateLimitPerMinute,
        conc: principal.limits.maxConcurrency,
        body: principal.limits.maxBodyBytes,
      },
      ...(request.templates === null ? {} : { tpl: request.templates }),
      ...(request.maxExecutions === null ? {} : { mex: request.maxExecutions }),
      ...(request.scopes === undefined ||
      (request.scopes.length === 1 && request.scopes[0] === "execute")
        ? {}
        : { scp: request.scopes }),
      ...(network.length === 0 ? {} : { net: network.map(networkClaim) }),
    };
    const token = await new SignJWT({ ...claims })
      .setProtectedHeader({ alg: ALGORITHM, typ: "JWT" })
      .setIssuer(this.issuer)
      .setAudience(this.audience)
      .setSubject(principal.keyId)
      .setJti(id)
      .setIssuedAt(Math.floor(now.getTime() / 1000))
      .setExpirationTime(Math.floor(expiresAt.getTime() / 1000))
      .sign(this.privateKey);
    return { token, id, expiresAt: new Date(Math.floor(expiresAt.getTime() / 1000) * 1000) };
  }

  async verify(token: string): Promise<Principal> {
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, this.publicKey, {
        issuer: this.issuer,
        audience: this.audience,
        algorithms: [ALGORITHM],
        requiredClaims: ["sub", "jti", "exp"],
      }));
    } catch (error) {
      if (error instanceof errors.JWTExpired)
        throw new ProblemError("credentials-expired", "the token has expired");
      throw new ProblemError("invalid-credentials", "the token is not valid for this gateway");
    }
    const { sub, jti, exp, acc, lim, tpl, mex, scp, net } = payload as Record<string, unknown>;
    const network = readNetworkClaim(net);
    const limits = lim as Record<string, unknown> | undefined;
    const wellFormed =
      typeof sub === "string" &&
      typeof jti === "string" &&
      typeof exp === "number" &&
      typeof acc === "string" &&
      typeof limits === "object" &&
      limits !== null &&
      positiveInt(limits.rpm) &&
      positiveInt(limits.conc) &&
      positiveInt(limits.body) &&
      (tpl === undefined || (Array.isArray(tpl) && tpl.every((t) => typeof t === "string"))) &&
      (mex === undefined || positiveInt(mex)) &&
      (scp === undefined ||
        (Array.isArray(scp) &&
          scp.length > 0 &&
          scp.every((s) => (SCOPES as readonly unknown[]).includes(s)))) &&
      network !== undefined;
    if (!wellFormed || network === undefined)
      throw new ProblemError("invalid-credentials", "the token's claims are malformed");
    const keyLimits: KeyLimits = {
      rateLimitPerMinute: limits.rpm as number,
      maxConcurrency: limits.conc as number,
      maxBodyBytes: limits.body as number,
    };
    return {
      keyId: sub,
      accountId: acc,
      scopes: (scp as Scope[] | undefined) ?? ["execute"],
      limits: keyLimits,
      network,
      expiresAt: new Date(exp * 1000),
      token: {
        id: jti,
        templates: (tpl as string[] | undefined) ?? null,
        maxExecutions: (mex as number | undefined) ?? null,
        expiresAt: new Date(exp * 1000),
      },
    };
  }
}
