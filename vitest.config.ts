import { defineConfig } from "vitest/config";
import type { Reporter, TestModule } from "vitest/node";

/**
 * Ends the run with one plain "vitest: N passed, N failed[, N skipped]" line that CI can read.
 * A test that did not run because a hook of its suite failed (e.g. no PostgreSQL server) counts
 * as failed, not skipped.
 */
export class PlainCountReporter implements Reporter {
  constructor(private readonly label = "vitest") {}

  onTestRunEnd(
    testModules: ReadonlyArray<TestModule>,
    unhandledErrors: ReadonlyArray<unknown>,
  ): void {
    let passed = 0;
    let failed = unhandledErrors.length;
    let skipped = 0;
    for (const module of testModules) {
      const tests = [...module.children.allTests()];
      if (module.state() === "failed" && tests.length === 0) failed++;
      for (const test of tests) {
        const state = test.result().state;
        if (state === "passed") passed++;
        else if (state === "failed" || test.parent.state() === "failed") failed++;
        else skipped++;
      }
    }
    console.log(
      `${this.label}: ${passed} passed, ${failed} failed${skipped > 0 ? `, ${skipped} skipped` : ""}`,
    );
  }
}

export default defineConfig({
  test: {
    include: [
      "client/**/*.test.ts",
      "clients/**/*.test.ts",
      "gateway/**/*.test.ts",
      "db/**/*.test.ts",
      "runtime/**/*.test.ts",
      "cluster/**/*.test.ts",
      "deploy/**/*.test.ts",
      "loadtest/**/*.test.ts",
      "scripts/**/*.test.ts",
    ],
    // *.kvm.test.ts need a /dev/kvm that runs guests: scripts/kvm-tier.sh runs them (vitest.kvm.config.ts).
    exclude: ["**/node_modules/**", "**/*.kvm.test.ts"],
    // Each file owns a fresh database (Postgres) or an in-memory PGlite; the 2-core machine sets the pace.
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    reporters: ["default", new PlainCountReporter()],
  },
});
