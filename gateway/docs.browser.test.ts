// GET /docs in a real browser (Debian's chromium, driven by playwright-core) with every request
// that is not to this host aborted: the page must still render Swagger UI and list the
// operations, i.e. nothing it needs comes from the network. Fails (does not skip) without chromium:
// scripts/setup-debian.sh installs it.
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ServerType, serve } from "@hono/node-server";
import { type BrowserContext, chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DOCS_PATH } from "./app.js";
import { startTestGateway, type TestGateway } from "./testing/test-gateway.js";

const CHROMIUM = "/usr/bin/chromium";
const LOCAL_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);

describe("GET /docs in headless Chromium with no network beyond this host", () => {
  let gw: TestGateway;
  let server: ServerType;
  let origin: string;
  let profile: string;
  let browser: BrowserContext;
  const blocked: string[] = [];

  beforeAll(async () => {
    if (!existsSync(CHROMIUM))
      throw new Error(
        `${CHROMIUM} is missing: install Debian's chromium (scripts/setup-debian.sh)`,
      );
    gw = await startTestGateway("pglite");
    server = await new Promise<ServerType>((resolve) => {
      const s = serve({ fetch: gw.app.fetch, hostname: "127.0.0.1", port: 0 }, () => resolve(s));
    });
    origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    profile = await mkdtemp(join(tmpdir(), "sandfork-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    });
    await browser.route("**/*", (route) => {
      const url = new URL(route.request().url());
      if (LOCAL_HOSTS.has(url.hostname) || url.protocol === "data:") return route.continue();
      blocked.push(url.href);
      return route.abort("blockedbyclient");
    });
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    if (profile) await rm(profile, { recursive: true, force: true });
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    await gw?.dispose();
  });

  it("renders Swagger UI and lists the API's operations", async () => {
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${origin}${DOCS_PATH}`);
    await page.locator(".opblock").first().waitFor({ timeout: 30_000 });
    const operations = await page.locator(".opblock-summary-path").allInnerTexts();
    const listed = operations.map((text) => text.replace(/\u200b/g, "").trim());
    expect(listed).toEqual(
      expect.arrayContaining([
        "/v1/executions",
        "/v1/executions/{id}",
        "/v1/templates",
        "/v1/keys",
        "/v1/tokens",
        "/healthz",
      ]),
    );
    expect(await page.locator(".info .title").innerText()).toContain("Sandfork gateway");
    expect(errors).toEqual([]);
    expect(blocked).toEqual([]);
  }, 60_000);
});
