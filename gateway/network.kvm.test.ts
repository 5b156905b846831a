// Network egress through the gateway on KVM: a key's network policy and a call's narrowing of it
// reach the REAL supervised daemon, whose guests fetch from a server in a network namespace this
// test makes (`ip netns add`, a veth pair: 10.X.Y.1/30 on the host's end, 10.X.Y.2/30 inside, X
// and Y from the test's pid), running native-vmm/tests/network/servers.py (HTTP on 8080). 10/8
// is a private range, refused unless a rule names it exactly, so every policy names the test
// host's /32. Billing is priced at one unit a byte, so the charge says the bytes exactly.
//
// Needs root (network namespaces) and a /dev/kvm that runs guests: scripts/kvm-tier.sh runs it
// with vitest.kvm.config.ts. Its waits are multiplied by SANDFORK_TEST_TIME_SCALE.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { findExecution } from "../db/billing.js";
import type { StartedRuntime } from "../runtime/start.js";
import { timeScale } from "./testing/kvm-tier.js";
import { startPythonGateway } from "./testing/python-gateway.js";
import { expectProblem, type TestGateway } from "./testing/test-gateway.js";

const MIB = 1024 * 1024;
const SERVERS = resolve("native-vmm/tests/network/servers.py");
const NAMESPACE = `sfgw${process.pid}`;
const X = 150 + (process.pid % 50);
const Y = Math.floor(process.pid / 50) % 250;
const HOST = `10.${X}.${Y}.2`;
const OUTSIDE = `10.${X}.${Y}.1`;
/** The rule that names the test host's HTTP server, and only it. */
const WEB_RULE = `${HOST}/32:8080`;
// One unit a byte of network, nothing for time: a charge is 1 + the bytes moved.
const PRICING = {
  unitName: "credit",
  templates: { "*": { baseUnits: 1, unitsPerSecond: 0, unitsPerNetworkMib: MIB } },
};
const TIMEOUT_MS = 20_000;

let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;
let servers: ChildProcess | undefined;
const log: string[] = [];

const ip = (...args: string[]) => execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });

