// The soak on a loaded machine (loadtest/lib/soak.ts with `cpuHog`; `npm run soak:loaded` runs the
// same): a child spinning on every core at nice 0, as a busy neighbour, through 200 requests of the
// mixed kinds (completed, timed out, out of memory, crashed, flooded output) at concurrency 8.
// Every request must get its own status, not a runtime failure; nothing may leak; billing must
// reconcile. On the QEMU path (a one-vCPU guest some 13 times slower) 50 requests.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { soak } from "../loadtest/lib/soak.js";
import { templatesWithPrebuilt, timeScale } from "./testing/kvm-tier.js";

const REQUESTS = timeScale > 1 ? 50 : 200;

it(`${REQUESTS} mixed requests beside a CPU hog on every core: each answered with its own status, billing reconciles`, {
  timeout: 420_000 * timeScale,
}, async () => {
  const oomTimeoutMs = 30_000 * timeScale;
  const gatewayEnv = {
    SANDFORK_VMM_EXECUTE_GRACE_MS: String(5_000 * timeScale),
    SANDFORK_VMM_BOOT_TIMEOUT_MS: String(30_000 * timeScale),
    SANDFORK_MAX_TIMEOUT_MS: String(oomTimeoutMs),
  };
  const dir = await mkdtemp(join(tmpdir(), "sfk-soak-loaded-templates-"));
  try {
    const templatesDir = await templatesWithPrebuilt(dir, ["python"]);
    const report = await soak({
      seconds: 300 * timeScale,
      requests: REQUESTS,
      cpuHog: true,
      concurrency: 8,
      templatesDir,
      oomTimeoutMs,
      gatewayEnv,
      log: (line) => console.log(line),
    });
    console.log(`load average as the run ended: ${report.loadavg.join(", ")}`);
    console.log(JSON.stringify(report));
    expect(report.failures, JSON.stringify(report, null, 2)).toEqual([]);
    for (const kind of ["ok", "timeout", "oom", "crash", "flood"])
      expect(Object.keys(report.statuses[kind] ?? {}), kind).toHaveLength(1);
    expect(report.requests).toBeGreaterThanOrEqual(REQUESTS);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
