// A short soak in the KVM tier (loadtest/lib/soak.ts; `npm run soak` runs the 2-minute one): the
// gateway process with its supervised, confined daemon under a mixed load (completed, timed out,
// out of memory, crashed, flooded output) at concurrency 8. Every request must get its status;
// RSS, the daemon's descriptors and VMs must not grow; billing must reconcile.
import { expect, it } from "vitest";
import { soak } from "../loadtest/lib/soak.js";
import { timeScale } from "./testing/kvm-tier.js";


it("a mixed load at concurrency 8: every request answered as expected, nothing leaks, billing reconciles", { timeout: 240_000 * timeScale }, async () => {
  // On a slower path the daemon queues the load's executions longer, and boots take longer.
  const gatewayEnv = { SANDFORK_VMM_EXECUTE_GRACE_MS: String(5_000 * timeScale), SANDFORK_VMM_BOOT_TIMEOUT_MS: String(30_000 * timeScale) };
  const report = await soak({ seconds: 10, concurrency: 8, gatewayEnv, log: (line) => console.log(line) });
  console.log(JSON.stringify(report));
  expect(report.failures, JSON.stringify(report, null, 2)).toEqual([]);
  for (const kind of ["ok", "timeout", "oom", "crash", "flood"]) expect(Object.keys(report.statuses[kind] ?? {}), kind).toHaveLength(1);
  expect(report.requests).toBeGreaterThan(25);
});
