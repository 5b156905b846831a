// GET /console: the web console's bundle (console/, built by `npm run build:console` into
// console/dist). Static files need no credentials; the page's own API calls carry its token.
// Served with a CSP that allows nothing but this origin: no inline script or style, no frames.
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import type { AppEnv } from "../context.js";

export const CONSOLE_PATH = "/console";
/** Where console/build.ts writes the bundle. */
export const CONSOLE_DIST = fileURLToPath(new URL("../../console/dist", import.meta.url));

// The editor (CodeMirror) writes its base theme into a <style> element: that element, and only it,
// carries this response's nonce. Scripts get no nonce: every script is a file from 'self'.
const csp = (styleNonce: string) =>
  [
    "default-src 'self'",
    "script-src 'self'",
    `style-src 'self' 'nonce-${styleNonce}'`,
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join("; ");

const TYPES: Record<string, string> = {
  js: "text/javascript; charset=utf-8",
  css: "text/css; charset=utf-8",
};
const ASSET = /^[\w-]+\.(js|css)$/;

function secured(
  c: Context<AppEnv>,
  body: Uint8Array | string,
  type: string,
  cacheControl: string,
  styleNonce = "none",
): Response {
  c.header("content-security-policy", csp(styleNonce));
  c.header("x-content-type-options", "nosniff");
  c.header("referrer-policy", "no-referrer");
  c.header("cache-control", cacheControl);
  c.header("content-type", type);
  return c.body(typeof body === "string" ? body : new Uint8Array(body));
}

export function registerConsole(app: OpenAPIHono<AppEnv>, dist = CONSOLE_DIST): void {
  const index = async (c: Context<AppEnv>) => {
    try {
      // Revalidated every load: it names the content-hashed assets of the current build.
      const nonce = randomBytes(18).toString("base64");
      const html = (await readFile(join(dist, "index.html"), "utf8")).replace(
        "%STYLE_NONCE%",
        nonce,
      );
      return secured(c, html, "text/html; charset=utf-8", "no-cache", nonce);
    } catch {
      c.status(503);
      return secured(
        c,
        "The console is not built: run `npm run build:console`.\n",
        "text/plain; charset=utf-8",
        "no-store",
      );
    }
  };
  app.get(CONSOLE_PATH, index);
  app.get(`${CONSOLE_PATH}/`, index);
  app.get(`${CONSOLE_PATH}/assets/:name`, async (c) => {
    const name = c.req.param("name");
    const type = TYPES[name.split(".").pop() ?? ""];
    if (!ASSET.test(name) || type === undefined) return c.notFound();
    let body: Buffer;
    try {
      body = await readFile(join(dist, "assets", name));
    } catch {
      return c.notFound();
    }
    // Content-hashed names: a file under a name never changes.
    return secured(c, body, type, "public, max-age=31536000, immutable");
  });
}
