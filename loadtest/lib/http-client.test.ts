// The load tests' HTTP client against a real Node HTTP server: bodies by length and by chunks,
// keep-alive reuse, the connection cap, a server that closes, and an answer cut off.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { type AddressInfo, createServer as createNetServer } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { keepAliveClient, parseAnswer } from "./http-client.js";

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

async function serve(
  handler: Handler,
): Promise<{ url: string; connections: () => number; server: Server }> {
  let connections = 0;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => handler(req, res, Buffer.concat(chunks).toString("utf8")));
  });
  server.on("connection", () => connections++);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    connections: () => connections,
    server,
  };
}

describe("the load tests' HTTP client", () => {
  const cleanups: (() => void)[] = [];
  afterEach(() => {
    for (const cleanup of cleanups.splice(0)) cleanup();
  });
  const started = async (handler: Handler, maxSockets = 1) => {
    const server = await serve(handler);
    const client = keepAliveClient(maxSockets);
    cleanups.push(() => {
      client.destroy();
      server.server.closeAllConnections();
      server.server.close();
    });
    return { ...server, client };
  };

  it("sends the method, path, headers and body, and reads answers by length and by chunks on one kept connection", async () => {
    const { url, client, connections } = await started((req, res, body) => {
      if (req.url === "/chunked") {
        res.writeHead(200, { "content-type": "text/plain" });
        res.write("é, first; ");
        setTimeout(() => res.end("second"), 5);
        return;
      }
      res.writeHead(req.url === "/missing" ? 404 : 201, { "content-type": "application/json" });
      res.end(
        JSON.stringify({ method: req.method, url: req.url, header: req.headers["x-thing"], body }),
      );
    });
    const posted = await client.call(
      "POST",
      `${url}/things?a=1`,
      { "x-thing": "yes", "content-type": "application/json" },
      '{"code":"print(\'é\')"}',
    );
    expect(posted.status).toBe(201);
    expect(JSON.parse(posted.body)).toEqual({
      method: "POST",
      url: "/things?a=1",
      header: "yes",
      body: '{"code":"print(\'é\')"}',
    });
    expect(await client.call("GET", `${url}/chunked`)).toEqual({
      status: 200,
      body: "é, first; second",
    });
    expect((await client.call("GET", `${url}/missing`)).status).toBe(404);
    expect(connections()).toBe(1);
  });

  it("opens at most maxSockets connections and queues the rest", async () => {
    const { url, client, connections } = await started(
      (req, res) => setTimeout(() => res.end(req.url), 20),
      2,
    );
    const answers = await Promise.all(
      [1, 2, 3, 4, 5].map((n) => client.call("GET", `${url}/${n}`)),
    );
    expect(answers.map((a) => a.body)).toEqual(["/1", "/2", "/3", "/4", "/5"]);
    expect(connections()).toBe(2);
  });

  it("opens a new connection after the server closes one, and rejects an answer cut off", async () => {
    const { url, client, connections } = await started((req, res) => {
      if (req.url === "/close") {
        res.writeHead(200, { connection: "close", "content-length": "3" }).end("bye");
      } else if (req.url === "/cut") {
        res.writeHead(200, { "content-length": "100" });
        res.write("partial", () => res.socket?.destroy());
      } else {
        res.end("ok");
      }
    });
    expect((await client.call("GET", `${url}/close`)).body).toBe("bye");
    expect((await client.call("GET", `${url}/after-close`)).body).toBe("ok");
    await expect(client.call("GET", `${url}/cut`)).rejects.toThrow(
      /closed before the answer was whole/,
    );
    expect((await client.call("GET", `${url}/after-cut`)).body).toBe("ok");
    expect(connections()).toBe(3);
  });

  it("drops a connection on which the server sent more than the answer, or sent unasked", async () => {
    let connections = 0;
    const server = createNetServer((socket) => {
      connections++;
      socket.setNoDelay(true);
      socket.on("data", (request) => {
        const path = request.toString("latin1").split(" ")[1];
        socket.write(
          `HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok${path === "/extra" ? "HTTP/1.1 200 OK\r\n" : ""}`,
        );
        if (path === "/unasked") setTimeout(() => socket.write("surprise"), 5);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const client = keepAliveClient(1);
    cleanups.push(() => {
      client.destroy();
      server.close();
    });
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    expect((await client.call("GET", `${url}/extra`)).body).toBe("ok");
    expect((await client.call("GET", `${url}/next`)).body).toBe("ok");
    expect((await client.call("GET", `${url}/unasked`)).body).toBe("ok");
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect((await client.call("GET", `${url}/after`)).body).toBe("ok");
    expect(connections).toBe(3);
  });

  it("parses an answer only once it is whole", () => {
    const whole = Buffer.from("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhelloHTTP/1.1 204");
    expect(parseAnswer(whole.subarray(0, 20))).toBeUndefined();
    expect(parseAnswer(whole.subarray(0, 40))).toBeUndefined();
    expect(parseAnswer(whole)).toEqual({
      answer: { status: 200, body: "hello" },
      length: 43,
      close: false,
    });
    const untilClose = Buffer.from("HTTP/1.1 200 OK\r\n\r\nall of it");
    expect(parseAnswer(untilClose)).toBeUndefined();
    expect(parseAnswer(untilClose, true)).toEqual({
      answer: { status: 200, body: "all of it" },
      length: untilClose.length,
      close: true,
    });
    expect(parseAnswer(Buffer.from("HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1"))).toEqual({
      answer: { status: 204, body: "" },
      length: 27,
      close: false,
    });
    expect(() => parseAnswer(Buffer.from("SSH-2.0\r\n\r\n"))).toThrow(/not an HTTP\/1.1 answer/);
    expect(() =>
      parseAnswer(Buffer.from("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")),
    ).toThrow(/chunk size/);
  });
});
