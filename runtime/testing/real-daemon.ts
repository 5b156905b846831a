// Test support: the REAL `sandfork-vmm` binary (no stand-in), a real template built with it,
// and a daemon run under the real supervisor, all in a short temporary directory (a Unix socket
// path must fit 107 bytes).
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from "node:fs";
import { chmod, mkdtemp, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { DaemonSupervisor, type SupervisorOptions } from "../supervisor.js";
import { ensureTemplate } from "../templates.js";

const VMM_BINARY = resolve(
  process.env.SANDFORK_VMM_BIN ?? "native-vmm/target/release/sandfork-vmm",
);
const PYTHON_MANIFEST = resolve("templates/python/image.json");

/** The daemon binary's path; a missing binary fails the test with how to build it (never a skip). */
export function requireVmmBinary(): string {
  if (!existsSync(VMM_BINARY)) {
    throw new Error(
      `the sandfork-vmm binary is missing at ${VMM_BINARY}: build it first with \`cd native-vmm && cargo build --release\``,
    );
  }
  return VMM_BINARY;
}

let withoutKvm: string | undefined;

/**
 * A launcher of the REAL binary that cannot use KVM, on any machine: it runs it in a private
 * mount namespace (util-linux `unshare --mount`, root) whose /dev/kvm is /dev/null, so opening
 * it works and KVM_GET_API_VERSION fails, as on a host with no KVM driver. The tests of the
 * no-KVM paths (`unavailable` answers, 503, nothing billed) use it; the KVM tier runs the rest.
 * One script per test process, in its own temporary directory.
 */
export function vmmBinaryWithoutKvm(): string {
  if (withoutKvm !== undefined) return withoutKvm;
  const binary = requireVmmBinary();
  const script = join(mkdtempSync(join(tmpdir(), "sfk-nokvm-")), "sandfork-vmm");
  const body = `mount --bind /dev/null /dev/kvm 2>/dev/null || [ ! -e /dev/kvm ] || exit 125; exec "$0" "$@"`;
  writeFileSync(
    script,
    `#!/bin/sh\nexec unshare --mount -- /bin/sh -c '${body}' '${binary}' "$@"\n`,
  );
  chmodSync(script, 0o755);
  withoutKvm = script;
  return script;
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

/**
 * The python template, built once per test process: a build is heavy work, slow on a busy host,
 * that would otherwise count against the time limit of every test that starts a daemon.
 */
let builtTemplates: Promise<string> | undefined;

/**
 * Builds the test process's python template (once; a test file's beforeAll, out of its tests'
 * time; removeSharedTemplates in its afterAll).
 */
export function sharedTemplates(): Promise<string> {
  builtTemplates ??= (async () => {
    const dir = await mkdtemp(join(tmpdir(), "sfk-rt-templates-"));
    // Readable by a daemon run as another user (supervisor.test.ts).
    await chmod(dir, 0o755);
    const templatesDir = join(dir, "templates");
    await ensureTemplate(
      { name: "python", manifestPath: PYTHON_MANIFEST },
      { binary: requireVmmBinary(), templatesDir },
    );
    return templatesDir;
  })();
  return builtTemplates;
}

/** Removes the test process's python template (a test file's afterAll). */
export async function removeSharedTemplates(): Promise<void> {
  const built = builtTemplates;
  builtTemplates = undefined;
  if (built !== undefined) await rm(dirname(await built), { recursive: true, force: true });
}

/**
 * A temporary directory whose templates/ holds the python template built (a link to the test
 * process's one build, which no test changes).
 */
export async function templatesFixture(): Promise<{
  dir: string;
  templatesDir: string;
  dispose(): Promise<void>;
}> {
  const built = await sharedTemplates();
  const dir = await mkdtemp(join(tmpdir(), "sfk-rt-"));
  const templatesDir = join(dir, "templates");
  await symlink(built, templatesDir);
  return { dir, templatesDir, dispose: () => rm(dir, { recursive: true, force: true }) };
}

/** `sandfork-vmm serve` on a freshly built python template, supervised and ready. */
export async function startDaemon(
  options: Partial<SupervisorOptions> = {},
): Promise<DaemonFixture> {
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
