// The load tests' HTTP client: node:http with a keep-alive pool, a lighter client than fetch, so
// the figures are the servers'.
import { Agent, request as httpRequest } from "node:http";

export type Call = (method: "GET" | "POST", url: string, headers?: Record<string, string>, body?: string) => Promise<{ status: number; body: string }>;

/** A client keeping up to `maxSockets` connections open; `destroy` closes them. */
export function keepAliveClient(maxSockets: number): { call: Call; destroy(): void } {
  const agent = new Agent({ keepAlive: true, maxSockets });
  // One request; the body is read in full so the connection is reused.
  const call: Call = (method, url, headers = {}, body) =>
    new Promise((resolve, reject) => {
      const req = httpRequest(url, { method, headers, agent }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end(body);
    });
  return { call, destroy: () => agent.destroy() };
}
