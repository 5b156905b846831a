// Network policies at the edge: the rule grammar (as the VMM reads it), narrowing, and, with a
// TEST DOUBLE of the ExecutionRuntime boundary on both databases, the keys routes, tokens,
// executions, cells' schema, billing, usage, /metrics and the tool text. The real network is
// gateway/network.kvm.test.ts's.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { findExecution } from "../db/billing.js";
import { BACKENDS } from "../db/testing/fresh-database.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  Template,
} from "../runtime/execution-runtime.js";
import { networkGrant, ruleProblem } from "./network-policy.js";
import { ProblemError } from "./problems.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";
import { toolResultText } from "./tools/runner.js";

const MIB = 1024 * 1024;

describe("network rules", () => {
  it.each([
    "example.com",
    "Example.COM.:443",
    "*.pythonhosted.org",
    "3com.example",
    "api.example.com:8000-8100",
    "1.2.3.4",
    "10.1.0.0/16:8000-8100",
    "10.200.3.2/32:8080",
    "0.0.0.0/0",
    "2001:db8::1",
    "[2001:db8::/32]:53",
    "[::ffff:1.2.3.4]:80",
    "[::]",
    "a_b.example",
  ])("reads %s", (rule) => {
    expect(ruleProblem(rule)).toBeUndefined();
  });

  it.each([
    ["", /1 to 300 bytes/],
    ["a".repeat(301), /1 to 300 bytes/],
    ["example.com:0", /not a port/],
    ["example.com:65536", /not a port/],
    ["example.com:+80", /not a port/],
    ["example.com:", /not a port/],
    ["example.com:90-80", /range 90-80 is empty/],
    ["example.com:80-", /not a port/],
    ["10.0.0.1/24", /bits set past its prefix/],
    ["10.0.0.0/33", /not a prefix length/],
    ["10.0.0.0/", /not a prefix length/],
    ["[2001:db8::1/32]", /bits set past its prefix/],
    ["[2001:db8::/129]", /not a prefix length/],
    ["[example.com]:80", /in brackets is not IPv6/],
    ["[2001:db8::1", /without '\]'/],
    ["[2001:db8::1]x", /only ':ports' may follow/],
    ["1.2.3.4.5", /not an IP address/],
    ["256.1.1.1", /not an IP address/],
    ["fe80::1%eth0", /not an IP address/],
    ["exa mple.com", /not a domain/],
    ["*.", /not a domain/],
    ["a.*.example.com", /not a domain/],
    [`${"a".repeat(64)}.com`, /not a domain/],
  ])("refuses %j", (rule, why) => {
    expect(ruleProblem(rule)).toMatch(why);
  });
});

describe("narrowing", () => {
  const key = { allow: ["example.com:443", "10.9.0.2/32"], maxConnections: 8, maxBytes: 4 * MIB };

  it("grants nothing without a policy, and refuses a call that asks for network there", () => {
    expect(networkGrant([], undefined)).toBeUndefined();
    const refusal = (() => {
      try {
        networkGrant([], { allow: ["example.com"] });
      } catch (error) {
        return error;
      }
    })();
    expect(refusal).toBeInstanceOf(ProblemError);
    expect((refusal as ProblemError).slug).toBe("network-not-allowed");
    expect((refusal as ProblemError).status).toBe(403);
  });

  it("stacks the key's list, a token's and the call's, each narrowing, the least limits applying", () => {
    expect(networkGrant([key], undefined)).toEqual({
      allowlists: [key.allow],
      maxConnections: 8,
      maxBytes: 4 * MIB,
    });
    expect(networkGrant([key], { allow: ["example.com:443"], maxBytes: 64 * MIB })).toEqual({
      allowlists: [key.allow, ["example.com:443"]],
      maxConnections: 8,
      maxBytes: 4 * MIB,
    });
    expect(
      networkGrant(
        [{ allow: ["*.example.com"] }, { allow: ["a.example.com"], maxConnections: 2 }],
        {
          allow: [],
        },
      ),
    ).toEqual({
      allowlists: [["*.example.com"], ["a.example.com"], []],
      maxConnections: 2,
      maxBytes: undefined,
    });
  });
});

/** Test double: records requests and answers with `respond`. */
class ScriptedRuntimeTestDouble implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  respond: (request: ExecutionRequest) => ExecutionResult = () => ran();
  async execute(request: ExecutionRequest): Promise<ExecutionResult> {
    this.requests.push(request);
    return this.respond(request);
  }
  async templates(): Promise<Template[]> {
    return [
      { name: "python", language: "python", languages: ["python"], contentHash: "c0", ready: true },
    ];
  }
}

const NETWORK = { bytesIn: 1.5 * MIB, bytesOut: 1000, connections: 2, refused: 3, dnsQueries: 4 };

