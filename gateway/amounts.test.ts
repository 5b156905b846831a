// Amounts of credit are exact integers end to end: a balance never passes 2^53 - 1 (the largest
// integer a JSON number carries exactly), so every amount an answer states is exact, and a grant
// that would pass it is a 422, not a silently rounded balance or, past 2^63, a database error.
import { eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { getBalance, listKeys, MAX_BALANCE_UNITS } from "../db/keys.js";
import { usageLedger } from "../db/schema.js";
import { BACKENDS } from "../db/testing/fresh-database.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

describe.each(BACKENDS)("amounts on %s", (backend) => {
  let gw: TestGateway;
  let admin: string;
  beforeAll(async () => {
    gw = await startTestGateway(backend);
    ({ key: admin } = await gw.issue({ scopes: ["admin"] }));
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  const grant = (accountId: string, units: unknown) =>
    gw.call("POST", `/v1/accounts/${accountId}/credits`, { credential: admin, body: { units } });

  it("a balance reaches 2^53 - 1 exactly and no further: the grant past it is a 422 and grants nothing", async () => {
    const { accountId } = await gw.issue();
    expect((await grant(accountId, MAX_BALANCE_UNITS - 10)).status).toBe(200);
    const full = await grant(accountId, 10);
    expect(full.status).toBe(200);
    // The number as the client's JSON parser reads it: exact, not rounded.
    const text = await full.text();
    expect(text).toContain(`"balance_units":${MAX_BALANCE_UNITS},`);
    expect(JSON.parse(text)).toMatchObject({
      balance_units: MAX_BALANCE_UNITS,
      available_units: MAX_BALANCE_UNITS,
    });

    for (const units of [1, MAX_BALANCE_UNITS]) {
      const problem = await expectProblem(await grant(accountId, units), 422, "balance-limit");
      expect(problem).toMatchObject({ retryable: false, max_balance_units: MAX_BALANCE_UNITS });
    }
    expect(await getBalance(gw.fresh.db, accountId)).toMatchObject({
      balanceUnits: MAX_BALANCE_UNITS,
    });
    const grants = await gw.fresh.db
      .select()
      .from(usageLedger)
      .where(eq(usageLedger.accountId, accountId));
    expect(grants.map((g) => g.units)).toEqual([MAX_BALANCE_UNITS - 10, 10]);
  });

  // 1030 grants in a row, each a transaction: work a busy host makes many times slower. Its limit
  // bounds a hang only; it asserts no speed.
  it("grants that would once have passed 2^63 are each refused, not a 500", async () => {
    const { accountId } = await gw.issue({ credits: MAX_BALANCE_UNITS });
    for (let i = 0; i < 1030; i++) {
      const response = await grant(accountId, MAX_BALANCE_UNITS);
      if (response.status !== 422)
        throw new Error(`grant ${i}: ${response.status} ${await response.text()}`);
    }
    expect(await getBalance(gw.fresh.db, accountId)).toMatchObject({
      balanceUnits: MAX_BALANCE_UNITS,
    });
  }, 300_000);

  it("a key created with credits on a full account is refused whole: no grant, no key", async () => {
    const { accountId } = await gw.issue({ credits: MAX_BALANCE_UNITS });
    const before = (await listKeys(gw.fresh.db, accountId)).length;
    const response = await gw.call("POST", "/v1/keys", {
      credential: admin,
      body: { name: "more", account_id: accountId, credits: 1 },
    });
    await expectProblem(response, 422, "balance-limit");
    expect((await listKeys(gw.fresh.db, accountId)).length).toBe(before);
    expect(await getBalance(gw.fresh.db, accountId)).toMatchObject({
      balanceUnits: MAX_BALANCE_UNITS,
    });
  });

  it("an amount that is not an integer from 1 to 2^53 - 1 does not match the schema", async () => {
    const { accountId } = await gw.issue();
    for (const raw of [
      "9007199254740992",
      "9223372036854775808",
      "1e300",
      "1.5",
      "0",
      "-1",
      '"1"',
      "null",
      "[1]",
    ]) {
      const response = await gw.call("POST", `/v1/accounts/${accountId}/credits`, {
        credential: admin,
        rawBody: `{"units":${raw}}`,
        headers: { "content-type": "application/json" },
      });
      await expectProblem(response, 422, "validation-failed");
      const keyed = await gw.call("POST", "/v1/keys", {
        credential: admin,
        rawBody: `{"name":"k","credits":${raw}}`,
        headers: { "content-type": "application/json" },
      });
      await expectProblem(keyed, 422, "validation-failed");
    }
    expect(await getBalance(gw.fresh.db, accountId)).toMatchObject({ balanceUnits: 0 });
  });

  it("the OpenAPI document states the limit of every amount", async () => {
    const doc = (await (await gw.call("GET", "/openapi.json")).json()) as {
      components: {
        schemas: Record<string, { properties: Record<string, Record<string, unknown>> }>;
      };
    };
    const { schemas } = doc.components;
    expect(schemas.CreditGrant?.properties.units).toMatchObject({
      type: "integer",
      minimum: 1,
      maximum: MAX_BALANCE_UNITS,
    });
    expect(schemas.CreateKeyRequest?.properties.credits).toMatchObject({
      type: "integer",
      minimum: 1,
      maximum: MAX_BALANCE_UNITS,
    });
    for (const field of ["balance_units", "reserved_units", "available_units"]) {
      expect(schemas.Balance?.properties[field], field).toMatchObject({
        type: "integer",
        minimum: 0,
        maximum: MAX_BALANCE_UNITS,
      });
    }
  });
});
