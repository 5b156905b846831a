import { createHash } from "node:crypto";
import { eq } from "drizzle-orm";
import { SignJWT } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { apiKeys } from "../db/schema.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "../db/testing/fresh-database.js";
import { mintApiKey } from "./auth/api-key.js";
import {
  expectProblem,
  newTokenService,
  startTestGateway,
  TEST_AUDIENCE,
  type TestGateway,
} from "./testing/test-gateway.js";

describe.each(BACKENDS)("authentication on %s", (backend) => {
  let fresh: FreshDatabase;
  let gw: TestGateway;
  let clock = Date.now();
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
    gw = await startTestGateway(backend, {
      fresh,
      config: { keyCacheTtlMs: 1_000 },
      now: () => clock,
    });
  });
  afterAll(async () => {
    await gw?.dispose();
    await fresh?.dispose();
  });

  it("accepts a minted key, which is stored only as its SHA-256 with a non-secret hint", async () => {
    const { key, keyId } = await gw.issue();
    const ok = await gw.call("GET", "/v1/usage", { credential: key });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { key_id: string }).key_id).toBe(keyId);

    const [row] = await fresh.db.select().from(apiKeys).where(eq(apiKeys.id, keyId));
    expect(row?.keyHash).toBe(createHash("sha256").update(key).digest("hex"));
    expect(row?.hint).toBe(`sfk_…${key.slice(-4)}`);
    expect(JSON.stringify(row)).not.toContain(key.slice(4, 36));
  });

  it("401s without credentials, with a bad checksum and with an unknown but well-formed key", async () => {
    await expectProblem(await gw.call("GET", "/v1/usage"), 401, "unauthenticated");
    await expectProblem(
      await gw.call("GET", "/v1/usage", { headers: { authorization: "Basic abc" } }),
      401,
      "unauthenticated",
    );
    const { key } = await gw.issue();
    const typo = key.slice(0, 8) + (key[8] === "Z" ? "Y" : "Z") + key.slice(9);
    const problem = await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: typo }),
      401,
      "invalid-credentials",
    );
    expect(problem.detail).toMatch(/checksum/);
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: mintApiKey().key }),
      401,
      "invalid-credentials",
    );
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: "not-a-key" }),
      401,
      "invalid-credentials",
    );
  });

  it("revocation applies at once on the revoking gateway", async () => {
    const admin = await gw.issue({ scopes: ["admin"] });
    const { key, keyId } = await gw.issue();
    expect((await gw.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    const revoked = await gw.call("DELETE", `/v1/keys/${keyId}`, { credential: admin.key });
    expect(revoked.status).toBe(200);
    expect(((await revoked.json()) as { revoked_at: string | null }).revoked_at).not.toBeNull();
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: key }),
      401,
      "credentials-revoked",
    );
  });

  it("401s an expired key", async () => {
    const { key } = await gw.issue({ expiresAt: new Date(clock + 60_000) });
    expect((await gw.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    clock += 60_001;
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: key }),
      401,
      "credentials-expired",
    );
  });

  it("enforces scopes: execute, usage:read, admin (admin implies the others)", async () => {
    const executeOnly = await gw.issue({ scopes: ["execute"] });
    const usageOnly = await gw.issue({ scopes: ["usage:read"] });
    const admin = await gw.issue({ scopes: ["admin"] });
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: executeOnly.key }),
      403,
      "insufficient-scope",
    );
    await expectProblem(
      await gw.call("GET", "/v1/keys", { credential: executeOnly.key }),
      403,
      "insufficient-scope",
    );
    await expectProblem(
      await gw.call("POST", "/v1/tokens", { credential: usageOnly.key, body: {} }),
      403,
      "insufficient-scope",
    );
    expect((await gw.call("GET", "/v1/usage", { credential: usageOnly.key })).status).toBe(200);
    expect((await gw.call("GET", "/v1/keys", { credential: admin.key })).status).toBe(200);
    expect((await gw.call("GET", "/v1/usage", { credential: admin.key })).status).toBe(200);
    expect((await gw.call("POST", "/v1/tokens", { credential: admin.key, body: {} })).status).toBe(
      201,
    );
  });
});

