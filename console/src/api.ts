// The gateway's API as the console calls it: one short-lived token, held in this module's memory
// only (never in storage), sent on every call; the API key it was minted from is not kept.
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  /** A validation failure's issues: where in the request, and what is wrong there. */
  errors?: { path: string; message: string }[];
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly problem: Problem,
  ) {
    super(problem.detail ?? problem.title ?? `HTTP ${status}`);
  }
  get slug(): string {
    return (this.problem.type ?? "").split("/").pop() ?? "";
  }
}

export interface Session {
  token: string;
  scopes: string[];
  expiresAt: Date;
}

let current: Session | null = null;
let onSignedOut: (reason: string) => void = () => {};

export const session = () => current;
export const can = (scope: string) =>
  current !== null && (current.scopes.includes("admin") || current.scopes.includes(scope));
export function whenSignedOut(handler: (reason: string) => void): void {
  onSignedOut = handler;
}

export function signOut(reason = ""): void {
  current = null;
  onSignedOut(reason);
}

const TOKEN_TTL_SECONDS = 3600;
// The most the key may hand its token, tried in turn: the console shows what the token can do.
const SCOPE_SETS = [["execute", "usage:read", "admin"], ["execute", "usage:read"], ["execute"]];

/** Trades an API key for a token; the key itself is dropped when this returns. */
export async function signIn(apiKey: string): Promise<Session> {
  let last: ApiError | undefined;
  for (const scopes of SCOPE_SETS) {
    const response = await fetch("/v1/tokens", {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ ttl_seconds: TOKEN_TTL_SECONDS, scopes }),
    });
    const body = await readBody(response);
    if (response.ok) {
      const minted = body as { token: string; scopes: string[]; expires_at: string };
      current = {
        token: minted.token,
        scopes: minted.scopes,
        expiresAt: new Date(minted.expires_at),
      };
      return current;
    }
    last = new ApiError(response.status, body as Problem);
    if (last.slug !== "insufficient-scope") break;
  }
  throw last ?? new Error("sign-in failed");
}

async function readBody(response: Response): Promise<unknown> {
  const text = await response.text();
  try {
    return text === "" ? {} : JSON.parse(text);
  } catch {
    return { title: text.slice(0, 200) };
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  if (current === null) throw new ApiError(401, { title: "Signed out", detail: "sign in first" });
  return { authorization: `Bearer ${current.token}`, ...extra };
}

function failed(status: number, body: unknown): ApiError {
  const error = new ApiError(status, body as Problem);
  if (status === 401) signOut(error.message);
  return error;
}

export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await fetch(path, {
    method,
    headers: headers(body === undefined ? {} : { "content-type": "application/json" }),
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const parsed = await readBody(response);
  if (!response.ok) throw failed(response.status, parsed);
  return parsed as T;
}

/** A session file's URL: the path relative to /work, each component percent-encoded once. */
const fileUrl = (session: string, path: string) =>
  `/v1/sessions/${session}/files/${path.split("/").map(encodeURIComponent).join("/")}`;

/** PUT a file under a session's /work: the body is its bytes (a string is sent as UTF-8). */
export async function putSessionFile(
  session: string,
  path: string,
  content: Blob | string,
): Promise<{ path: string; bytes: number }> {
  const response = await fetch(fileUrl(session, path), {
    method: "PUT",
    headers: headers({ "content-type": "application/octet-stream" }),
    body: content,
  });
  const parsed = await readBody(response);
  if (!response.ok) throw failed(response.status, parsed);
  return parsed as { path: string; bytes: number };
}

/** GET a file under a session's /work, as its bytes. */
export async function getSessionFile(session: string, path: string): Promise<Blob> {
  const response = await fetch(fileUrl(session, path), { headers: headers() });
  if (!response.ok) throw failed(response.status, await readBody(response));
  return response.blob();
}

export interface StreamHandlers {
  started(id: string): void;
  output(stream: "stdout" | "stderr", data: string): void;
}

/** POST /v1/executions as Server-Sent Events: output as it arrives, then the execution record. */
export async function streamExecution<T>(request: unknown, on: StreamHandlers): Promise<T> {
  const response = await fetch("/v1/executions", {
    method: "POST",
    headers: headers({ "content-type": "application/json", accept: "text/event-stream" }),
    body: JSON.stringify(request),
  });
  if (!response.ok || response.body === null)
    throw failed(response.status, await readBody(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, "\n");
    for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      const payload = data.length > 0 ? JSON.parse(data.join("\n")) : {};
      if (event === "started") on.started(payload.id);
      else if (event === "output") on.output(payload.stream, payload.data);
      else if (event === "execution") {
        await reader.cancel().catch(() => {});
        return payload as T;
      } else if (event === "error") throw new ApiError(payload.status ?? 500, payload);
    }
  }
  throw new Error("the stream ended before the execution did");
}
