// The client's cache of the daemon's templates, against a stand-in daemon on a Unix socket whose
// list_templates answers come when the test says: a refresh past the cache's lifetime does not
// hold up the callers (the gateway asks on every execution, a shed one included) while the last
// list can answer them.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { DaemonClient } from "./daemon-client.js";
import { encodeFrame, FrameDecoder, type FrameObject } from "./frames.js";

const TTL_MS = 300;
let dir: string;
let server: Server;
let client: DaemonClient;
/** list_templates requests not answered yet, with what answers each. */
const pending: { answer: (ready: boolean) => void }[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "sandfork-templates-vmm-"));
  const socketPath = join(dir, "vmm.sock");
  server = createServer((socket: Socket) => {
    socket.on("error", () => {});
    const decoder = new FrameDecoder();
    socket.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.next(); frame !== undefined; frame = decoder.next()) {
        if (frame.type === "hello")
          socket.write(encodeFrame({ type: "hello", protocol: 1, server: "fake-vmm 0" }));
        else if (frame.type === "list_templates") {
          const id = (frame as FrameObject).id;
          pending.push({
            answer: (ready) =>
              socket.write(
                encodeFrame({
                  id,
                  type: "templates",
                  templates: [
                    {
                      name: "python",
                      content_hash: "c0ffee",
                      language: "python",
                      languages: ["python"],
                      ready,
                    },
                  ],
                }),
              ),
          });
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  client = new DaemonClient({ socketPath, connections: 1, templatesTtlMs: TTL_MS });
  await client.connect();
});

afterAll(async () => {
  client?.close();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  rmSync(dir, { recursive: true, force: true });
});

it("answers with the last list while a refresh past the cache's lifetime is on its way, then with the new one", async () => {
  // The first list has nothing to fall back on: it waits for the daemon.
  const first = client.templates();
  await expect.poll(() => pending.length).toBe(1);
  pending.shift()?.answer(false);
  expect((await first)[0]?.ready).toBe(false);

  await new Promise((resolve) => setTimeout(resolve, TTL_MS * 2));
  // Expired: a refresh is asked for, and the last list answers at once while it is unanswered.
  const during = await Promise.race([
    client.templates(),
    new Promise<"waited">((resolve) => setTimeout(() => resolve("waited"), 200)),
  ]);
  expect(during).not.toBe("waited");
  expect((during as { ready: boolean }[])[0]?.ready).toBe(false);
  await expect.poll(() => pending.length).toBe(1);
  // No second refresh while the first is on its way.
  await client.templates();
  expect(pending).toHaveLength(1);

  pending.shift()?.answer(true);
  await expect.poll(async () => (await client.templates())[0]?.ready).toBe(true);
});
