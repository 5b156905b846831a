// Sessions under SIGKILL, on KVM, through the gateway as `npm start` runs it (gateway/main.ts in
// its own process, the real supervised daemon under it, PGlite): a client runs a cell and takes
// a checkpoint in a loop for a moment (1 s and 4 checkpoints at least), recording what every acknowledged checkpoint holds; then
// the gateway and the daemon are both killed with SIGKILL at the same instant and the gateway is
// started again (which starts the daemon again). Every acknowledged checkpoint must be listed
// with the content hash the client was given, a fork of it must hold what the client recorded
// (the restarted daemon verifies every file's hash as it restores it), and the session itself
// goes on from its newest checkpoint. The count recovered/acknowledged is printed.
//
// The daemon alone killed at many random moments is native-vmm/tests/sessions_kvm.rs (and
// `npm run test:sessions-crash`). Waits scale with SANDFORK_TEST_TIME_SCALE.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireVmmBinary } from "../runtime/testing/real-daemon.js";
import { type GatewayProcess, issueKey, startGatewayProcess } from "./testing/gateway-process.js";
import { scaledDaemonReadyEnv, templatesWithPrebuilt, timeScale } from "./testing/kvm-tier.js";

/**
 * The kill comes once the loop has had checkpoints acknowledged (at least this long and this
 * many), so that there is something to recover on any path; the tier's slower path only needs
 * more time to get there.
 */
const MIN_LOAD_MS = 1_000;
const MIN_ACKNOWLEDGED = 4;
const MAX_LOAD_MS = 30_000 * timeScale;
const REQUEST_TIMEOUT_MS = 20_000 * timeScale;
const TEST_TIMEOUT_MS = 120_000 * timeScale;

interface Acknowledged {
  checkpoint: number;
  sha256: string;
  /** The session's counter when it was taken. */
  n: number;
}

describe("a session's acknowledged checkpoints under SIGKILL of the gateway and the daemon", () => {
  let dir: string;
  let gateway: GatewayProcess;
  let key: string;
  const start = () =>
    startGatewayProcess({
      dataDir: join(dir, "data"),
      socketPath: join(dir, "vmm.sock"),
      templatesDir: join(dir, "templates"),
      env: {
        SANDFORK_TEMPLATES: "python",
        SANDFORK_VMM_BIN: requireVmmBinary(),
        SANDFORK_VMM_SERVE_ARGS: "--pool-size 1 --keep-checkpoints 1048576",
        SANDFORK_VMM_BOOT_TIMEOUT_MS: String(30_000 * timeScale),
        ...scaledDaemonReadyEnv,
      },
      startTimeoutMs: 120_000 * timeScale,
    });

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "sfk-sessions-crash-"));
    await templatesWithPrebuilt(dir, ["python"]);
    gateway = await start();
    key = (await issueKey(gateway, "sessions-crash", 10_000_000)).key;
  }, TEST_TIMEOUT_MS);

  afterAll(async () => {
    await gateway?.stop();
    if (dir !== undefined) await rm(dir, { recursive: true, force: true });
  });

  /** A request to the current gateway; undefined when no answer came (it was killed). */
  async function call(
    method: string,
    path: string,
    body?: unknown,
  ): Promise<{ status: number; json: Record<string, unknown> } | undefined> {
    try {
      const response = await fetch(`${gateway.url}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${key}`,
          ...(body === undefined ? {} : { "content-type": "application/json" }),
        },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      const text = await response.text();
      return {
        status: response.status,
        json: text === "" ? {} : (JSON.parse(text) as Record<string, unknown>),
      };
    } catch {
      return undefined;
    }
  }

  async function expectOk(
    method: string,
    path: string,
    body?: unknown,
  ): Promise<Record<string, unknown>> {
    const answer = await call(method, path, body);
    expect(answer?.status, `${method} ${path}: ${JSON.stringify(answer?.json)}`).toBeOneOf([
      200, 201,
    ]);
    return (answer as { json: Record<string, unknown> }).json;
  }

  it(
    "keeps every checkpoint it acknowledged: listed with its hash, restorable with its contents, the session going on",
    async () => {
      const session = (
        await expectOk("POST", "/v1/sessions", { template: "python", idle_timeout_s: 600 })
      ).id as string;
      const base = `/v1/sessions/${session}`;
      await expectOk("POST", `${base}/executions`, { code: "n = 0" });

      const acknowledged: Acknowledged[] = [];
      let killing = false;
      let looping = true;
      const loop = (async () => {
        try {
          for (let n = 1; !killing; n++) {
            const cell = await call("POST", `${base}/executions`, { code: "n += 1\nn" });
            if (cell?.status !== 200) break;
            expect(cell.json.value).toBe(String(n));
            const taken = await call("POST", `${base}/checkpoints`);
            if (taken?.status !== 201) break;
            acknowledged.push({
              checkpoint: taken.json.checkpoint as number,
              sha256: taken.json.sha256 as string,
              n,
            });
          }
        } finally {
          looping = false;
        }
      })();
      const started = Date.now();
      while (Date.now() - started < MIN_LOAD_MS || acknowledged.length < MIN_ACKNOWLEDGED) {
        if (!looping)
          throw new Error(
            `the loop stopped before the kill, after ${acknowledged.length} checkpoints`,
          );
        if (Date.now() - started > MAX_LOAD_MS)
          throw new Error(
            `only ${acknowledged.length} checkpoints acknowledged in ${MAX_LOAD_MS} ms`,
          );
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      killing = true;
      // Both at once, mid-request: the loop is writing a checkpoint or running a cell.
      const daemonPid = gateway.daemonPid();
      process.kill(daemonPid, "SIGKILL");
      await gateway.stop("SIGKILL");
      await loop;
      expect(
        acknowledged.length,
        "checkpoints acknowledged before the kill",
      ).toBeGreaterThanOrEqual(MIN_ACKNOWLEDGED);

      gateway = await start();
      expect(gateway.daemonPid(), "a new daemon").not.toBe(daemonPid);
      const listed = new Map(
        ((await expectOk("GET", base)).checkpoints as { checkpoint: number; sha256: string }[]).map(
          (k) => [k.checkpoint, k.sha256],
        ),
      );
      let recovered = 0;
      for (const ack of acknowledged) {
        expect(
          listed.get(ack.checkpoint),
          `checkpoint ${ack.checkpoint} listed with its hash`,
        ).toBe(ack.sha256);
        const fork = (await expectOk("POST", `${base}/fork`, { checkpoint: ack.checkpoint }))
          .id as string;
        const value = (await expectOk("POST", `/v1/sessions/${fork}/executions`, { code: "n" }))
          .value;
        expect(value, `checkpoint ${ack.checkpoint}'s counter`).toBe(String(ack.n));
        await expectOk("DELETE", `/v1/sessions/${fork}`);
        recovered++;
      }
      console.log(
        `sessions crash through the gateway: ${recovered}/${acknowledged.length} acknowledged checkpoints recovered`,
      );

      // The session resumes from its newest checkpoint on disk: the last acknowledged one, or one
      // taken after it whose answer the kill cut off.
      const last = acknowledged[acknowledged.length - 1] as Acknowledged;
      const resumed = Number(
        (await expectOk("POST", `${base}/executions`, { code: "n += 1\nn" })).value,
      );
      expect(resumed).toBeGreaterThanOrEqual(last.n + 1);
      expect(resumed).toBeLessThanOrEqual(last.n + 2);
    },
    TEST_TIMEOUT_MS,
  );
});
