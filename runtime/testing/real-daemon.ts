// Test support: the REAL `sandfork-vmm` binary (no stand-in), a real template built with it,
// and a daemon run under the real supervisor, all in a short temporary directory (a Unix socket
// path must fit 107 bytes).
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { DaemonSupervisor, type SupervisorOptions } from "../supervisor.js";
import { ensureTemplate } from "../templates.js";

const VMM_BINARY = resolve(process.env.SANDFORK_VMM_BIN ?? "native-vmm/target/release/sandfork-vmm");
const PYTHON_MANIFEST = resolve("templates/python/image.json");

/** The daemon binary's path; a missing binary fails the test with how to build it (never a skip). */
export function requireVmmBinary(): string {
  if (!existsSync(VMM_BINARY)) {
    throw new Error(`the sandfork-vmm binary is missing at ${VMM_BINARY}: build it first with \`cd native-vmm && cargo build --release\``);
  }
  return VMM_BINARY;
}

/**
 * SIGSTOPs process `pid` and waits until every one of its threads is stopped: a thread running
 * on another core may otherwise still answer a request sent right after the signal.
 */
export async function stopProcess(pid: number): Promise<void> {
  process.kill(pid, "SIGSTOP");
  const stopped = () =>
    readdirSync(`/proc/${pid}/task`).every((task) => {
      const stat = readFileSync(`/proc/${pid}/task/${task}/stat`, "utf8");
      // Field 3, after the parenthesised command name.
      return /^[Tt]$/.test(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? "");
    });
  const deadline = Date.now() + 2_000;
  while (!stopped()) {
    if (Date.now() > deadline) throw new Error(`process ${pid} did not stop within 2 s of SIGSTOP`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

export interface DaemonFixture {
  dir: string;
  templatesDir: string;
  socketPath: string;
  supervisor: DaemonSupervisor;
  dispose(): Promise<void>;
}

/** A temporary directory with the python template built into templates/python. */
export async function templatesFixture(): Promise<{ dir: string; templatesDir: string; dispose(): Promise<void> }> {
  const binary = requireVmmBinary();
  const dir = await mkdtemp(join(tmpdir(), "sfk-rt-"));
  const templatesDir = join(dir, "templates");
  await ensureTemplate({ name: "python", manifestPath: PYTHON_MANIFEST }, { binary, templatesDir });
  return { dir, templatesDir, dispose: () => rm(dir, { recursive: true, force: true }) };
}

/** `sandfork-vmm serve` on a freshly built python template, supervised and ready. */
export async function startDaemon(options: Partial<SupervisorOptions> = {}): Promise<DaemonFixture> {
  const templates = await templatesFixture();
  const socketPath = join(templates.dir, "vmm.sock");
  const supervisor = new DaemonSupervisor({
    binary: requireVmmBinary(),
    socketPath,
    templatesDir: templates.templatesDir,
    restartMinMs: 50,
    ...options,
  });
  try {
    await supervisor.start();
  } catch (error) {
    await templates.dispose();
    throw error;
  }
  return {
    dir: templates.dir,
    templatesDir: templates.templatesDir,
    socketPath,
    supervisor,
    async dispose() {
      await supervisor.stop();
      await templates.dispose();
    },
  };
}
