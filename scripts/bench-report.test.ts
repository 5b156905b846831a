import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  BENCHES,
  duration,
  type Machine,
  pair,
  parseReports,
  regenerate,
  replaceRegions,
} from "./bench-report.js";

const machine: Machine = {
  kernel: "6.1.0-test",
  cpus: 2,
  kvm: "`kvm_intel`",
  loadavg: [0.5, 0.4, 0.3],
};

// Shaped as each command's --json output (see the to_json functions in native-vmm/src and loadtest/run.ts).
const samples = new Map([
  [
    "syscalls",
    [
      {
        calls: 100000,
        repetitions: 5,
        vm: { syscall_ns: 31912.4, clock_gettime_ns: 24.6 },
        native: { syscall_ns: 123.0, clock_gettime_ns: 21.4 },
        vm_clock_gettime_exits: 0,
      },
    ],
  ],
  [
    "threads",
    [
      {
        handoffs: 10000,
        repetitions: 3,
        vm_us_per_handoff_p50: 286.12,
        native_us_per_handoff_p50: 13.5,
        switches_per_handoff: 1.0,
        syscalls_per_handoff: 2.05,
        preemptions: 0,
      },
    ],
  ],
  [
    "run",
    [
      {
        command: "/usr/bin/python3.11 -c pass",
        iterations: 50,
        vm: { p50_us: 40012.3, p99_us: 52000.0, min_us: 38000.0, max_us: 60000.0 },
        native: { p50_us: 7400.0, p99_us: 9100.0, min_us: 7000.0, max_us: 9900.0 },
        syscalls_per_run: 690,
        exits_per_run: 1691,
      },
    ],
  ],
  [
    "net",
    [
      {
        connects: 200,
        mib: 64,
        repetitions: 3,
        vm_connect_p50_us: 111.7,
        native_connect_p50_us: 15.6,
        vm_download_mib_s: 660.4,
        native_download_mib_s: 1374.5,
        vm_upload_mib_s: 425.6,
        native_upload_mib_s: 755.2,
      },
    ],
  ],
  [
    "processes",
    [
      {
        repetitions: 20,
        workloads: {
          fork_exec_wait: { vm_ms: 19.7, native_ms: 3.97 },
          pool_map_1000: { vm_ms: null, native_ms: 21.2 },
        },
      },
    ],
  ],
  [
    "exec",
    [
      {
        template: "python",
        code: "print(1+1)",
        native_command: "/usr/bin/python3.11 -c 'print(1+1)'",
        iterations: 1000,
        pool_size: 4,
        fresh_fork_us: { p50: 328, p99: 996 },
        fresh_fork_cpu_us: { ready: 200, with_teardown: 300 },
        pooled_exec_us: { p50: 1640, p99: 2770 },
        native_spawn_us: { p50: 9560, p99: 12000 },
        native_over_pooled_p50: 25.13,
        vmm_cpu_us_per_exec: 437.2,
        daemon_exec_per_s: { "1": 2000 },
        rss_per_idle_vm_kib: { "100": 300 },
        host_memory_per_idle_vm_kib: { "100": 310 },
        cgroup_memory_per_idle_vm_kib: { "100": 218.4, "1000": 213.1 },
        warm_vm_copied_kib: 1000,
        isolation_ok: true,
        isolation_error: null,
      },
    ],
  ],
  [
    "gaps",
    [
      {
        gaps: {
          pglite: [
            {
              gap_ms: 0,
              requests: 100,
              p50_ms: 2.03,
              p99_ms: 27.6,
              phases: {
                auth: 0.05,
                hold: 0.01,
                vm: 0.4,
                runtime_rest: 0.45,
                record: 0.07,
                rest: 0.3,
                outside_server_span: 0.4,
              },
              baseline: { p50_ms: 1.1 },
              http_floor: { p50_ms: 0.1 },
            },
            {
              gap_ms: 1000,
              requests: 100,
              p50_ms: 2.91,
              p99_ms: 22.5,
              phases: null,
              baseline: { p50_ms: 1.5 },
              http_floor: { p50_ms: 0.55 },
            },
          ],
        },
      },
    ],
  ],
  [
    "loadtest",
    [
      {
        executions: {
          pglite: {
            "1": { p50_ms: 1.5, gateway_cpu_ms_per_exec: 0.66, per_s: 600 },
            "16": { p50_ms: 9, gateway_cpu_ms_per_exec: 0.415, per_s: 1708.2 },
          },
          postgres: {
            "1": { p50_ms: 2.5, gateway_cpu_ms_per_exec: 0.795, per_s: 400 },
            "16": { p50_ms: 10, gateway_cpu_ms_per_exec: 0.36, per_s: 1562 },
          },
        },
        daemon: { pglite: { "1": { p50_ms: 0.92 } }, postgres: { "1": { p50_ms: 0.92 } } },
        floors_at_1: {
          pglite: { then_a_plain_request: { p50_ms: 1.22 }, then_its_record: null },
          postgres: { then_a_plain_request: { p50_ms: 1.15 }, then_its_record: { p50_ms: 1.68 } },
        },
        hello_per_s: 18028,
      },
    ],
  ],
]);

