// The plain Hono server the load tests' figures are compared with (loadtest/hello-server.ts), in
// a child process of its own.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { REPOSITORY } from "./execution.js";

export interface HelloServer {
  url: string;
  pid: number;
  stop(): void;
}

/** Starts the plain Hono server; resolves to its URL once it listens. */
export async function startHello(): Promise<HelloServer> {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", join(REPOSITORY, "loadtest", "hello-server.ts")],
    // In a session of its own, so that its priority can be set as the gateway's (lib/flood.ts).
    { stdio: ["ignore", "pipe", "inherit"], detached: true },
  );
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout }).once("line", (line) =>
      resolve((JSON.parse(line) as { url: string }).url),
    );
    child.once("exit", (code) => reject(new Error(`the hello server exited early (code ${code})`)));
  });
  return { url, pid: child.pid as number, stop: () => child.kill("SIGTERM") };
}
