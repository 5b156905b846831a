// `npm run bench:report -- --from DIR | --run [--only a,b] [--keep DIR] [--doc FILE]`:
// regenerates the marked regions of docs/benchmarks.md from the benchmarks' --json output.
//
// Each generated region sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` and holds
// the command that printed the figures, the machine they were measured on and the table with its
// same-run baseline. Only those regions change; a region whose JSON is absent is left as it is.
// --from DIR reads DIR/NAME.json (one JSON object a line: `bench exec` writes one a template) and
// DIR/machine.json (else this machine is described). --run runs each benchmark's commands, exactly
// as the regions show them, from the repository's root, keeping their output in --keep DIR.
import { execFileSync, spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

export interface Machine {
  /** `uname -r`. */
  kernel: string;
  /** `nproc`. */
  cpus: number;
  /** Which KVM module serves /dev/kvm (kvm_intel, kvm_amd, kvm_pvm), or why there is none. */
  kvm: string;
  /** The 1, 5 and 15 minute load averages when the run began. */
  loadavg: number[];
}

// biome-ignore lint/suspicious/noExplicitAny: a benchmark's --json output, read by shape where each table uses it
type Json = Record<string, any>;

export interface Bench {
  name: string;
  /** The shell lines --run runs in turn, shown in the region as they are run. */
  commands: string[];
  /** The table (and any line under it) from the command's JSON objects, one per line of output. */
  render(reports: Json[]): string;
}

const VMM = "native-vmm/target/release/sandfork-vmm";

// Durations with three significant figures in the unit that keeps them at 1 or more.
export function duration(ns: number): string {
  const units: [number, string][] = [
    [1e9, "s"],
    [1e6, "ms"],
    [1e3, "µs"],
    [1, "ns"],
  ];
  const [scale, unit] = units.find(([s]) => Math.abs(ns) >= s) ?? [1, "ns"];
  return `${significant(ns / scale)} ${unit}`;
}

/** Two durations, their unit once when they share it: "328 / 996 µs", "515 µs / 4.67 ms". */
export function pair(aNs: number, bNs: number): string {
  const [a, b] = [duration(aNs), duration(bNs)];
  const [aValue, aUnit] = a.split(" ");
  return aUnit === b.split(" ")[1] ? `${aValue} / ${b}` : `${a} / ${b}`;
}

function significant(n: number): string {
  if (n === 0) return "0";
  const digits = Math.max(0, 2 - Math.floor(Math.log10(Math.abs(n))));
  return Number(n.toFixed(digits)).toLocaleString("en-US", { maximumFractionDigits: digits });
}

const grouped = (n: number) => Math.round(n).toLocaleString("en-US");
const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;

function table(header: string[], align: ("l" | "r")[], rows: string[][]): string {
  const line = (cells: string[]) => `|${cells.map((c) => (c === "" ? " " : ` ${c} `)).join("|")}|`;
  return [
    line(header),
    line(align.map((a) => (a === "r" ? "---:" : "---"))),
    ...rows.map(line),
  ].join("\n");
}

const PROCESS_WORKLOADS: Record<string, string> = {
  fork_exec_wait: "fork, execve `/bin/true`, wait",
  subprocess_run: '`subprocess.run(["/bin/true"])`',
  fork_100mib: "fork + `_exit` + wait, holding 100 MiB",
  pipeline_1mib: "`head -c 1M /dev/zero \\| tr \\| cat \\| wc -c`",
  pool_map_1000: "`multiprocessing.Pool(4).map`, 1,000 tasks",
};

const DATABASES: Record<string, string> = { pglite: "PGlite", postgres: "PostgreSQL" };

/** The benchmarks with a generated region, in the order --run runs them. */
export const BENCHES: Bench[] = [
  {
    name: "loadtest",
    commands: ["npm run loadtest -- --requests 2000 --concurrency 1,4,16 --json"],
    render([r]) {
      const rows = Object.entries(r?.executions as Record<string, Record<string, Json>>).map(
        ([db, byConcurrency]) => {
          const alone = r?.daemon?.[db]?.["1"]?.p50_ms as number | undefined;
          const floors = r?.floors_at_1?.[db] as Json | undefined;
          const over = (p50: number | undefined) =>
            alone === undefined || p50 === undefined ? "" : `+${(p50 - alone).toFixed(2)} ms`;
          const [one, sixteen] = [byConcurrency["1"], byConcurrency["16"]];
          return [
            DATABASES[db] ?? db,
            `${one?.gateway_cpu_ms_per_exec ?? "-"} / ${sixteen?.gateway_cpu_ms_per_exec ?? "-"} ms`,
            sixteen === undefined ? "" : grouped(sixteen.per_s),
            over(one?.p50_ms),
            over(floors?.then_a_plain_request?.p50_ms),
            over(floors?.then_its_record?.p50_ms ?? undefined),
          ];
        },
      );
      return [
        `Plain Hono hello at concurrency 16 in the same run: ${grouped(r?.hello_per_s)} requests/s.`,
        "",
        table(
          [
            "database",
            "gateway CPU per execution, c=1 / c=16",
            "executions/s, c=16",
            "p50 over the daemon alone, c=1",
            "floor: a plain Hono request",
            "floor: the record committed",
          ],
          ["l", "r", "r", "r", "r", "r"],
          rows,
        ),
      ].join("\n");
    },
  },
  {
    name: "gaps",
    commands: ["npm run loadtest -- --gap-ms 0,15,100,1000,3000 --requests 40 --json"],
    render([r]) {
      const ms = (n: number) => `${n.toFixed(2)}`;
      const rows = Object.entries(r?.gaps as Record<string, Json[]>).flatMap(([db, gaps]) => {
        const first = gaps.find((g) => g.gap_ms === 0);
        const over = (n: number, of: number | undefined) =>
          of === undefined ? "" : `${n - of >= 0 ? "+" : ""}${ms(n - of)}`;
        return gaps.map((g) => {
          const p = g.phases as Record<string, number> | null;
          return [
            DATABASES[db] ?? db,
            g.gap_ms === 0 ? "none" : `${grouped(g.gap_ms)} ms`,
            `${ms(g.p50_ms)} / ${ms(g.p99_ms)}`,
            over(g.p50_ms, first?.p50_ms),
            `${ms(g.baseline.p50_ms)} (${over(g.baseline.p50_ms, first?.baseline.p50_ms)})`,
            g.http_floor === undefined
              ? ""
              : `${ms(g.http_floor.p50_ms)} (${over(g.http_floor.p50_ms, first?.http_floor?.p50_ms)})`,
            p === null
              ? ""
              : ["auth", "hold", "vm", "runtime_rest", "record", "rest", "outside_server_span"]
                  .map((phase) => ms(p[phase] ?? Number.NaN))
                  .join(" / "),
          ];
        });
      });
      return [
        `Each p50 over ${r?.gaps?.pglite?.[0]?.requests ?? r?.gaps?.postgres?.[0]?.requests} calls a gap, in ms; the baseline is the daemon alone (on PostgreSQL then its record committed on the server) after the same gap, the HTTP floor a GET of a plain Hono server after the same gap.`,
        "",
        table(
          [
            "database",
            "idle before each call",
            "p50 / p99",
            "p50 over back to back",
            "baseline p50 (over back to back)",
            "HTTP floor p50 (over back to back)",
            "auth / hold / VM / runtime rest / record / gateway rest / outside the server span",
          ],
          ["l", "r", "r", "r", "r", "r", "r"],
          rows,
        ),
      ].join("\n");
    },
  },
  {
    name: "exec",
    commands: [
      `${VMM} bench exec --template .sandfork/templates/python --iterations 1000 --pool-size 4 --json`,
    ],
    render(reports) {
      const rows = reports.map((r) => {
        const memory = r.cgroup_memory_per_idle_vm_kib as Record<string, number>;
        const kib = (n: string) =>
          memory[n] === undefined ? "-" : Math.round(memory[n]).toString();
        const isolation =
          r.isolation_ok === null
            ? "not checked"
            : r.isolation_ok
              ? "kept nothing"
              : `failed: ${r.isolation_error}`;
        return [
          r.template,
          pair(r.fresh_fork_us.p50 * 1e3, r.fresh_fork_us.p99 * 1e3),
          pair(r.pooled_exec_us.p50 * 1e3, r.pooled_exec_us.p99 * 1e3),
          duration(r.native_spawn_us.p50 * 1e3),
          `${r.native_over_pooled_p50.toFixed(1)}x`,
          duration(r.vmm_cpu_us_per_exec * 1e3),
          `${kib("100")} / ${kib("1000")} KiB`,
          isolation,
        ];
      });
      return table(
        [
          "template",
          "fresh fork p50 / p99",
          "pooled p50 / p99",
          "native spawn p50 (baseline)",
          "native / pooled",
          "VMM CPU per pooled execution",
          "memory per idle VM, 100 / 1000 alive",
          "a reset VM",
        ],
        ["l", "l", "l", "l", "r", "l", "l", "l"],
        rows,
      );
    },
  },
  {
    name: "run",
    commands: [`${VMM} bench run --image .sandfork/templates/python --json`],
    render([r]) {
      const us = (l: Json) => [duration(l.p50_us * 1e3), duration(l.p99_us * 1e3)];
      return [
        table(
          ["", "p50", "p99"],
          ["l", "r", "r"],
          [
            ["in a fresh VM", ...us(r?.vm)],
            ["natively (baseline)", ...us(r?.native)],
          ],
        ),
        "",
        `${r?.iterations} runs of each; in the VM ${grouped(r?.syscalls_per_run)} system calls and ${grouped(r?.exits_per_run)} VM exits a run.`,
      ].join("\n");
    },
  },
  {
    name: "syscalls",
    commands: [`${VMM} bench syscalls --json`],
    render([r]) {
      return table(
        ["per call", "in the guest", "natively (baseline)"],
        ["l", "r", "r"],
        [
          ["`getppid()` round trip", duration(r?.vm.syscall_ns), duration(r?.native.syscall_ns)],
          [
            "vDSO `clock_gettime`",
            duration(r?.vm.clock_gettime_ns),
            duration(r?.native.clock_gettime_ns),
          ],
          [
            "clock reads that left the VM",
            `${grouped(r?.vm_clock_gettime_exits)} of ${grouped(r?.calls)}`,
            "",
          ],
        ],
      );
    },
  },
  {
    name: "threads",
    commands: [`${VMM} bench threads --image .sandfork/templates/python --repetitions 3 --json`],
    render([r]) {
      return table(
        ["per hand-off", "in the guest", "natively (baseline)"],
        ["l", "r", "r"],
        [
          [
            "p50",
            duration(r?.vm_us_per_handoff_p50 * 1e3),
            duration(r?.native_us_per_handoff_p50 * 1e3),
          ],
          ["system calls", String(r?.syscalls_per_handoff), ""],
          ["thread switches", String(r?.switches_per_handoff), ""],
        ],
      );
    },
  },
  {
    name: "net",
    commands: [
      `${VMM} image build --manifest templates/python/image.json --out /tmp/python-image`,
      `${VMM} bench net --image /tmp/python-image --json`,
    ],
    render([r]) {
      const percent = (vm: number, native: number) => `${Math.round((100 * vm) / native)}%`;
      return table(
        ["", "in the guest", "natively (baseline)", "guest vs native"],
        ["l", "r", "r", "r"],
        [
          [
            `connect p50 (${grouped(r?.connects)} connects)`,
            duration(r?.vm_connect_p50_us * 1e3),
            duration(r?.native_connect_p50_us * 1e3),
            `+${duration((r?.vm_connect_p50_us - r?.native_connect_p50_us) * 1e3)}`,
          ],
          [
            `download, ${r?.mib} MiB`,
            `${significant(r?.vm_download_mib_s)} MiB/s`,
            `${significant(r?.native_download_mib_s)} MiB/s`,
            percent(r?.vm_download_mib_s, r?.native_download_mib_s),
          ],
          [
            `upload, ${r?.mib} MiB`,
            `${significant(r?.vm_upload_mib_s)} MiB/s`,
            `${significant(r?.native_upload_mib_s)} MiB/s`,
            percent(r?.vm_upload_mib_s, r?.native_upload_mib_s),
          ],
        ],
      );
    },
  },
  {
    name: "processes",
    commands: [
      `${VMM} image build --manifest templates/python/image.json --out /tmp/python-image`,
      `${VMM} bench processes --image /tmp/python-image --repetitions 20 --json`,
    ],
    render([r]) {
      const rows = Object.entries(
        r?.workloads as Record<string, { vm_ms: number | null; native_ms: number | null }>,
      ).map(([name, { vm_ms, native_ms }]) => [
        PROCESS_WORKLOADS[name] ?? name,
        vm_ms === null ? "fails" : duration(vm_ms * 1e6),
        native_ms === null ? "fails" : duration(native_ms * 1e6),
        vm_ms === null || native_ms === null ? "" : ratio(vm_ms, native_ms),
      ]);
      return table(
        ["workload", "in the guest", "natively (baseline)", "ratio"],
        ["l", "r", "r", "r"],
        rows,
      );
    },
  },
];

export function machineLine(m: Machine): string {
  return `Machine: Linux ${m.kernel}, ${m.cpus} cores, /dev/kvm from ${m.kvm}; load average ${m.loadavg.join(", ")} when the run began.`;
}

/** The region's text: the command, the machine, the table. */
export function renderRegion(bench: Bench, reports: Json[], machine: Machine): string {
  return [
    "```sh",
    ...bench.commands,
    "```",
    "",
    machineLine(machine),
    "",
    bench.render(reports),
  ].join("\n");
}

/**
 * Replaces the body of each `<!-- bench:NAME -->` … `<!-- /bench:NAME -->` region named in
 * `bodies`; everything else is returned byte for byte. Throws on a region opened twice or not
 * closed, and on a body for a region the document lacks.
 */
export function replaceRegions(markdown: string, bodies: Map<string, string>): string {
  const seen = new Set<string>();
  const out = markdown.replace(
    /<!-- bench:([a-z-]+) -->\n([\s\S]*?)<!-- \/bench:([a-z-]+) -->/g,
    (whole, open: string, _body, close: string) => {
      if (open !== close) throw new Error(`region bench:${open} is closed by /bench:${close}`);
      if (seen.has(open)) throw new Error(`region bench:${open} appears twice`);
      seen.add(open);
      const body = bodies.get(open);
      return body === undefined
        ? whole
        : `<!-- bench:${open} -->\n${body}\n<!-- /bench:${open} -->`;
    },
  );
  for (const name of bodies.keys())
    if (!seen.has(name)) throw new Error(`no region bench:${name} in the document`);
  const opened = (markdown.match(/<!-- bench:[a-z-]+ -->/g) ?? []).length;
  if (opened !== seen.size) throw new Error("a bench region is not closed");
  return out;
}

/** One JSON object a non-empty line (a benchmark's log lines on stdout are skipped). */
export function parseReports(text: string): Json[] {
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Json);
}

