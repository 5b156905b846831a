import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { getPriority, setPriority } from "node:os";
import { fileURLToPath } from "node:url";
import { afterAll, expect, it } from "vitest";
import {
  groupedBySession,
  leadsItsSession,
  sessionGroupNice,
  setEventLoopNice,
  spawnAtStartingNice,
} from "./event-loop-priority.js";

/** The nice value of a process, field 19 of /proc/PID/stat (after the parenthesized name). */
function niceOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
}

const starting = getPriority();
afterAll(() => setPriority(starting));

it("raises the event loop's thread and spawns children at the nice value it started with", async () => {
  // The test runner's session group is its caller's: never changed.
  const groupBefore = sessionGroupNice(process.pid);
  expect(setEventLoopNice(starting - 5)).toBe(
    groupedBySession() ? "not-session-leader" : "not-grouped-by-session",
  );
  expect(sessionGroupNice(process.pid)).toBe(groupBefore);
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

it("raises its session's scheduling group too when it leads a session of its own", async () => {
  const module = fileURLToPath(new URL("./event-loop-priority.ts", import.meta.url));
  // A process in a new session (setsid), as `setsid npm start` starts the gateway.
  const child = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      "-e",
      `const p = await import(${JSON.stringify(module)});
       const done = p.setEventLoopNice(${starting - 3});
       console.log(JSON.stringify({ done, leads: p.leadsItsSession(), group: p.sessionGroupNice(process.pid) }));`,
    ],
    { detached: true, stdio: ["ignore", "pipe", "inherit"] },
  );
  const output: Buffer[] = [];
  child.stdout.on("data", (chunk: Buffer) => output.push(chunk));
  const code = await new Promise((resolve) => child.once("exit", resolve));
  expect(code).toBe(0);
  const seen = JSON.parse(Buffer.concat(output).toString()) as {
    done: string;
    leads: boolean;
    group: number | undefined;
  };
  expect(seen.leads).toBe(true);
  if (groupedBySession()) expect(seen).toMatchObject({ done: "set", group: starting - 3 });
  else expect(seen.done).toBe("not-grouped-by-session");
  expect(leadsItsSession()).toBe(false);
}, 30_000);
