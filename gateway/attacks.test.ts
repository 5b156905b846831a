// Attacks on the API that need no runtime: forged and stretched credentials, hostile bodies, and
// (on a real socket) oversized headers and slow clients. What these must never give: a 2xx, a
// 500, a hang, or an answer that depends on how much of a secret was guessed. The idempotency and
// concurrency attacks, which need executions, are in executions.test.ts.

import { createPublicKey, generateKeyPairSync, randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SignJWT, UnsecuredJWT } from "jose";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import * as keys from "../db/keys.js";
import { apiKeyWithBody, hashApiKey, mintApiKey } from "./auth/api-key.js";
import { TokenService } from "./auth/tokens.js";
import { type GatewayConfig, loadConfig } from "./config.js";
import { type RunningGateway, startGateway } from "./server.js";
import {
  expectProblem,
  startTestGateway,
  TEST_AUDIENCE,
  type TestGateway,
} from "./testing/test-gateway.js";

describe("credential attacks", () => {
  let gw: TestGateway;
  let key: string;
  let keyId: string;
  let accountId: string;
  // The gateway's own signing key, held here so that the tests can forge with it and its public half.
  const signing = generateKeyPairSync("ed25519").privateKey;
  beforeAll(async () => {
    gw = await startTestGateway("pglite", {
      tokens: new TokenService(signing, "sandfork", TEST_AUDIENCE),
    });
    ({ key, keyId, accountId } = await gw.issue());
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  /** The claims a real token of `keyId` carries, for forgeries. */
  function claims() {
    return { acc: accountId, lim: { rpm: 1000, conc: 10, body: 1 << 20 } };
  }

  async function forged(
    sign: (jwt: SignJWT) => Promise<string>,
    edit: (jwt: SignJWT) => SignJWT = (j) => j,
  ): Promise<string> {
    const jwt = new SignJWT(claims())
      .setIssuer("sandfork")
      .setAudience(TEST_AUDIENCE)
      .setSubject(keyId)
      .setJti(randomUUID())
      .setIssuedAt()
      .setExpirationTime("5m");
    return sign(edit(jwt));
  }

  async function refused(credential: string, slug = "invalid-credentials") {
    await expectProblem(await gw.call("GET", "/v1/templates", { credential }), 401, slug);
  }

  it("an API key reaches the database only as its SHA-256: a near miss and a stranger cost the same one lookup", async () => {
    const lookups = vi.spyOn(keys, "findKeyByHash");
    try {
      // Same prefix as the real key but for the last body character, with a valid checksum.
      const body = key.slice(4, 36);
      const nearBody = body.slice(0, -1) + (body.endsWith("a") ? "b" : "a");
      const near = apiKeyWithBody(nearBody);
      const stranger = mintApiKey().key;
      for (const candidate of [near, stranger]) {
        lookups.mockClear();
        const problem = await expectProblem(
          await gw.call("GET", "/v1/usage", { credential: candidate }),
          401,
          "invalid-credentials",
        );
        expect(problem.detail).toBe("unknown API key");
        expect(lookups.mock.calls.map((c) => c[1])).toEqual([hashApiKey(candidate)]);
      }
      // No string comparison with a stored secret happens in the gateway: the store holds no secret.
      const stored = await keys.findKeyByHash(gw.fresh.db, hashApiKey(key));
      expect(JSON.stringify(stored)).not.toContain(body);
    } finally {
      lookups.mockRestore();
    }
  });

  it("refuses unsigned tokens (alg none) and tokens with no or a broken signature", async () => {
    const none = new UnsecuredJWT(claims())
      .setIssuer("sandfork")
      .setAudience(TEST_AUDIENCE)
      .setSubject(keyId)
      .setJti("n")
      .setExpirationTime("5m")
      .encode();
    await refused(none);
    const real = (
      await gw.tokens.mint(await gw.tokens.verify(await mintedToken()), {
        ttlSeconds: 60,
        templates: null,
        maxExecutions: null,
      })
    ).token;
    const [header, payload, signature] = real.split(".");
    await refused(`${header}.${payload}.`);
    await refused(`${header}.${payload}.${signature?.slice(0, -4)}AAAA`);
    // A header that says alg none over a real payload and signature.
    const noneHeader = Buffer.from(JSON.stringify({ alg: "none", typ: "JWT" })).toString(
      "base64url",
    );
    await refused(`${noneHeader}.${payload}.${signature}`);
    // A payload changed under a real signature (a larger account limit).
    const raised = JSON.parse(Buffer.from(payload ?? "", "base64url").toString()) as {
      lim: { conc: number };
    };
    raised.lim.conc = 1_000_000;
    await refused(
      `${header}.${Buffer.from(JSON.stringify(raised)).toString("base64url")}.${signature}`,
    );
  });

  it("refuses HS256 tokens keyed with the gateway's public key (algorithm confusion) and an embedded attacker key", async () => {
    const publicKey = createPublicKey(signing);
    const asPem = new TextEncoder().encode(
      publicKey.export({ type: "spki", format: "pem" }).toString(),
    );
    const asDer = new Uint8Array(publicKey.export({ type: "spki", format: "der" }));
    for (const secret of [asPem, asDer]) {
      await refused(await forged((j) => j.setProtectedHeader({ alg: "HS256" }).sign(secret)));
    }
    // EdDSA signed by the attacker, with the attacker's public key in the header (jwk injection).
    const attacker = generateKeyPairSync("ed25519");
    const jwk = attacker.publicKey.export({ format: "jwk" });
    await refused(
      await forged((j) =>
        j
          .setProtectedHeader({
            alg: "EdDSA",
            jwk: { kty: jwk.kty ?? "OKP", crv: jwk.crv ?? "Ed25519", x: jwk.x ?? "" },
          })
          .sign(attacker.privateKey),
      ),
    );
  });

  it("refuses a wrong audience or issuer, an expired token and one not valid yet", async () => {
    const eddsa = (j: SignJWT) => j.setProtectedHeader({ alg: "EdDSA" }).sign(signing);
    // The genuine signer with good claims works: the refusals below are the claims' doing.
    expect(
      (await gw.call("GET", "/v1/templates", { credential: await forged(eddsa) })).status,
    ).toBe(503);
    await refused(await forged(eddsa, (j) => j.setAudience("another-gateway")));
    await refused(await forged(eddsa, (j) => j.setIssuer("someone-else")));
    await refused(
      await forged(eddsa, (j) => j.setExpirationTime(Math.floor(Date.now() / 1000) - 60)),
      "credentials-expired",
    );
    await refused(await forged(eddsa, (j) => j.setNotBefore(Math.floor(Date.now() / 1000) + 600)));
    // Required claims missing: no jti, no exp.
    await refused(
      await new SignJWT(claims())
        .setProtectedHeader({ alg: "EdDSA" })
        .setIssuer("sandfork")
        .setAudience(TEST_AUDIENCE)
        .setSubject(keyId)
        .setExpirationTime("5m")
        .sign(signing),
    );
    await refused(
      await new SignJWT(claims())
        .setProtectedHeader({ alg: "EdDSA" })
        .setIssuer("sandfork")
        .setAudience(TEST_AUDIENCE)
        .setSubject(keyId)
        .setJti("j")
        .sign(signing),
    );
  });

  it("refuses an oversized token quickly, and oversized or malformed Authorization headers", async () => {
    // 256 KiB of claims signed by someone else: refused on the signature, without a slow path.
    const attacker = generateKeyPairSync("ed25519").privateKey;
    const padded = await new SignJWT({ ...claims(), pad: "x".repeat(256 * 1024) })
      .setProtectedHeader({ alg: "EdDSA" })
      .setIssuer("sandfork")
      .setAudience(TEST_AUDIENCE)
      .setSubject(keyId)
      .setJti("big")
      .setExpirationTime("5m")
      .sign(attacker);
    const started = performance.now();
    await refused(padded);
    expect(performance.now() - started).toBeLessThan(1_000);
    await refused("a.b.c");
    await refused(`${"A".repeat(100_000)}.${"B".repeat(100_000)}.${"C".repeat(100)}`);
    await refused(`sfk_${"0".repeat(10_000)}`);
    await expectProblem(
      await gw.call("GET", "/v1/templates", { headers: { authorization: `Bearer ${key} ${key}` } }),
      401,
      "unauthenticated",
    );
  });

  async function mintedToken(): Promise<string> {
    const response = await gw.call("POST", "/v1/tokens", {
      credential: key,
      body: { ttl_seconds: 60 },
    });
    expect(response.status).toBe(201);
    return ((await response.json()) as { token: string }).token;
  }
});

describe("hostile bodies", () => {
  let gw: TestGateway;
  let key: string;
  beforeAll(async () => {
    gw = await startTestGateway("pglite");
    ({ key } = await gw.issue({ maxBodyBytes: 64 * 1024 }));
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  const json = { "content-type": "application/json" };

  it("400 for invalid UTF-8 in a JSON body", async () => {
    const bytes = Buffer.concat([
      Buffer.from('{"template":"python","code":"'),
      Buffer.from([0xff, 0xfe, 0xc3]),
      Buffer.from('"}'),
    ]);
    const response = await gw.app.request("/v1/executions", {
      method: "POST",
      headers: { ...json, authorization: `Bearer ${key}` },
      body: bytes,
    });
    await expectProblem(response, 400, "malformed-request");
  });

  it("400 or 422 for deeply nested JSON, within the body cap and past it", async () => {
    for (const depth of [1_000, 30_000]) {
      const nested = `{"template":"python","code":"x","files":${"[".repeat(depth)}${"]".repeat(depth)}}`;
      const response = await gw.call("POST", "/v1/executions", {
        credential: key,
        rawBody: nested,
        headers: json,
      });
      expect([400, 413, 422]).toContain(response.status);
      expect(response.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    }
  });

  it("413 for a body over the key's cap, declared or not", async () => {
    const body = JSON.stringify({ template: "python", code: "x".repeat(100 * 1024) });
    await expectProblem(
      await gw.call("POST", "/v1/executions", { credential: key, rawBody: body, headers: json }),
      413,
      "payload-too-large",
    );
  });

  it("422 for prototype-polluting keys and values of the wrong shape, never a 500", async () => {
    const cases = [
      '{"template":"python","code":"x","__proto__":{"admin":true}}',
      '{"template":"python","code":"x","constructor":{"prototype":{"admin":true}}}',
      '{"template":"python","code":["x"]}',
      '{"template":"python","code":"x","timeout_ms":1e309}',
      '{"template":"python","code":"x","timeout_ms":-1}',
      '{"template":"python","code":"x","files":[{"path":"a","content":"x","encoding":"base64"}]}',
      "[]",
      "null",
      '"text"',
    ];
    for (const rawBody of cases) {
      const response = await gw.call("POST", "/v1/executions", {
        credential: key,
        rawBody,
        headers: json,
      });
      expect([400, 422, 503], rawBody).toContain(response.status);
      expect({} as Record<string, unknown>).not.toHaveProperty("admin");
    }
  });
});

describe("slow and oversized clients on a real socket", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "sandfork-attacks-"));
  const config: GatewayConfig = {
    ...loadConfig({}),
    dataDir,
    port: 0,
    headersTimeoutMs: 1_000,
    requestTimeoutMs: 2_000,
  };
  let gateway: RunningGateway;
  let port: number;
  let adminKey = "";
  beforeAll(async () => {
    gateway = await startGateway(config, {
      log: (line) => (adminKey ||= line.match(/sfk_[0-9A-Za-z]{38}/)?.[0] ?? ""),
    });
    port = Number(new URL(gateway.url).port);
  }, 60_000);
  afterAll(async () => {
    await gateway?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  /** Writes `chunks` with `gapMs` between them; resolves with what the server sent and when it closed. */
  function slowClient(
    chunks: string[],
    gapMs: number,
  ): Promise<{ text: string; closedAfterMs: number }> {
    return new Promise((resolve, reject) => {
      const started = Date.now();
      const socket = connect(port, "127.0.0.1");
      let text = "";
      let i = 0;
      const timer = setInterval(() => {
        if (i < chunks.length && !socket.destroyed) socket.write(chunks[i++] ?? "");
      }, gapMs);
      socket.on("data", (d) => (text += d.toString()));
      socket.on("error", () => {});
      socket.on("close", () => {
        clearInterval(timer);
        resolve({ text, closedAfterMs: Date.now() - started });
      });
      setTimeout(() => reject(new Error("the server never closed the slow connection")), 15_000);
    });
  }

  it("431 for headers over Node's limit (16 KiB), and the server goes on", async () => {
    const response = await fetch(`${gateway.url}/healthz`, {
      headers: { "x-filler": "a".repeat(64 * 1024) },
    });
    expect(response.status).toBe(431);
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
  });

  it("closes a client that sends its headers too slowly (slowloris) at the headers timeout", async () => {
    const drip = [
      "GET /healthz HTTP/1.1\r\n",
      "Host: x\r\n",
      ...Array.from({ length: 20 }, (_, i) => `X-Drip-${i}: y\r\n`),
    ];
    const { text, closedAfterMs } = await slowClient(drip, 300);
    expect(closedAfterMs).toBeGreaterThanOrEqual(config.headersTimeoutMs);
    expect(closedAfterMs).toBeLessThan(config.headersTimeoutMs + 4_000);
    expect(text).not.toMatch(/^HTTP\/1\.1 200/);
  });

  it("closes a client that sends its body too slowly at the request timeout, as the client's failure", async () => {
    const errorsLogged = vi.spyOn(console, "error");
    try {
      // Authenticated, so the server does wait for the body (a 401 would be answered at once).
      const head = `POST /v1/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${adminKey}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n`;
      const { text, closedAfterMs } = await slowClient(
        [head, ...Array.from({ length: 40 }, () => " ")],
        200,
      );
      expect(closedAfterMs).toBeGreaterThanOrEqual(config.requestTimeoutMs);
      expect(closedAfterMs).toBeLessThan(config.requestTimeoutMs + 4_000);
      expect(text).not.toMatch(/^HTTP\/1\.1 2/);
      expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
      // A body cut short is a malformed request, not an unhandled error of the gateway's.
      expect(errorsLogged.mock.calls.filter(([message]) => message === "unhandled error")).toEqual(
        [],
      );
    } finally {
      errorsLogged.mockRestore();
    }
  });
});
