// Child process of the load runner: a plain Hono "hello" app on a loopback port, the floor that
// the gateway's figures are compared with: `GET /hello`, and `POST /busy`, a shed answer as the
// gateway gives it (503 problem+json with Retry-After) with nothing done before it. Prints one
// JSON line {url} when ready and serves until killed.
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Hono } from "hono";

const hello = new Hono();
hello.get("/hello", (c) => c.text("hello"));
const BUSY = JSON.stringify({
  type: "https://sandfork.dev/problems/runtime-busy",
  title: "The execution runtime is at capacity",
  status: 503,
  detail: "8 executions of python run at once and 8 more wait; retry in 1 s",
  retryable: true,
  retry_after_seconds: 1,
});
hello.post("/busy", (c) =>
  c.body(BUSY, 503, { "content-type": "application/problem+json", "retry-after": "1" }),
);

const server = serve({ fetch: hello.fetch, hostname: "127.0.0.1", port: 0 }, () => {
  process.stdout.write(
    `${JSON.stringify({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })}\n`,
  );
});
