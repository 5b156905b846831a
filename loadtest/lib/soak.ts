// The soak: the gateway as `npm start` runs it (gateway/main.ts in a child process with its
// supervised, seccomp-confined daemon) under a mixed load for a bounded time: programs that
// complete, time out, run out of memory, crash and flood their output, at a fixed concurrency.
// Afterwards it checks that every request was answered with its expected status, that neither
// process's RSS grew past a bound, that the daemon holds no more VMs or descriptors than it did
// once warm, and that billing reconciles (usage equals the sum of the charges answered, no hold
// left, balance = grant - usage). Used by `npm run soak` (2 minutes) and by
// gateway/soak.kvm.test.ts (a short run in the KVM tier); with a CPU hog on every core through
// the measured run (`cpuHog`: a child spinning on each core at nice 0, as a busy neighbour) and a
// count of requests, by `npm run soak:loaded` and gateway/soak-loaded.kvm.test.ts.
import { mkdtemp, readdir, readFile, readlink, rm } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { startGatewayProcess } from "../../gateway/testing/gateway-process.js";
import { DaemonClient } from "../../runtime/daemon-client.js";
import { startCpuHog } from "./cpu-hog.js";
import { drive } from "./measure.js";

/** One kind of program of the mix, with the status the gateway must answer for it. */
interface Kind {
  name: string;
  body: Record<string, unknown>;
  status: string;
  check?: (body: ExecutionAnswer) => boolean;
}

interface ExecutionAnswer {
  status: string;
  stdout: string;
  truncated: boolean;
  usage: { units: number };
}

/** The kinds of request the soak mixes; `oomTimeoutMs` is the out-of-memory kind's time limit. */
const kindsOf = (oomTimeoutMs: number): Kind[] => [
  {
    name: "ok",
    body: { code: "print(6*7)" },
    status: "completed",
    check: (b) => b.stdout === "42\n",
  },
  { name: "timeout", body: { code: "while True: pass", timeout_ms: 200 }, status: "timed_out" },
  // At the template's own memory size (256 MiB), so that it runs on a pooled VM like the rest
  // (a smaller limit has no snapshot: each such request would boot its agent). Filling it copies
  // ~50,000 pages (~0.3 s of CPU); on a shared, loaded host that took 2-5 s of wall time with
  // four at once, so its time limit is the gateway's largest (by default), not the 5 s default.
  {
    name: "oom",
    body: { code: "x = []\nwhile True: x.append(bytearray(1 << 20))", timeout_ms: oomTimeoutMs },
    status: "memory_exceeded",
  },
  { name: "crash", body: { code: "import ctypes; ctypes.string_at(0)" }, status: "crashed" },
  {
    name: "flood",
    body: { code: "import sys\nwhile True: sys.stdout.write('x' * 65536)" },
    status: "output_exceeded",
    check: (b) => b.truncated,
  },
];

export interface SoakOptions {
  /** How long the measured run lasts; with `requests`, the most it may last. */
  seconds: number;
  /** Exactly this many requests in the measured run (bounded by `seconds`: fewer fail the soak). */
  requests?: number;
  /** A child spinning on each core at nice 0 through the measured run, stopped after it. */
  cpuHog?: boolean;
  concurrency: number;
  /** Built templates (a python template with its snapshot); built into a scratch folder if unset. */
  templatesDir?: string;
  /**
   * The out-of-memory kind's time limit (default 30 s, the gateway's largest by default): a slower
   * path needs more to fill the VM's memory; gatewayEnv must then raise SANDFORK_MAX_TIMEOUT_MS.
   */
  oomTimeoutMs?: number;
  /** More environment for the gateway process (e.g. the KVM tier's slower path's limits). */
  gatewayEnv?: Record<string, string>;
  log?: (line: string) => void;
}

export interface SoakReport {
  seconds: number;
  requests: number;
  /** The load averages (1, 5, 15 min) as the measured run ended. */
  loadavg: number[];
  /** Answers per kind and status, e.g. {"ok": {"completed": 120}}. */
  statuses: Record<string, Record<string, number>>;
  /** Requests answered with something else than their kind's status (HTTP status and body). */
  wrong: string[];
  rssKib: { daemon: [number, number]; gateway: [number, number] };
  daemonFds: [number, number];
  daemonVms: [number, number];
  billing: {
    answeredUnits: number;
    usageUnits: number;
    usageExecutions: number;
    reservedUnits: number;
    balanceUnits: number;
    grantedUnits: number;
  };
  /** What failed of the checks above; empty when the soak passed. */
  failures: string[];
}