/** This machine: `uname -r`, `nproc`, the KVM module loaded (/sys/module), the load average. */
export function describeMachine(): Machine {
  const kernel = execFileSync("uname", ["-r"], { encoding: "utf8" }).trim();
  const modules = existsSync("/sys/module") ? readdirSync("/sys/module") : [];
  const flavour = ["kvm_pvm", "kvm_intel", "kvm_amd"].filter((m) => modules.includes(m));
  const kvm = !existsSync("/dev/kvm")
    ? "no /dev/kvm"
    : flavour.length > 0
      ? flavour.map((f) => `\`${f}\``).join(", ")
      : "`kvm`";
  return { kernel, cpus: cpus().length, kvm, loadavg: loadavg().map((l) => Number(l.toFixed(2))) };
}

/** Renders every bench with JSON in `reports` into `markdown`. */
export function regenerate(
  markdown: string,
  reports: Map<string, Json[]>,
  machine: Machine,
): string {
  const bodies = new Map<string, string>();
  for (const bench of BENCHES) {
    const r = reports.get(bench.name);
    if (r !== undefined && r.length > 0) bodies.set(bench.name, renderRegion(bench, r, machine));
  }
  return replaceRegions(markdown, bodies);
}

function readFrom(dir: string, names: string[]): Map<string, Json[]> {
  const reports = new Map<string, Json[]>();
  for (const name of names) {
    const file = join(dir, `${name}.json`);
    if (existsSync(file)) reports.set(name, parseReports(readFileSync(file, "utf8")));
  }
  return reports;
}

