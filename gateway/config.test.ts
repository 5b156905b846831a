import { expect, it } from "vitest";
import { loadConfig } from "./config.js";

it("SANDFORK_GATEWAY_NICE: unset leaves the event loop's nice value; a nice value from -20 to 19 or a clear error", () => {
  expect(loadConfig({}).eventLoopNice).toBeUndefined();
  expect(loadConfig({ SANDFORK_GATEWAY_NICE: "" }).eventLoopNice).toBeUndefined();
  expect(loadConfig({ SANDFORK_GATEWAY_NICE: "-10" }).eventLoopNice).toBe(-10);
  expect(loadConfig({ SANDFORK_GATEWAY_NICE: "19" }).eventLoopNice).toBe(19);
  for (const wrong of ["-21", "20", "1.5", "high"])
    expect(() => loadConfig({ SANDFORK_GATEWAY_NICE: wrong }), wrong).toThrow(
      /SANDFORK_GATEWAY_NICE must be an integer from -20 to 19/,
    );
});

it("SANDFORK_GATEWAY_REALTIME_PRIORITY: unset is not real-time; a priority from 1 to 99 or a clear error", () => {
  expect(loadConfig({}).eventLoopRealtimePriority).toBeUndefined();
  expect(loadConfig({ SANDFORK_GATEWAY_REALTIME_PRIORITY: "1" }).eventLoopRealtimePriority).toBe(1);
  expect(loadConfig({ SANDFORK_GATEWAY_REALTIME_PRIORITY: "99" }).eventLoopRealtimePriority).toBe(
    99,
  );
  for (const wrong of ["0", "100", "-1", "1.5", "rr"])
    expect(() => loadConfig({ SANDFORK_GATEWAY_REALTIME_PRIORITY: wrong }), wrong).toThrow(
      /SANDFORK_GATEWAY_REALTIME_PRIORITY must be an integer from 1 to 99/,
    );
});
