// GET /docs: Swagger UI for the OpenAPI document, its script and stylesheet served by the gateway
// from the swagger-ui-dist package installed with it. @hono/swagger-ui's page loads them from a
// CDN by default, which leaves the page blank on a closed network; here no request leaves the host.
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { swaggerUI } from "@hono/swagger-ui";
import type { OpenAPIHono } from "@hono/zod-openapi";
import type { AppEnv } from "./context.js";

export const DOCS_PATH = "/docs";
/** @hono/swagger-ui asks for `${baseUrl}/swagger-ui-dist/<file>`. */
const ASSETS_BASE = `${DOCS_PATH}/assets`;
export const DOCS_ASSET_ROUTE = `${ASSETS_BASE}/swagger-ui-dist/:file`;

/** The files the page loads, and their media types. */
const ASSET_TYPES: Record<string, string> = {
  "swagger-ui.css": "text/css; charset=utf-8",
  "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
};

export function registerDocs(app: OpenAPIHono<AppEnv>, openapiPath: string): void {
  const dist = dirname(createRequire(import.meta.url).resolve("swagger-ui-dist/package.json"));
  // Read once, on first use: the bundle is ~1.5 MB and most gateways never serve it.
  const loaded = new Map<string, Promise<Uint8Array<ArrayBuffer>>>();
  app.get(DOCS_ASSET_ROUTE, async (c) => {
    const file = c.req.param("file");
    const type = ASSET_TYPES[file];
    if (type === undefined) return c.notFound();
    let body = loaded.get(file);
    if (body === undefined) {
      body = readFile(join(dist, file)).then((bytes) => new Uint8Array(bytes));
      loaded.set(file, body);
    }
    return c.body(await body, 200, {
      "content-type": type,
      "cache-control": "public, max-age=86400",
    });
  });
  // validatorUrl "none": Swagger UI would otherwise ask validator.swagger.io about the document.
  app.get(
    DOCS_PATH,
    swaggerUI({
      url: openapiPath,
      baseUrl: ASSETS_BASE,
      validatorUrl: "none",
      title: "Sandfork gateway API",
    }),
  );
}
