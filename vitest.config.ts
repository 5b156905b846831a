import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["gateway/**/*.test.ts", "db/**/*.test.ts", "runtime/**/*.test.ts", "loadtest/**/*.test.ts"],
    // Each file owns a fresh database (Postgres) or an in-memory PGlite; the 2-core machine sets the pace.
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
  },
});