const doc = [
  "# Benchmarks",
  "",
  "Hand-written text   with odd  spacing, kept as it is.",
  "",
  ...BENCHES.flatMap((b) => [
    `## ${b.name}`,
    "",
    `Prose about ${b.name}.`,
    "",
    `<!-- bench:${b.name} -->`,
    "old figures",
    `<!-- /bench:${b.name} -->`,
    "",
    `After ${b.name}.`,
    "",
  ]),
  "## unmarked",
  "",
  "| a | b |",
  "| --- | --- |",
  "| 1 | 2 |",
  "",
].join("\n");

/** The text outside every region. */
const outside = (markdown: string) =>
  markdown.replace(/<!-- bench:([a-z]+) -->\n[\s\S]*?<!-- \/bench:\1 -->/g, "<region $1>");

describe("bench:report", () => {
  it("rewrites every marked region from its JSON and nothing else", () => {
    const out = regenerate(doc, samples, machine);
    expect(outside(out)).toBe(outside(doc));
    expect(out).not.toContain("old figures");
    for (const bench of BENCHES) {
      const region = out
        .split(`<!-- bench:${bench.name} -->\n`)[1]!
        .split(`<!-- /bench:${bench.name} -->`)[0]!;
      expect(region.startsWith(["```sh", ...bench.commands, "```", ""].join("\n"))).toBe(true);
      expect(region).toContain(
        "Machine: Linux 6.1.0-test, 2 cores, /dev/kvm from `kvm_intel`; load average 0.5, 0.4, 0.3 when the run began.",
      );
    }
    expect(out).toContain("| `getppid()` round trip | 31.9 µs | 123 ns |");
    expect(out).toContain("| vDSO `clock_gettime` | 24.6 ns | 21.4 ns |");
    expect(out).toContain("| clock reads that left the VM | 0 of 100,000 | |");
    expect(out).toContain("| p50 | 286 µs | 13.5 µs |");
    expect(out).toContain("| system calls | 2.05 | |");
    expect(out).toContain("| in a fresh VM | 40 ms | 52 ms |");
    expect(out).toContain("| natively (baseline) | 7.4 ms | 9.1 ms |");
    expect(out).toContain("690 system calls and 1,691 VM exits a run");
    expect(out).toContain("| fork, execve `/bin/true`, wait | 19.7 ms | 3.97 ms | 4.96x |");
    expect(out).toContain("| connect p50 (200 connects) | 112 µs | 15.6 µs | +96.1 µs |");
    expect(out).toContain("| download, 64 MiB | 660 MiB/s | 1,375 MiB/s | 48% |");
    expect(out).toContain("| `multiprocessing.Pool(4).map`, 1,000 tasks | fails | 21.2 ms | |");
    expect(out).toContain(
      "| python | 328 / 996 µs | 1.64 / 2.77 ms | 9.56 ms | 25.1x | 437 µs | 218 / 213 KiB | kept nothing |",
    );
    expect(out).toContain("| PGlite | 0.66 / 0.415 ms | 1,708 | +0.58 ms | +0.30 ms | |");
    expect(out).toContain(
      "| PostgreSQL | 0.795 / 0.36 ms | 1,562 | +1.58 ms | +0.23 ms | +0.76 ms |",
    );
    expect(out).toContain("Plain Hono hello at concurrency 16 in the same run: 18,028 requests/s.");
    expect(out).toContain(
      "| PGlite | none | 2.03 / 27.60 | +0.00 | 1.10 (+0.00) | 0.10 (+0.00) | 0.05 / 0.01 / 0.40 / 0.45 / 0.07 / 0.30 / 0.40 |",
    );
    expect(out).toContain(
      "| PGlite | 1,000 ms | 2.91 / 22.50 | +0.88 | 1.50 (+0.40) | 0.55 (+0.45) | |",
    );
  });

  it("leaves a region without JSON as it is", () => {
    const out = regenerate(doc, new Map([["syscalls", samples.get("syscalls")!]]), machine);
    expect(out.match(/old figures/g)).toHaveLength(BENCHES.length - 1);
    expect(regenerate(doc, new Map(), machine)).toBe(doc);
  });

  it("refuses a region it cannot find or that is not closed", () => {
    expect(() => replaceRegions("no regions\n", new Map([["exec", "x"]]))).toThrow(
      /no region bench:exec/,
    );
    expect(() => replaceRegions("<!-- bench:exec -->\nx\n", new Map())).toThrow(/not closed/);
    expect(() =>
      replaceRegions("<!-- bench:exec -->\nx\n<!-- /bench:run -->\n", new Map()),
    ).toThrow(/closed by/);
  });

  it("reads one JSON object a line and skips log lines", () => {
    expect(parseReports('building...\n{"a":1}\n\n{"a":2}\n')).toEqual([{ a: 1 }, { a: 2 }]);
  });

  it("prints durations with three significant figures", () => {
    expect([
      duration(123),
      duration(31912),
      duration(9_560_000),
      duration(209_500_000),
      duration(1_500_000_000),
    ]).toEqual(["123 ns", "31.9 µs", "9.56 ms", "210 ms", "1.5 s"]);
    expect([pair(328e3, 996e3), pair(515e3, 4_673e3)]).toEqual([
      "328 / 996 µs",
      "515 µs / 4.67 ms",
    ]);
  });

  it("has a region in docs/benchmarks.md for every benchmark it renders", () => {
    const text = readFileSync(new URL("../docs/benchmarks.md", import.meta.url), "utf8");
    for (const bench of BENCHES) expect(text).toContain(`<!-- bench:${bench.name} -->`);
    expect(regenerate(text, new Map(), machine)).toBe(text);
  });
});
