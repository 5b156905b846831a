// startRuntime's other modes and the configuration, with the REAL daemon where one is needed.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { loadRuntimeConfig, MAX_SOCKET_PATH_BYTES } from "./config.js";
import { DaemonConnection } from "./daemon-connection.js";
import { unixEndpoint } from "./daemon-endpoint.js";
import { RuntimeUnavailableError } from "./errors.js";
import { startRuntime } from "./start.js";
import { DaemonSupervisor } from "./supervisor.js";
import {
  removeSharedTemplates,
  requireVmmBinary,
  sharedTemplates,
  templatesFixture,
} from "./testing/real-daemon.js";

const MAXIMA = { timeoutMs: 30_000, memoryMib: 2_048, processes: 64 };
const cleanups: (() => Promise<void> | void)[] = [];
beforeAll(sharedTemplates);
afterAll(removeSharedTemplates);
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe("startRuntime", () => {
  it("none: no runtime", async () => {
    const log: string[] = [];
    expect(
      await startRuntime(loadRuntimeConfig({ SANDFORK_RUNTIME: "none" }, "/data"), MAXIMA, (l) =>
        log.push(l),
      ),
    ).toBeUndefined();
    expect(log).toEqual(["SANDFORK_RUNTIME=none: no execution runtime"]);
  });

  it("external: starts without a daemon, answers unavailable, connects once one serves the socket, and leaves it running on stop", async () => {
    const templates = await templatesFixture();
    cleanups.push(() => templates.dispose());
    const socketPath = join(templates.dir, "vmm.sock");
    const log: string[] = [];
    const config = loadRuntimeConfig(
      { SANDFORK_RUNTIME: "external", SANDFORK_VMM_SOCKET: socketPath },
      templates.dir,
    );
    const runtime = await startRuntime(config, MAXIMA, (l) => log.push(l));
    if (runtime === undefined) throw new Error("external mode must give a runtime");
    cleanups.push(() => runtime.stop());
    expect(runtime.supervisor).toBeUndefined();
    expect(log.join("\n")).toMatch(
      /cannot connect to sandfork-vmm at .*vmm\.sock.*; retrying in the background/,
    );
    await expect(runtime.client.templates()).rejects.toBeInstanceOf(RuntimeUnavailableError);

    // Someone else runs the daemon; the client's background reconnects find it.
    const daemon = new DaemonSupervisor({
      binary: requireVmmBinary(),
      socketPath,
      templatesDir: templates.templatesDir,
    });
    cleanups.push(() => daemon.stop());
    await daemon.start();
    await runtime.client.waitUntilConnected(5_000);
    expect(await runtime.client.templates()).toEqual([expect.objectContaining({ name: "python" })]);

    await runtime.stop();
    // The daemon is someone else's: it still answers on its socket.
    const stillServing = await DaemonConnection.open(unixEndpoint(socketPath), 1_000);
    stillServing.close();
    await expect(runtime.client.templates()).rejects.toBeInstanceOf(RuntimeUnavailableError);
  });

  it("supervised: no template sources is an error naming the folder", async () => {
    const dir = await mkdtemp(join(tmpdir(), "sfk-st-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const config = loadRuntimeConfig(
      { SANDFORK_VMM_BIN: requireVmmBinary(), SANDFORK_TEMPLATE_SOURCES: join(dir, "none") },
      dir,
    );
    await expect(startRuntime(config, MAXIMA, () => {})).rejects.toThrow(
      `no template sources (folders with an image.json) in ${join(dir, "none")}`,
    );
  });
});

describe("loadRuntimeConfig", () => {
  it("defaults under the data directory and the repository", () => {
    const config = loadRuntimeConfig({}, "/srv/sandfork");
    expect(config).toMatchObject({
      mode: "supervised",
      socketPath: "/srv/sandfork/run/sandfork-vmm.sock",
      templatesDir: "/srv/sandfork/templates",
      binary: join(process.cwd(), "native-vmm/target/release/sandfork-vmm"),
      templateSourcesDir: join(process.cwd(), "templates"),
      serveArgs: [],
      rebuildTemplates: false,
      connections: 4,
    });
    expect(
      loadRuntimeConfig({ SANDFORK_VMM_SERVE_ARGS: " --max-queue  8 " }, "/d").serveArgs,
    ).toEqual(["--max-queue", "8"]);
    expect(config.bootTimeoutMs).toBeUndefined();
    expect(loadRuntimeConfig({ SANDFORK_VMM_BOOT_TIMEOUT_MS: "450000" }, "/d").bootTimeoutMs).toBe(
      450_000,
    );
    expect(config.readyTimeoutMs).toBe(15_000);
    expect(
      loadRuntimeConfig({ SANDFORK_VMM_READY_TIMEOUT_MS: "225000" }, "/d").readyTimeoutMs,
    ).toBe(225_000);
    expect(config.executeGraceMs).toBe(5_000);
    expect(loadRuntimeConfig({ SANDFORK_VMM_EXECUTE_GRACE_MS: "75000" }, "/d").executeGraceMs).toBe(
      75_000,
    );
    expect(config.executeMaxWaitMs).toBe(600_000);
    expect(
      loadRuntimeConfig({ SANDFORK_VMM_EXECUTE_MAX_WAIT_MS: "900000" }, "/d").executeMaxWaitMs,
    ).toBe(900_000);
  });

  it("refuses an unknown mode, a bad number and a socket path too long for sun_path", () => {
    expect(() => loadRuntimeConfig({ SANDFORK_RUNTIME: "docker" }, "/d")).toThrow(
      /supervised, external, none or cluster/,
    );
    expect(() => loadRuntimeConfig({ SANDFORK_VMM_CONNECTIONS: "0" }, "/d")).toThrow(
      /SANDFORK_VMM_CONNECTIONS/,
    );
    expect(() => loadRuntimeConfig({ SANDFORK_VMM_BOOT_TIMEOUT_MS: "soon" }, "/d")).toThrow(
      /SANDFORK_VMM_BOOT_TIMEOUT_MS/,
    );
    const deep = `/${"d".repeat(MAX_SOCKET_PATH_BYTES)}`;
    expect(() => loadRuntimeConfig({}, deep)).toThrow(
      /longer than 107 bytes; set SANDFORK_VMM_SOCKET/,
    );
  });
});