/** Growth allowed over a soak, in KiB: the warm pool keeps its copied pages, nothing else may grow. */
const RSS_GROWTH_KIB = { daemon: 96 * 1024, gateway: 96 * 1024 };
const GRANT = 1_000_000_000;

async function rssKib(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1] ?? Number.NaN);
}

/** The daemon's open descriptors, and how many of them are KVM VMs. */
async function descriptors(pid: number): Promise<{ fds: number; vms: number }> {
  const entries = await readdir(`/proc/${pid}/fd`);
  const targets = await Promise.all(
    entries.map((fd) => readlink(`/proc/${pid}/fd/${fd}`).catch(() => "")),
  );
  return { fds: entries.length, vms: targets.filter((t) => t === "anon_inode:kvm-vm").length };
}

export async function soak(options: SoakOptions): Promise<SoakReport> {
  const log = options.log ?? (() => {});
  const kinds = kindsOf(options.oomTimeoutMs ?? 30_000);
  const dir = await mkdtemp(join(tmpdir(), "sfk-soak-"));
  const socketPath = join(dir, "vmm.sock");
  const gateway = await startGatewayProcess({
    dataDir: join(dir, "data"),
    socketPath,
    templatesDir: options.templatesDir ?? join(dir, "templates"),
    env: { SANDFORK_TEMPLATES: "python", ...options.gatewayEnv },
    startTimeoutMs: 300_000,
  });
  const daemon = new DaemonClient({ socketPath, connections: 1 });
  try {
    if (gateway.admin === undefined)
      throw new Error("the gateway printed no admin key on its fresh database");
    const admin = {
      authorization: `Bearer ${gateway.admin.key}`,
      "content-type": "application/json",
    };
    const created = await fetch(`${gateway.url}/v1/keys`, {
      method: "POST",
      headers: admin,
      body: JSON.stringify({
        name: "soak",
        credits: GRANT,
        rate_limit_per_minute: 1_000_000,
        max_concurrency: options.concurrency,
      }),
    });
    if (created.status !== 201)
      throw new Error(`creating the soak key: ${created.status} ${await created.text()}`);
    const { key } = (await created.json()) as { key: string };
    const headers = { authorization: `Bearer ${key}`, "content-type": "application/json" };

    const statuses: Record<string, Record<string, number>> = {};
    const wrong: string[] = [];
    let answeredUnits = 0;
    let answered = 0;
    let sequence = 0;
    const send = async (): Promise<boolean> => {
      const kind = kinds[sequence % kinds.length] as Kind;
      const n = sequence++;
      const response = await fetch(`${gateway.url}/v1/executions`, {
        method: "POST",
        headers: { ...headers, "idempotency-key": `soak-${n}` },
        body: JSON.stringify({ template: "python", ...kind.body }),
      });
      const text = await response.text();
      const body = response.status === 200 ? (JSON.parse(text) as ExecutionAnswer) : undefined;
      const got = body?.status ?? `HTTP ${response.status}`;
      const byStatus = statuses[kind.name] ?? {};
      statuses[kind.name] = byStatus;
      byStatus[got] = (byStatus[got] ?? 0) + 1;
      if (body !== undefined) {
        answered++;
        answeredUnits += body.usage.units;
      }
      const right =
        body !== undefined && body.status === kind.status && (kind.check?.(body) ?? true);
      if (!right && wrong.length < 20)
        wrong.push(`${kind.name}: ${response.status} ${text.slice(0, 300)}`);
      return right;
    };

    // Warm: every kind once, so the pool, the template's pages and the database are in use.
    await drive({
      scenario: "soak warm-up",
      requests: kinds.length * 2,
      concurrency: options.concurrency,
      maxDurationMs: 60_000,
      send,
    });
    const daemonPid = gateway.daemonPid();
    const settled = async () => {
      await daemon.connect().catch(() => {});
      const deadline = Date.now() + 30_000;
      for (;;) {
        const stats = await daemon.stats();
        if (stats.inFlight === 0 && stats.pools.every((p) => p.ready === p.target)) return;
        if (Date.now() > deadline)
          throw new Error(`the daemon did not settle: ${JSON.stringify(stats)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    await settled();
    const before = {
      daemon: await rssKib(daemonPid),
      gateway: await rssKib(gateway.pid),
      ...(await descriptors(daemonPid)),
    };
    const length =
      options.requests === undefined
        ? `${options.seconds} s`
        : `${options.requests} requests (at most ${options.seconds} s)`;
    log(
      `soak: ${length} at concurrency ${options.concurrency}${options.cpuHog ? ", a CPU hog on every core" : ""}; daemon RSS ${before.daemon} KiB, ${before.fds} fds, ${before.vms} VMs`,
    );

    const hog = options.cpuHog ? startCpuHog() : undefined;
    let run: Awaited<ReturnType<typeof drive>>;
    let loadAverages: number[];
    try {
      run = await drive({
        scenario: "soak",
        requests: options.requests ?? Number.MAX_SAFE_INTEGER,
        concurrency: options.concurrency,
        maxDurationMs: options.seconds * 1000,
        send,
      });
    } finally {
      loadAverages = loadavg().map((l) => Number(l.toFixed(2)));
      hog?.stop();
    }
    await settled();
    const after = {
      daemon: await rssKib(daemonPid),
      gateway: await rssKib(gateway.pid),
      ...(await descriptors(daemonPid)),
    };

    const usage = (await (await fetch(`${gateway.url}/v1/usage`, { headers })).json()) as {
      executions: number;
      units: number;
      balance: { balance_units: number; reserved_units: number };
    };
    const billing = {
      answeredUnits,
      usageUnits: usage.units,
      usageExecutions: usage.executions,
      reservedUnits: usage.balance.reserved_units,
      balanceUnits: usage.balance.balance_units,
      grantedUnits: GRANT,
    };
    const total = sequence;
    const failures: string[] = [];
    if (run.failures > 0 || wrong.length > 0)
      failures.push(
        `${run.failures} of ${run.requests} soak requests got another answer than their kind's`,
      );
    if (options.requests !== undefined && run.requests < options.requests)
      failures.push(
        `only ${run.requests} of ${options.requests} requests were answered within ${options.seconds} s`,
      );
    if (gateway.daemonPid() !== daemonPid)
      failures.push("the daemon was restarted during the soak");
    for (const name of ["daemon", "gateway"] as const) {
      if (after[name] - before[name] > RSS_GROWTH_KIB[name])
        failures.push(`${name} RSS grew from ${before[name]} to ${after[name]} KiB`);
    }
    if (after.fds > before.fds)
      failures.push(`the daemon holds ${after.fds} descriptors, ${before.fds} before`);
    if (after.vms > before.vms)
      failures.push(`the daemon holds ${after.vms} VMs, ${before.vms} before`);
    if (billing.usageExecutions !== answered)
      failures.push(
        `usage counts ${billing.usageExecutions} executions, ${answered} were answered 200`,
      );
    if (billing.usageUnits !== billing.answeredUnits)
      failures.push(
        `usage is ${billing.usageUnits} units, the answers charged ${billing.answeredUnits}`,
      );
    if (billing.reservedUnits !== 0)
      failures.push(`${billing.reservedUnits} units are still reserved`);
    if (billing.balanceUnits !== GRANT - billing.usageUnits)
      failures.push(`the balance is ${billing.balanceUnits}, not ${GRANT} - ${billing.usageUnits}`);
    return {
      seconds: run.seconds,
      requests: total,
      loadavg: loadAverages,
      statuses,
      wrong,
      rssKib: { daemon: [before.daemon, after.daemon], gateway: [before.gateway, after.gateway] },
      daemonFds: [before.fds, after.fds],
      daemonVms: [before.vms, after.vms],
      billing,
      failures,
    };
  } finally {
    daemon.close();
    await gateway.stop();
    await rm(dir, { recursive: true, force: true });
  }
}