function ran(overrides: Partial<ExecutionResult> = {}): ExecutionResult {
  return {
    outcome: "completed",
    exitCode: 0,
    stdout: "ok\n",
    stderr: "",
    truncated: false,
    timings: { queueMs: 1, forkMs: 2, execMs: 150 },
    usage: {
      wallMs: 152,
      cpuMs: 100,
      peakMemoryBytes: 1,
      pagesCopied: 1,
      syscalls: 1,
      exits: 1,
      processesCreated: 0,
      network: NETWORK,
    },
    ...overrides,
  };
}

interface ExecutionBody {
  id: string;
  status: string;
  usage: {
    units: number;
    reserved_units: number;
    network: {
      bytes_in: number;
      bytes_out: number;
      connections: number;
      refused: number;
      dns_queries: number;
    } | null;
  };
}

describe.each(BACKENDS)("network policies on %s", (backend) => {
  let gw: TestGateway;
  let runtime: ScriptedRuntimeTestDouble;
  let admin: string;
  beforeAll(async () => {
    gw = await startTestGateway(backend);
    admin = (await gw.issue({ scopes: ["admin"] })).key;
  });
  afterAll(async () => {
    await gw?.dispose();
  });
  beforeEach(() => {
    runtime = new ScriptedRuntimeTestDouble();
    gw.runtime = runtime;
  });

  it("lets an admin set, show and clear a key's policy, refusing bad rules with 422", async () => {
    const created = await gw.call("POST", "/v1/keys", {
      credential: admin,
      body: { name: "net", network: { allow: ["pypi.org:443"], max_bytes: 8 * MIB } },
    });
    expect(created.status).toBe(201);
    const key = (await created.json()) as { id: string; network: unknown };
    expect(key.network).toEqual({ allow: ["pypi.org:443"], max_bytes: 8 * MIB });

    const bad = await expectProblem(
      await gw.call("POST", "/v1/keys", {
        credential: admin,
        body: { name: "bad", network: { allow: ["pypi.org", "10.0.0.1/8"] } },
      }),
      422,
      "validation-failed",
    );
    expect(bad.errors).toEqual([
      { path: "network.allow.1", message: "10.0.0.1/8 has bits set past its prefix length" },
    ]);
    await expectProblem(
      await gw.call("PUT", `/v1/keys/${key.id}/network`, {
        credential: admin,
        body: { network: { allow: [] } },
      }),
      422,
      "validation-failed",
    );

    const set = await gw.call("PUT", `/v1/keys/${key.id}/network`, {
      credential: admin,
      body: { network: { allow: ["*.example.com:443"], max_connections: 4 } },
    });
    expect(set.status).toBe(200);
    expect(((await set.json()) as { network: unknown }).network).toEqual({
      allow: ["*.example.com:443"],
      max_connections: 4,
    });
    const listed = (await (await gw.call("GET", "/v1/keys", { credential: admin })).json()) as {
      keys: { id: string; network: unknown }[];
    };
    expect(listed.keys.find((k) => k.id === key.id)?.network).toEqual({
      allow: ["*.example.com:443"],
      max_connections: 4,
    });
    const cleared = await gw.call("PUT", `/v1/keys/${key.id}/network`, {
      credential: admin,
      body: { network: null },
    });
    expect(((await cleared.json()) as { network: unknown }).network).toBeNull();
    await expectProblem(
      await gw.call("PUT", "/v1/keys/00000000-0000-4000-8000-000000000000/network", {
        credential: admin,
        body: { network: null },
      }),
      404,
      "not-found",
    );
    const caller = await gw.issue();
    await expectProblem(
      await gw.call("PUT", `/v1/keys/${caller.keyId}/network`, {
        credential: caller.key,
        body: { network: { allow: ["example.com"] } },
      }),
      403,
      "insufficient-scope",
    );
  });

  it("runs a key without a policy offline, and refuses a call asking for network there", async () => {
    const { key } = await gw.issue({ credits: 1000 });
    const offline = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code: "print(1)" },
    });
    expect(offline.status).toBe(200);
    expect(runtime.requests[0]?.network).toBeUndefined();
    expect(((await offline.json()) as ExecutionBody).usage.network).toBeNull();

    const refused = await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "print(1)", network: { allow: ["example.com"] } },
      }),
      403,
      "network-not-allowed",
    );
    expect(refused.retryable).toBe(false);
    expect(runtime.requests).toHaveLength(1);
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "print(1)", network: { allow: ["example.com:99999"] } },
      }),
      422,
      "validation-failed",
    );
  });

  it("sends the key's list and the call's, bills the bytes, keeps the usage and counts it", async () => {
    const policy = { allow: ["example.com:443", "10.9.0.2/32"], maxBytes: 2 * MIB };
    const { key, keyId, accountId } = await gw.issue({ credits: 1000, network: policy });
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: {
        template: "python",
        code: "fetch()",
        network: { allow: ["10.9.0.2/32:8080"], max_bytes: 64 * MIB, max_connections: 3 },
      },
    });
    expect(response.status).toBe(200);
    expect(runtime.requests[0]?.network).toEqual({
      allowlists: [policy.allow, ["10.9.0.2/32:8080"]],
      maxConnections: 3,
      maxBytes: 2 * MIB,
    });
    const body = (await response.json()) as ExecutionBody;
    // Reserved: 1 + 10 x 5 s, and 2 units for the 2 MiB the grant allows. Charged: 1 + ceil(1.52)
    // for 152 ms, and ceil(1.5 MiB + 1000 bytes) = 2 for the network.
    expect(body.usage).toMatchObject({ reserved_units: 53, units: 5 });
    expect(body.usage.network).toEqual({
      bytes_in: 1.5 * MIB,
      bytes_out: 1000,
      connections: 2,
      refused: 3,
      dns_queries: 4,
    });
    expect((await findExecution(gw.fresh.db, body.id))?.network).toEqual(NETWORK);
    const read = await gw.call("GET", `/v1/executions/${body.id}`, { credential: key });
    expect(((await read.json()) as ExecutionBody).usage.network).toEqual(body.usage.network);
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 995, reservedUnits: 0 });

    const usage = (await (
      await gw.call("GET", `/v1/usage?key_id=${keyId}`, { credential: admin })
    ).json()) as { network: unknown; units: number };
    expect(usage.network).toEqual({ bytes_in: 1.5 * MIB, bytes_out: 1000, refused: 3 });
    expect(usage.units).toBe(5);
    const metrics = await (await gw.call("GET", "/metrics")).text();
    expect(metrics).toMatch(/sandfork_network_bytes_total\{direction="in"[^}]*\} \d+/);
    expect(metrics).toMatch(/sandfork_network_refused_total\{template="python"[^}]*\} \d+/);
  });

  it("passes a byte cap reached through as network_exceeded, billed for what moved", async () => {
    const { key } = await gw.issue({ credits: 1000, network: { allow: ["example.com"] } });
    runtime.respond = () =>
      ran({ outcome: "network_exceeded", exitCode: null, stdout: "partial\n" });
    const body = (await (
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "download()" },
      })
    ).json()) as ExecutionBody;
    expect(body.status).toBe("network_exceeded");
    // The default cap, 256 MiB, is reserved at 1 unit a MiB.
    expect(body.usage).toMatchObject({ reserved_units: 51 + 256, units: 5 });
  });

  it("carries the key's policy and a token's narrowing in the token", async () => {
    const offline = await gw.issue();
    await expectProblem(
      await gw.call("POST", "/v1/tokens", {
        credential: offline.key,
        body: { network: { allow: ["example.com"] } },
      }),
      403,
      "network-not-allowed",
    );
    const { key } = await gw.issue({ credits: 1000, network: { allow: ["*.example.com:443"] } });
    const minted = await gw.call("POST", "/v1/tokens", {
      credential: key,
      body: { network: { allow: ["api.example.com:443"], max_bytes: MIB } },
    });
    expect(minted.status).toBe(201);
    const token = (await minted.json()) as { token: string; network: unknown };
    expect(token.network).toEqual({ allow: ["api.example.com:443"], max_bytes: MIB });
    const run = await gw.call("POST", "/v1/executions", {
      credential: token.token,
      body: { template: "python", code: "x", network: { allow: ["api.example.com:443"] } },
    });
    expect(run.status).toBe(200);
    expect(runtime.requests[0]?.network).toEqual({
      allowlists: [["*.example.com:443"], ["api.example.com:443"], ["api.example.com:443"]],
      maxConnections: undefined,
      maxBytes: MIB,
    });
  });

  it("tells a model that the policy refused something, and not otherwise", async () => {
    const { key } = await gw.issue({ credits: 1000, network: { allow: ["example.com"] } });
    const answer = await gw.call("POST", "/v1/tool-calls", {
      credential: key,
      body: {
        id: "call_1",
        type: "function",
        function: {
          name: "run_code",
          arguments: JSON.stringify({
            language: "python",
            code: "fetch()",
            network: { allow: ["example.com:443"] },
          }),
        },
      },
    });
    expect(answer.status).toBe(200);
    const message = (await answer.json()) as { content: string };
    const [json, line] = message.content.split("\n");
    expect(JSON.parse(json as string)).toMatchObject({ usage: { network: { refused: 3 } } });
    expect(line).toMatch(/network policy refused 3/);
    expect(runtime.requests[0]?.network?.allowlists).toEqual([
      ["example.com"],
      ["example.com:443"],
    ]);
    const quiet = toolResultText({
      isError: false,
      executionId: "e",
      images: [],
      structured: {
        execution_id: "e",
        status: "completed",
        exit_code: 0,
        stdout: "",
        stderr: "",
        truncated: false,
        timings: { queue_ms: 0, fork_ms: 0, exec_ms: 0, total_ms: 0 },
        usage: {
          unit: "credit",
          units: 1,
          network: { bytes_in: 1, bytes_out: 1, connections: 1, refused: 0, dns_queries: 1 },
        },
        results: [],
        files: [],
      },
    });
    expect(quiet).not.toContain("\n");
  });
});
