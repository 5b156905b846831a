import { defineConfig } from "vitest/config";
import { testNodeFlags, timeScale } from "./gateway/testing/kvm-tier.js";
import { PlainCountReporter } from "./vitest.config.js";

/**
 * The KVM tier's TypeScript tests (*.kvm.test.ts): they run guests on a /dev/kvm, so only
 * scripts/kvm-tier.sh runs them (`vitest run --config vitest.kvm.config.ts`), natively or inside
 * its QEMU guest. Timeouts are multiplied by SANDFORK_TEST_TIME_SCALE (1 native, ~15 in QEMU).
 */

export default defineConfig({
  test: {
    include: ["**/*.kvm.test.ts"],
    exclude: ["**/node_modules/**"],
    testTimeout: 30_000 * timeScale,
    // beforeAll builds the python template's image and snapshot and starts the daemon.
    hookTimeout: 120_000 * timeScale,
    pool: "forks",
    execArgv: testNodeFlags,
    reporters: ["default", new PlainCountReporter("vitest-kvm")],
  },
});
