// What the KVM tier (scripts/kvm-tier.sh) tells the TypeScript tests that run guests about its
// path, from the environment it sets: read once here for every *.kvm.test.ts and their config.
import { mkdir, symlink } from "node:fs/promises";
import { join } from "node:path";
import type { ExecutionLimits } from "../config.js";

/**
 * SANDFORK_TEST_TIME_SCALE: how much slower than native this path runs guests (1 native, ~15
 * in the QEMU guest); the tests' timeouts and waits are multiplied by it.
 */
export const timeScale = Number(process.env.SANDFORK_TEST_TIME_SCALE ?? "1");
if (!Number.isSafeInteger(timeScale) || timeScale < 1)
  throw new Error(
    `SANDFORK_TEST_TIME_SCALE must be a whole number >= 1, got ${process.env.SANDFORK_TEST_TIME_SCALE}`,
  );

/**
 * SANDFORK_TEST_NODE_FLAGS: more `node` flags for the test workers and the gateway processes
 * start with startGatewayProcess. The KVM tier's QEMU path sets --liftoff-only: V8's
 * optimizing wasm tier-up compiles PGlite's Postgres again in the background, which under QEMU's
 * software CPU doubles the time a PGlite database takes to open (~75 s against ~32 s).
 */
export const testNodeFlags = (process.env.SANDFORK_TEST_NODE_FLAGS ?? "")
  .split(/\s+/)
  .filter((flag) => flag !== "");

/**
 * The execution limits of a gateway a KVM test starts (and, through daemonMaxima, its daemon's
 * maxima): 5 s by default and at most 30 s, scaled with the path; 256 MiB, at most 2 GiB; 64
 * processes.
 */
export const kvmExecutionLimits: ExecutionLimits = {
  defaultTimeoutMs: 5_000 * timeScale,
  maxTimeoutMs: 30_000 * timeScale,
  defaultMemoryMb: 256,
  maxMemoryMb: 2_048,
  maxProcesses: 64,
};

/**
 * The daemon's ready timeout for a gateway a KVM test starts (SANDFORK_VMM_READY_TIMEOUT_MS):
 * the default 15 s, scaled with the path, since loading its templates runs guests.
 */
export const scaledDaemonReadyEnv = { SANDFORK_VMM_READY_TIMEOUT_MS: String(15_000 * timeScale) };

/**
 * `dir`/templates for a gateway or runtime a KVM test starts, with the templates the KVM tier
 * built once linked in (SANDFORK_TEST_PYTHON_TEMPLATE_DIR, SANDFORK_TEST_NODE_TEMPLATE_DIR: start-up
 * finds them up to date); those it did not build are built there at start, as without the tier.
 */
export async function templatesWithPrebuilt(
  dir: string,
  names: readonly ("python" | "node")[],
): Promise<string> {
  const templates = join(dir, "templates");
  await mkdir(templates, { recursive: true });
  for (const name of names) {
    const prebuilt = process.env[`SANDFORK_TEST_${name.toUpperCase()}_TEMPLATE_DIR`];
    if (prebuilt !== undefined && prebuilt !== "") await symlink(prebuilt, join(templates, name));
  }
  return templates;
}