describe("authentication on two gateways sharing PostgreSQL", () => {
  let fresh: FreshDatabase;
  let gw: TestGateway;
  let other: TestGateway;
  let clock = Date.now();
  beforeAll(async () => {
    fresh = await freshDatabase("postgres");
    const options = { fresh, config: { keyCacheTtlMs: 1_000 }, now: () => clock };
    gw = await startTestGateway("postgres", options);
    other = await startTestGateway("postgres", options);
  });
  afterAll(async () => {
    await other?.dispose();
    await gw?.dispose();
    await fresh?.dispose();
  });

  /** Revokes a key through `gw` that `other` has cached; answers the key. */
  async function revokedElsewhere(): Promise<string> {
    const admin = await gw.issue({ scopes: ["admin"] });
    const { key, keyId } = await gw.issue();
    expect((await other.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    expect((await gw.call("DELETE", `/v1/keys/${keyId}`, { credential: admin.key })).status).toBe(
      200,
    );
    return key;
  }

  it("a revocation reaches the other gateway within the cache TTL", async () => {
    const key = await revokedElsewhere();
    // The other gateway still trusts its cached lookup until the TTL passes, then it asks again.
    expect((await other.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    clock += 1_001;
    await expectProblem(
      await other.call("GET", "/v1/usage", { credential: key }),
      401,
      "credentials-revoked",
    );
  });

  it("a lookup in use is fetched again in the background half its TTL after it was, before it expires", async () => {
    const key = await revokedElsewhere();
    clock += 600;
    // Served from the cache, and fetched again half a TTL after the first lookup: a later call,
    // still within the first lookup's TTL, sees the revocation.
    expect((await other.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    const deadline = Date.now() + 10_000;
    let status = 200;
    while (status === 200 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      status = (await other.call("GET", "/v1/usage", { credential: key })).status;
    }
    expect(status).toBe(401);
  });
});

describe.each(BACKENDS)("tokens on %s", (backend) => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway(backend);
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  async function mint(key: string, body: Record<string, unknown> = {}) {
    const response = await gw.call("POST", "/v1/tokens", { credential: key, body });
    expect(response.status).toBe(201);
    return (await response.json()) as {
      token: string;
      token_id: string;
      expires_at: string;
      templates: string[] | null;
    };
  }

  it("a minted token authenticates as its key, execute-only, without reading the database", async () => {
    const { key } = await gw.issue({ scopes: ["execute", "usage:read"] });
    const minted = await mint(key, { ttl_seconds: 60, templates: ["python"], max_executions: 3 });
    expect(minted.templates).toEqual(["python"]);
    expect(Date.parse(minted.expires_at) - Date.now()).toBeLessThanOrEqual(60_000);
    const [header, payload] = minted.token
      .split(".")
      .slice(0, 2)
      .map((p) => JSON.parse(Buffer.from(p, "base64url").toString()));
    expect(header).toMatchObject({ alg: "EdDSA" });
    expect(payload).toMatchObject({ aud: TEST_AUDIENCE, tpl: ["python"], mex: 3 });

    // Signature verification alone: the principal comes out of the token.
    const principal = await gw.tokens.verify(minted.token);
    expect(principal.scopes).toEqual(["execute"]);
    expect(principal.token).toMatchObject({
      id: minted.token_id,
      templates: ["python"],
      maxExecutions: 3,
    });
    // Tokens are execute-only and cannot mint tokens.
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: minted.token }),
      403,
      "insufficient-scope",
    );
    await expectProblem(
      await gw.call("POST", "/v1/tokens", { credential: minted.token, body: {} }),
      403,
      "insufficient-scope",
    );
  });

  it("rejects a token for another audience", async () => {
    const { key } = await gw.issue();
    const foreignAudience = newTokenService("someone-else");
    const principal = await gw.tokens.verify((await mint(key)).token);
    const token = (
      await foreignAudience.mint(principal, {
        ttlSeconds: 60,
        templates: null,
        maxExecutions: null,
      })
    ).token;
    await expectProblem(
      await gw.call("GET", "/v1/templates", { credential: token }),
      401,
      "invalid-credentials",
    );
  });

  it("rejects a token signed by another key", async () => {
    const { key } = await gw.issue();
    const principal = await gw.tokens.verify((await mint(key)).token);
    const forger = newTokenService(TEST_AUDIENCE);
    const token = (
      await forger.mint(principal, { ttlSeconds: 60, templates: null, maxExecutions: null })
    ).token;
    await expectProblem(
      await gw.call("GET", "/v1/templates", { credential: token }),
      401,
      "invalid-credentials",
    );
  });

  it("rejects an expired token and one with another algorithm", async () => {
    const { key } = await gw.issue();
    const principal = await gw.tokens.verify((await mint(key)).token);
    const past = new Date(Date.now() - 120_000);
    const expired = (
      await gw.tokens.mint(
        principal,
        { ttlSeconds: 60, templates: null, maxExecutions: null },
        past,
      )
    ).token;
    await expectProblem(
      await gw.call("GET", "/v1/templates", { credential: expired }),
      401,
      "credentials-expired",
    );

    const hs256 = await new SignJWT({ acc: principal.accountId, lim: { rpm: 1, conc: 1, body: 1 } })
      .setProtectedHeader({ alg: "HS256" })
      .setAudience(TEST_AUDIENCE)
      .setIssuer("sandfork")
      .setSubject(principal.keyId)
      .setJti("x")
      .setExpirationTime("1m")
      .sign(new TextEncoder().encode("a shared secret that nobody should accept"));
    await expectProblem(
      await gw.call("GET", "/v1/templates", { credential: hs256 }),
      401,
      "invalid-credentials",
    );
  });

  it("never outlives its key", async () => {
    const { key } = await gw.issue({ expiresAt: new Date(Date.now() + 30_000) });
    const minted = await mint(key, { ttl_seconds: 3_600 });
    expect(Date.parse(minted.expires_at)).toBeLessThanOrEqual(Date.now() + 30_000);
  });
});
