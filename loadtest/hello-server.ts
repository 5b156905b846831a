// Child process of the load runner: a plain Hono "hello" app on a loopback port, the floor that
// the gateway's figures are compared with. Prints one JSON line {url} when ready and serves until
// killed.
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Hono } from "hono";

const hello = new Hono();
hello.get("/hello", (c) => c.text("hello"));

const server = serve({ fetch: hello.fetch, hostname: "127.0.0.1", port: 0 }, () => {
  process.stdout.write(
    `${JSON.stringify({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })}\n`,
  );
});
