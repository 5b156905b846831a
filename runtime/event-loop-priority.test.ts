import { readFileSync } from "node:fs";
import { getPriority, setPriority } from "node:os";
import { afterAll, expect, it } from "vitest";
import { setEventLoopNice, spawnAtStartingNice } from "./event-loop-priority.js";

/** The nice value of a process, field 19 of /proc/PID/stat (after the parenthesized name). */
function niceOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
}

const starting = getPriority();
afterAll(() => setPriority(starting));

it("raises the event loop's thread and spawns children at the nice value it started with", async () => {
  setEventLoopNice(starting - 5);
  expect(getPriority()).toBe(starting - 5);
  const child = spawnAtStartingNice("sleep", ["5"], { stdio: "ignore" });
  try {
    expect(child.pid).toBeDefined();
    expect(niceOf(child.pid as number)).toBe(starting);
    expect(getPriority()).toBe(starting - 5);
  } finally {
    child.kill("SIGKILL");
  }
  // Back at the starting value: children are spawned as they would be anyway.
  setEventLoopNice(starting);
  const plain = spawnAtStartingNice("sleep", ["5"], { stdio: "ignore" });
  try {
    expect(niceOf(plain.pid as number)).toBe(starting);
  } finally {
    plain.kill("SIGKILL");
  }
});
