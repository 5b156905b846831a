// The supervisor running the REAL `sandfork-vmm serve`: restart after SIGKILL with the calls in
// flight failing retryably, backoff, refusing a taken socket, a start-up failure, stop.

import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { chown, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DaemonClient } from "./daemon-client.js";
import { RuntimeConnectionLostError, RuntimeUnavailableError } from "./errors.js";
import { DaemonSupervisor } from "./supervisor.js";
import {
  type DaemonFixture,
  removeSharedTemplates,
  requireVmmBinary,
  sharedTemplates,
  startDaemon,
  stopProcess,
  templatesFixture,
} from "./testing/real-daemon.js";
import { uidOf } from "./unprivileged.js";

const cleanups: (() => Promise<void> | void)[] = [];
beforeAll(sharedTemplates);
afterAll(removeSharedTemplates);
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function daemonWithLog(): Promise<{ daemon: DaemonFixture; log: string[] }> {
  const log: string[] = [];
  const daemon = await startDaemon({ log: (line) => log.push(line) });
  cleanups.push(() => daemon.dispose());
  return { daemon, log };
}

function client(socketPath: string, connections: number): DaemonClient {
  const c = new DaemonClient({ socketPath, connections });
  cleanups.push(() => c.close());
  return c;
}

function nextReady(supervisor: DaemonSupervisor): Promise<{ pid: number }> {
  return new Promise((resolve) => {
    const off = supervisor.onReady((info) => {
      off();
      resolve(info);
    });
  });
}