/** The namespace, its veth pair and the servers in it; resolves once they listen. */
async function startTestNetwork(): Promise<void> {
  try {
    ip("netns", "del", NAMESPACE);
  } catch {
    // None left from an earlier run of this pid.
  }
  ip("netns", "add", NAMESPACE);
  ip("link", "add", `${NAMESPACE}h`, "type", "veth", "peer", "name", `${NAMESPACE}n`);
  ip("link", "set", `${NAMESPACE}n`, "netns", NAMESPACE);
  ip("addr", "add", `${OUTSIDE}/30`, "dev", `${NAMESPACE}h`);
  ip("link", "set", `${NAMESPACE}h`, "up");
  ip("-n", NAMESPACE, "addr", "add", `${HOST}/30`, "dev", `${NAMESPACE}n`);
  ip("-n", NAMESPACE, "link", "set", `${NAMESPACE}n`, "up");
  ip("-n", NAMESPACE, "link", "set", "lo", "up");
  const child = spawn(
    "ip",
    ["netns", "exec", NAMESPACE, "/usr/bin/python3.11", SERVERS, HOST, `web.test=${HOST}`],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  servers = child;
  const stdout = child.stdout;
  if (stdout === null) throw new Error("the test servers have no stdout");
  await new Promise<void>((ready, fail) => {
    const timer = setTimeout(
      () => fail(new Error("the test servers did not start")),
      10_000 * timeScale,
    );
    createInterface({ input: stdout }).once("line", (line) => {
      clearTimeout(timer);
      if (line.trim() === "ready") ready();
      else fail(new Error(`the test servers printed ${line}`));
    });
    child.once("exit", (code) => fail(new Error(`the test servers exited (${code})`)));
  });
}

beforeAll(async () => {
  await startTestNetwork();
  dir = await mkdtemp(join(tmpdir(), "sfk-net-"));
  ({ runtime, gw } = await startPythonGateway(dir, log, { pricing: PRICING }));
});

afterAll(async () => {
  await gw?.dispose();
  await runtime?.stop();
  servers?.kill("SIGKILL");
  try {
    ip("netns", "del", NAMESPACE);
  } catch {
    // Never made: startTestNetwork failed before.
  }
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

interface ExecutionBody {
  id: string;
  status: string;
  exit_code: number | null;
  stdout: string;
  stderr: string;
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

async function run(key: string, code: string, network?: { allow: string[] }) {
  const response = await gw.call("POST", "/v1/executions", {
    credential: key,
    body: {
      template: "python",
      code,
      timeout_ms: TIMEOUT_MS * timeScale,
      ...(network === undefined ? {} : { network }),
    },
  });
  const text = await response.text();
  expect(response.status, `${text}\n${log.join("\n")}`).toBe(200);
  return JSON.parse(text) as ExecutionBody;
}

const GET_INDEX =
  "import urllib.request as u\n" +
  `print(u.urlopen('http://${HOST}:8080/index.html', timeout=10).read().decode(), end='')`;

/** Connects to `port` of the test host; prints the errno's name when it fails. */
const connectTo = (port: number) =>
  "import socket, errno\n" +
  "s = socket.socket()\n" +
  "s.settimeout(10)\n" +
  `try: s.connect(('${HOST}', ${port})); print('connected')\n` +
  "except OSError as e: print(errno.errorcode.get(e.errno, e.errno))";

describe("network egress through the gateway on KVM", () => {
  it("a key whose policy names the test host fetches from it, billed by the byte", async () => {
    const { key, accountId } = await gw.issue({
      credits: 10 * MIB,
      network: { allow: [WEB_RULE], maxBytes: MIB },
    });
    const body = await run(key, GET_INDEX);
    expect(body.status, body.stderr).toBe("completed");
    expect(body.stdout).toBe("hello-from-netns\n");
    const network = body.usage.network;
    expect(network).not.toBeNull();
    if (network === null) return;
    expect(network.connections).toBe(1);
    expect(network.refused).toBe(0);
    // The response's body and headers came in; the request went out.
    expect(network.bytes_in).toBeGreaterThan("hello-from-netns\n".length);
    expect(network.bytes_out).toBeGreaterThan("GET /index.html HTTP/1.1\r\n".length);
    // Reserved: 1 + the grant's 1 MiB; charged: 1 + every byte in and out.
    expect(body.usage.reserved_units).toBe(1 + MIB);
    expect(body.usage.units).toBe(1 + network.bytes_in + network.bytes_out);
    expect((await findExecution(gw.fresh.db, body.id))?.network).toEqual({
      bytesIn: network.bytes_in,
      bytesOut: network.bytes_out,
      connections: network.connections,
      refused: 0,
      dnsQueries: network.dns_queries,
    });
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 10 * MIB - body.usage.units,
      reservedUnits: 0,
    });
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      units: number;
      network: unknown;
    };
    expect(usage.network).toEqual({
      bytes_in: network.bytes_in,
      bytes_out: network.bytes_out,
      refused: 0,
    });
    expect(usage.units).toBe(body.usage.units);
  });

  it("without a policy the same program reaches nothing, and asking for network is a 403", async () => {
    const { key } = await gw.issue({ credits: 10 * MIB });
    const offline = await run(
      key,
      "import urllib.request as u, urllib.error as ue\n" +
        `try: print(u.urlopen('http://${HOST}:8080/index.html', timeout=10).read().decode(), end='')\n` +
        "except ue.URLError as e: print('failed', type(e.reason).__name__)",
    );
    expect(offline.status, offline.stderr).toBe("completed");
    expect(offline.stdout).toMatch(/^failed \w+\n$/);
    expect(offline.stdout).not.toContain("hello-from-netns");
    expect(offline.usage.network).toBeNull();
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: GET_INDEX, network: { allow: [WEB_RULE] } },
      }),
      403,
      "network-not-allowed",
    );
  });

  it("refuses and counts a port the policy does not name, and a call's narrowing", async () => {
    const { key } = await gw.issue({
      credits: 10 * MIB,
      network: { allow: [WEB_RULE], maxBytes: MIB },
    });
    const denied = await run(key, connectTo(7));
    expect(denied.status, denied.stderr).toBe("completed");
    expect(denied.stdout).toBe("EACCES\n");
    expect(denied.usage.network?.refused).toBe(1);
    expect(denied.usage.network?.connections).toBe(0);
    // The key allows 8080; a call narrowing to another port of the host takes 8080 away.
    const narrowed = await run(key, connectTo(8080), { allow: [`${HOST}/32:9000`] });
    expect(narrowed.stdout).toBe("EACCES\n");
    expect(narrowed.usage.network?.refused).toBe(1);
    const allowed = await run(key, connectTo(8080), { allow: [WEB_RULE] });
    expect(allowed.stdout).toBe("connected\n");
    expect(allowed.usage.network?.refused).toBe(0);
  });

  it("a session's cells run under the key's policy, each narrowing it for itself", async () => {
    const { key } = await gw.issue({
      credits: 10 * MIB,
      network: { allow: [WEB_RULE], maxBytes: MIB },
    });
    const created = await gw.call("POST", "/v1/sessions", {
      credential: key,
      body: { template: "python" },
    });
    const createdText = await created.text();
    expect(created.status, createdText).toBe(201);
    const { id } = JSON.parse(createdText) as { id: string };
    const cell = async (code: string, network?: { allow: string[] }) => {
      const response = await gw.call("POST", `/v1/sessions/${id}/executions`, {
        credential: key,
        body: { code, timeout_ms: TIMEOUT_MS * timeScale, ...(network ? { network } : {}) },
      });
      const text = await response.text();
      expect(response.status, text).toBe(200);
      return (JSON.parse(text) as { execution: ExecutionBody }).execution;
    };
    const fetched = await cell(GET_INDEX);
    expect(fetched.stdout).toBe("hello-from-netns\n");
    expect(fetched.usage.network?.connections).toBe(1);
    expect(fetched.usage.units).toBe(
      1 + (fetched.usage.network?.bytes_in ?? 0) + (fetched.usage.network?.bytes_out ?? 0),
    );
    const narrowed = await cell(connectTo(8080), { allow: [`${HOST}/32:9000`] });
    expect(narrowed.stdout).toBe("EACCES\n");
    expect(narrowed.usage.network?.refused).toBe(1);
    await gw.call("DELETE", `/v1/sessions/${id}`, { credential: key });
  });

  it("ends a run past its byte cap as network_exceeded", async () => {
    const { key } = await gw.issue({
      credits: 10 * MIB,
      network: { allow: [WEB_RULE], maxBytes: 64 * 1024 },
    });
    const body = await run(
      key,
      "import urllib.request as u\n" +
        `data = u.urlopen('http://${HOST}:8080/bytes/1048576', timeout=10).read()\n` +
        "print(len(data))",
    );
    expect(body.status, body.stderr).toBe("network_exceeded");
    expect(body.stdout).toBe("");
    const network = body.usage.network;
    expect(network?.bytes_in ?? 0).toBeGreaterThan(0);
    expect((network?.bytes_in ?? 0) + (network?.bytes_out ?? 0)).toBeLessThanOrEqual(64 * 1024);
    expect(body.usage.units).toBe(1 + (network?.bytes_in ?? 0) + (network?.bytes_out ?? 0));
  });
});