function runBenches(root: string, dir: string, names: string[]): void {
  writeFileSync(join(dir, "machine.json"), `${JSON.stringify(describeMachine())}\n`);
  for (const bench of BENCHES.filter((b) => names.includes(b.name))) {
    let stdout = "";
    for (const command of bench.commands) {
      process.stderr.write(`bench:report: ${command}\n`);
      const result = spawnSync("bash", ["-c", command], {
        cwd: root,
        encoding: "utf8",
        stdio: ["ignore", "pipe", "inherit"],
        maxBuffer: 64 << 20,
      });
      if (result.status !== 0)
        throw new Error(`${command} failed (${result.signal ?? `exit code ${result.status}`})`);
      stdout = result.stdout;
    }
    writeFileSync(join(dir, `${bench.name}.json`), stdout);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      from: { type: "string" },
      run: { type: "boolean", default: false },
      only: { type: "string" },
      keep: { type: "string" },
      doc: { type: "string" },
      help: { type: "boolean", default: false },
    },
  });
  const usage =
    "usage: npm run bench:report -- --from DIR | --run [--keep DIR]  [--only exec,run,...] [--doc docs/benchmarks.md]";
  if (values.help || (values.from === undefined) === !values.run) {
    console.error(usage);
    process.exit(values.help ? 0 : 2);
  }
  const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
  const doc = resolve(root, values.doc ?? "docs/benchmarks.md");
  const known = BENCHES.map((b) => b.name);
  const names = values.only === undefined ? known : values.only.split(",");
  for (const n of names)
    if (!known.includes(n)) throw new Error(`unknown benchmark ${n} (known: ${known.join(", ")})`);
  const dir = values.run
    ? (values.keep ?? mkdtempSync(join(tmpdir(), "bench-report-")))
    : (values.from ?? "");
  if (values.run) {
    mkdirSync(dir, { recursive: true });
    runBenches(root, dir, names);
  }
  const machineFile = join(dir, "machine.json");
  const machine = existsSync(machineFile)
    ? (JSON.parse(readFileSync(machineFile, "utf8")) as Machine)
    : describeMachine();
  const reports = readFrom(dir, names);
  writeFileSync(doc, regenerate(readFileSync(doc, "utf8"), reports, machine));
  console.log(
    `bench:report: regenerated ${[...reports.keys()].join(", ") || "nothing"} in ${doc} from ${dir}`,
  );
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await main();
}
