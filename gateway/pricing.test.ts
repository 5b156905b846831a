import { describe, expect, it } from "vitest";
import { costUnits, DEFAULT_PRICING, parsePricing, priceOf } from "./pricing.js";

describe("pricing", () => {
  it("charges base units plus per-second units by the millisecond, rounded up to whole units", () => {
    const price = { baseUnits: 2, unitsPerSecond: 10 };
    expect(costUnits(price, 0)).toBe(2);
    expect(costUnits(price, 1)).toBe(3);
    expect(costUnits(price, 100)).toBe(3);
    expect(costUnits(price, 101)).toBe(4);
    expect(costUnits(price, 152.4)).toBe(4);
    expect(costUnits(price, 30_000)).toBe(302);
    expect(Number.isInteger(costUnits({ baseUnits: 1, unitsPerSecond: 7 }, 333.3))).toBe(true);
  });

  it("parses per-template prices with a fallback and refuses fractions", () => {
    const pricing = parsePricing(
      '{"unitName":"mc","templates":{"python":{"baseUnits":1,"unitsPerSecond":5},"*":{"baseUnits":3,"unitsPerSecond":0}}}',
    );
    expect(pricing.unitName).toBe("mc");
    expect(priceOf(pricing, "python")).toEqual({ baseUnits: 1, unitsPerSecond: 5 });
    expect(priceOf(pricing, "node")).toEqual({ baseUnits: 3, unitsPerSecond: 0 });
    expect(() =>
      parsePricing('{"templates":{"python":{"baseUnits":0.5,"unitsPerSecond":1}}}'),
    ).toThrow(/integer/);
    expect(() => priceOf(parsePricing('{"templates":{}}'), "python")).toThrow(/no price/);
    expect(priceOf(DEFAULT_PRICING, "anything")).toEqual({ baseUnits: 1, unitsPerSecond: 10 });
  });
});
