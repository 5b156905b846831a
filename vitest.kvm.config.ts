import { defineConfig } from "vitest/config";
import { testNodeFlags } from "./gateway/testing/gateway-process.js";
import { PlainCountReporter } from "./vitest.config.js";

/**
 * The KVM tier's TypeScript tests (*.kvm.test.ts): they run guests on a /dev/kvm, so only
 * scripts/kvm-tier.sh runs them (`vitest run --config vitest.kvm.config.ts`), natively or inside
 * its QEMU guest. Timeouts are multiplied by SANDFORK_TEST_TIME_SCALE (1 native, ~15 in QEMU).
 */
const scale = Number(process.env.SANDFORK_TEST_TIME_SCALE ?? "1");
if (!Number.isSafeInteger(scale) || scale < 1) throw new Error(`SANDFORK_TEST_TIME_SCALE must be a whole number >= 1, got ${process.env.SANDFORK_TEST_TIME_SCALE}`);

export default defineConfig({
  test: {
    include: ["**/*.kvm.test.ts"],
    exclude: ["**/node_modules/**"],
    testTimeout: 30_000 * scale,
    // beforeAll builds the python template's image and snapshot and starts the daemon.
    hookTimeout: 120_000 * scale,
    pool: "forks",
    execArgv: testNodeFlags,
    reporters: ["default", new PlainCountReporter("vitest-kvm")],
  },
});
