import { describe, expect, it } from "vitest";
import { ConcurrencyLimiter, RateLimiter, TokenExecutionCounter } from "./limits.js";
import { ProblemError } from "./problems.js";

function problemOf(fn: () => void): ProblemError {
  try {
    fn();
  } catch (error) {
    if (error instanceof ProblemError) return error;
    throw error;
  }
  throw new Error("expected a problem");
}

describe("RateLimiter", () => {
  it("allows a minute's budget, then refills at the per-minute rate", () => {
    let now = 0;
    const limiter = new RateLimiter(() => now);
    for (let i = 0; i < 6; i++) limiter.take("k", 6);
    const limited = problemOf(() => limiter.take("k", 6));
    expect(limited.slug).toBe("rate-limited");
    expect(limited.headers["retry-after"]).toBe("10");
    limiter.take("other", 6);
    now += 9_999;
    expect(problemOf(() => limiter.take("k", 6)).slug).toBe("rate-limited");
    now += 1;
    limiter.take("k", 6);
    expect(problemOf(() => limiter.take("k", 6)).slug).toBe("rate-limited");
  });
});

describe("ConcurrencyLimiter", () => {
  it("counts slots per key and frees each once", async () => {
    const limiter = new ConcurrencyLimiter();
    const a = await limiter.acquire("k", 2);
    const b = await limiter.acquire("k", 2);
    expect(problemOf(() => limiter.acquire("k", 2)).slug).toBe("concurrency-limit");
    await limiter.acquire("other", 2);
    a();
    a();
    expect(limiter.inFlightFor("k")).toBe(1);
    await limiter.acquire("k", 2);
    b();
    expect(limiter.inFlightFor("k")).toBe(1);
  });
});

describe("TokenExecutionCounter", () => {
  it("stops a token at its maximum, refunds executions that never started", () => {
    let now = 0;
    const counter = new TokenExecutionCounter(() => now);
    const expires = new Date(60_000);
    counter.consume("t", 2, expires);
    counter.consume("t", 2, expires);
    expect(problemOf(() => counter.consume("t", 2, expires)).slug).toBe("token-execution-limit");
    counter.refund("t");
    counter.consume("t", 2, expires);
    expect(problemOf(() => counter.consume("t", 2, expires)).slug).toBe("token-execution-limit");
    // Counts of expired tokens are dropped (an expired token cannot authenticate anyway).
    now = 120_000;
    counter.consume("t", 2, new Date(180_000));
  });
});