describe("DaemonSupervisor with sandfork-vmm serve", () => {
  it("restarts a daemon killed with SIGKILL; calls in flight fail retryably, later calls succeed", async () => {
    const { daemon, log } = await daemonWithLog();
    const runtime = client(daemon.socketPath, 2);
    daemon.supervisor.onReady(() => runtime.reconnectNow());
    await runtime.connect();
    const firstPid = daemon.supervisor.pid as number;

    // Stopped, the daemon holds every answer: these four are certainly in flight at its death.
    await stopProcess(firstPid);
    const inFlight = [
      runtime.daemonHealth(),
      runtime.stats(),
      runtime.templates(),
      runtime.execute(
        {
          executionId: "x",
          template: "python",
          code: "print(1)",
          stdin: "",
          args: [],
          env: {},
          files: [],
          language: "python",
          timeoutMs: 1_000,
          memoryMb: 64,
        },
        new AbortController().signal,
      ),
    ].map((call) =>
      call.then(
        () => "answered",
        (error: Error) => error,
      ),
    );
    expect(runtime.status().inFlight).toBe(4);
    const restarted = nextReady(daemon.supervisor);
    process.kill(firstPid, "SIGKILL");

    for (const outcome of await Promise.all(inFlight)) {
      expect(outcome).toBeInstanceOf(RuntimeConnectionLostError);
      expect(outcome).toBeInstanceOf(RuntimeUnavailableError); // the gateway's 503, nothing billed
      expect(outcome).toMatchObject({ code: "connection_lost", retryable: true });
    }

    const info = await restarted;
    expect(info.pid).not.toBe(firstPid);
    expect(daemon.supervisor.restarts).toBe(1);
    expect(log.join("\n")).toContain(`sandfork-vmm (pid ${firstPid}) died (killed by SIGKILL)`);
    await runtime.waitUntilConnected(5_000);
    expect((await runtime.daemonHealth()).templates).toBe(1);
    expect(await runtime.templates()).toEqual([expect.objectContaining({ name: "python" })]);
  });

  it("kills and restarts a daemon that stops answering (hung, here: SIGSTOP)", async () => {
    const log: string[] = [];
    const daemon = await startDaemon({
      log: (line) => log.push(line),
      livenessIntervalMs: 100,
      livenessTimeoutMs: 150,
      livenessFailures: 2,
    });
    cleanups.push(() => daemon.dispose());
    const hungPid = daemon.supervisor.pid as number;
    const restarted = nextReady(daemon.supervisor);
    await stopProcess(hungPid);
    const info = await restarted;
    expect(info.pid).not.toBe(hungPid);
    expect(log.join("\n")).toContain(
      `sandfork-vmm (pid ${hungPid}) did not answer 2 liveness probes in a row`,
    );
    expect(log.join("\n")).toContain(`sandfork-vmm (pid ${hungPid}) died (killed by SIGKILL)`);
    const runtime = client(daemon.socketPath, 1);
    await runtime.connect();
    expect((await runtime.daemonHealth()).templates).toBe(1);
  });

  it("restarts a daemon its seccomp filter killed (a forbidden host system call: SIGSYS)", async () => {
    const log: string[] = [];
    const daemon = await startDaemon({
      log: (line) => log.push(line),
      serveArgs: ["--test-forbidden-syscall-after-ms", "500"],
    });
    cleanups.push(() => daemon.dispose());
    const firstPid = daemon.supervisor.pid;
    const restarted = await nextReady(daemon.supervisor);
    expect(restarted.pid).not.toBe(firstPid);
    expect(log.join("\n")).toMatch(
      new RegExp(`sandfork-vmm \\(pid ${firstPid}\\) died \\(killed by SIGSYS\\); restarting`),
    );
    expect(log.join("\n")).toContain("confined by seccomp");
    expect(daemon.supervisor.restarts).toBe(1);
  });

  it("runs the daemon as an unprivileged user holding only /dev/kvm's group, its templates and its socket directory", async () => {
    expect(process.getuid?.(), "the supervisor tests run as root").toBe(0);
    const nobody = uidOf(await readFile("/etc/passwd", "utf8"), "nobody") as number;
    const kvmGroup = existsSync("/dev/kvm") ? (await stat("/dev/kvm")).gid : nobody;
    const templates = await templatesFixture();
    cleanups.push(() => templates.dispose());
    // The fixture's directory is root's (0700); the daemon gets it as its socket directory.
    await chown(templates.dir, nobody, kvmGroup);
    const supervisor = new DaemonSupervisor({
      binary: requireVmmBinary(),
      socketPath: join(templates.dir, "vmm.sock"),
      templatesDir: templates.templatesDir,
      runAs: { uid: nobody, gid: kvmGroup },
    });
    cleanups.push(() => supervisor.stop());
    await supervisor.start();
    const status = await readFile(`/proc/${supervisor.pid}/status`, "utf8");
    expect(status).toMatch(
      new RegExp(`^Uid:\\s+${nobody}\\s+${nobody}\\s+${nobody}\\s+${nobody}$`, "m"),
    );
    expect(status).toMatch(new RegExp(`^Gid:\\s+${kvmGroup}\\s`, "m"));
    expect(status).toMatch(/^Groups:\s*$/m);
    expect(status).toMatch(/^NoNewPrivs:\s+1$/m);
    expect(status).toMatch(/^Seccomp:\s+2$/m);
    const runtime = client(join(templates.dir, "vmm.sock"), 1);
    await runtime.connect();
    const health = await runtime.daemonHealth();
    if (existsSync("/dev/kvm")) expect(health.kvm).toBe("available");
  });

  it("backs off between quick successive deaths", async () => {
    const { daemon, log } = await daemonWithLog();
    for (let death = 0; death < 2; death++) {
      const restarted = nextReady(daemon.supervisor);
      process.kill(daemon.supervisor.pid as number, "SIGKILL");
      await restarted;
    }
    const delays = log
      .flatMap((line) => /restarting in (\d+) ms/.exec(line)?.[1] ?? [])
      .map(Number);
    expect(delays).toEqual([50, 100]);
    expect(daemon.supervisor.restarts).toBe(2);
  });

  it("stop() ends the daemon with SIGTERM: its socket is removed and clients lose their connection", async () => {
    const { daemon, log } = await daemonWithLog();
    const runtime = client(daemon.socketPath, 1);
    await runtime.connect();
    expect(existsSync(daemon.socketPath)).toBe(true);
    await daemon.supervisor.stop();
    expect(daemon.supervisor.pid).toBeUndefined();
    expect(existsSync(daemon.socketPath)).toBe(false);
    expect(log.join("\n")).toMatch(/stopped \(exit code 0\)/);
    expect(daemon.supervisor.restarts).toBe(0);
    await expect(runtime.daemonHealth()).rejects.toBeInstanceOf(RuntimeUnavailableError);
  });

  it("refuses to start a second daemon on a socket another one serves", async () => {
    const { daemon } = await daemonWithLog();
    const second = new DaemonSupervisor({
      binary: requireVmmBinary(),
      socketPath: daemon.socketPath,
      templatesDir: daemon.templatesDir,
    });
    cleanups.push(() => second.stop());
    await expect(second.start()).rejects.toThrow(/sandfork-vmm .* is already serving at/);
    expect(second.pid).toBeUndefined();
    // The first one is untouched.
    const runtime = client(daemon.socketPath, 1);
    await runtime.connect();
    expect((await runtime.daemonHealth()).templates).toBe(1);
  });

  it("stops a daemon an earlier supervisor left running (its pid file names it) and starts a new one", async () => {
    const { daemon } = await daemonWithLog();
    await daemon.supervisor.stop();
    // What a gateway killed with SIGKILL leaves: a daemon serving the socket, its pid on record.
    const leftover = spawn(
      requireVmmBinary(),
      ["serve", "--socket", daemon.socketPath, "--templates", daemon.templatesDir],
      { stdio: "ignore" },
    );
    const leftoverExit = new Promise((r) =>
      leftover.once("exit", (code, signal) => r(signal ?? code)),
    );
    const goneSupervisor = spawn("true");
    await new Promise((r) => goneSupervisor.once("exit", r));
    await writeFile(`${daemon.socketPath}.pid`, `${leftover.pid} ${goneSupervisor.pid}\n`);
    const probe = client(daemon.socketPath, 1);
    for (let tries = 0; probe.status().connected === 0; tries++) {
      if (tries > 200) throw new Error("the leftover daemon did not come up");
      await probe.connect().catch(() => new Promise((r) => setTimeout(r, 25)));
    }
    probe.close();

    const log: string[] = [];
    const next = new DaemonSupervisor({
      binary: requireVmmBinary(),
      socketPath: daemon.socketPath,
      templatesDir: daemon.templatesDir,
      log: (l) => log.push(l),
    });
    cleanups.push(() => next.stop());
    const info = await next.start();
    expect(await leftoverExit).toBe(0); // SIGTERM: the daemon stops cleanly
    expect(log.join("\n")).toContain(
      `stopping sandfork-vmm (pid ${leftover.pid}), left running at ${daemon.socketPath}`,
    );
    expect(info.pid).not.toBe(leftover.pid);
    expect((await readFile(`${daemon.socketPath}.pid`, "utf8")).trim()).toBe(
      `${info.pid} ${process.pid}`,
    );
    await next.stop();
    expect(existsSync(`${daemon.socketPath}.pid`)).toBe(false);
  });

  it("a daemon that cannot start fails start() with its own explanation", async () => {
    const dir = await mkdtemp(join(tmpdir(), "sfk-rt-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const supervisor = new DaemonSupervisor({
      binary: requireVmmBinary(),
      socketPath: join(dir, "vmm.sock"),
      templatesDir: join(dir, "no-such-templates"),
    });
    const error = await supervisor.start().then(
      () => new Error("started"),
      (e: Error) => e,
    );
    expect(error.message).toMatch(/sandfork-vmm exited during start-up \(exit code 1\)/);
    expect(error.message).toContain("no-such-templates");
    expect(supervisor.pid).toBeUndefined();
  });
});
