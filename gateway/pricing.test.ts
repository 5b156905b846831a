import { describe, expect, it } from "vitest";
import { costUnits, DEFAULT_PRICING, networkUnits, parsePricing, priceOf } from "./pricing.js";

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
    expect(priceOf(DEFAULT_PRICING, "anything")).toEqual({
      baseUnits: 1,
      unitsPerSecond: 10,
      unitsPerNetworkMib: 1,
    });
  });

  it("charges network bytes per MiB, by the byte, rounded up; free where no price is set", () => {
    const price = { baseUnits: 0, unitsPerSecond: 0, unitsPerNetworkMib: 3 };
    const MIB = 1024 * 1024;
    expect(networkUnits(price, 0)).toBe(0);
    expect(networkUnits(price, 1)).toBe(1);
    expect(networkUnits(price, MIB)).toBe(3);
    expect(networkUnits(price, MIB + 1)).toBe(4);
    expect(networkUnits(price, 10 * MIB - 1)).toBe(30);
    // Exact past 2^53 / 3 bytes, where bytes * price as a float would round.
    expect(networkUnits(price, 2 ** 50 + 1)).toBe(3 * 2 ** 30 + 1);
    expect(networkUnits({ baseUnits: 1, unitsPerSecond: 10 }, 50 * MIB)).toBe(0);
    const parsed = parsePricing(
      '{"templates":{"python":{"baseUnits":1,"unitsPerSecond":5,"unitsPerNetworkMib":2},"*":{"baseUnits":1,"unitsPerSecond":5}}}',
    );
    expect(priceOf(parsed, "python").unitsPerNetworkMib).toBe(2);
    expect(priceOf(parsed, "node").unitsPerNetworkMib).toBeUndefined();
    expect(() =>
      parsePricing(
        '{"templates":{"*":{"baseUnits":1,"unitsPerSecond":1,"unitsPerNetworkMib":-1}}}',
      ),
    ).toThrow(/unitsPerNetworkMib/);
  });
});
