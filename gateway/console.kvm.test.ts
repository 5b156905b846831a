// The web console (/console) in Debian's chromium, driven by playwright-core, against a real
// gateway and the supervised sandfork-vmm daemon on PGlite: sign in with an admin key, run
// print(6*7) with its output streamed, a program that reads an input file (and a refused file
// path's 422), a program that times out, create and revoke a key (which then gets 401), a session
// with two cells and a file uploaded, read from a cell and downloaded, and the executions list and
// usage chart after them.
// Every page is scanned with axe-core (no serious or critical violations) and photographed: the
// screenshots go to the test's temp dir and to docs/console/. Requests off this host are aborted,
// so the console works offline; a CSP violation fails the test.
//
// KVM tier only (vitest.kvm.config.ts): it runs guests.
import { copyFile, mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { type ServerType, serve } from "@hono/node-server";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildConsole, isBuilt } from "../console/build.js";
import type { StartedRuntime } from "../runtime/start.js";
import { timeScale } from "./testing/kvm-tier.js";
import { startPythonGateway } from "./testing/python-gateway.js";
import type { TestGateway } from "./testing/test-gateway.js";

const CHROMIUM = "/usr/bin/chromium";
const LOCAL_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);
const REPO = join(dirname(fileURLToPath(import.meta.url)), "..");
const DOCS_SHOTS = join(REPO, "docs", "console");
const WAIT = 30_000 * timeScale;

let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;
let server: ServerType;
let origin: string;
let browser: Browser;
let context: BrowserContext;
const log: string[] = [];
const blocked: string[] = [];
const cspViolations: string[] = [];
const pageErrors: string[] = [];

beforeAll(async () => {
  if (!isBuilt()) await buildConsole();
  dir = await mkdtemp(join(tmpdir(), "sfk-console-"));
  ({ runtime, gw } = await startPythonGateway(dir, log));
  server = await new Promise<ServerType>((resolve) => {
    const s = serve({ fetch: gw.app.fetch, hostname: "127.0.0.1", port: 0 }, () => resolve(s));
  });
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--no-first-run",
    ],
  });
  context = await browser.newContext({
    viewport: { width: 1280, height: 900 },
    colorScheme: "light",
  });
  await context.route("**/*", (route) => {
    const url = new URL(route.request().url());
    if (LOCAL_HOSTS.has(url.hostname) || url.protocol === "data:") return route.continue();
    blocked.push(url.href);
    return route.abort("blockedbyclient");
  });
}, 240_000 * timeScale);

afterAll(async () => {
  await context?.close();
  await browser?.close();
  await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  await gw?.dispose();
  await runtime?.stop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

function watch(page: Page): void {
  page.on("pageerror", (e) => pageErrors.push(e.message));
  page.on("console", (message) => {
    if (/Content Security Policy/i.test(message.text()))
      cspViolations.push(`${page.url()}: ${message.text()}`);
  });
  page.on("dialog", (dialog) => void dialog.accept());
}

/** axe-core's serious and critical violations on the page as it is now. */
async function axeViolations(page: Page): Promise<string[]> {
  const source = await readFile(join(REPO, "node_modules", "axe-core", "axe.min.js"), "utf8");
  // Evaluated by the driver, which the page's CSP does not govern (a script tag would be refused).
  await page.evaluate(source);
  const violations = await page.evaluate<
    { id: string; impact: string; help: string; targets: string[] }[]
  >(
    `axe.run(document, { resultTypes: ["violations"] }).then((r) => r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, targets: v.nodes.map((n) => n.target.join(" ")) })))`,
  );
  return violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id} (${v.impact}): ${v.help} at ${v.targets.join(", ")}`);
}

async function shoot(page: Page, name: string): Promise<void> {
  const shots = join(dir, "screenshots");
  await mkdir(shots, { recursive: true });
  const path = join(shots, `${name}.png`);
  // A full-page capture takes Chromium down under a software CPU (the QEMU path), whose
  // screenshots the docs do not keep: there the viewport is captured.
  const onSoftwareCpu = timeScale > 1;
  await page.screenshot({ path, fullPage: !onSoftwareCpu });
  if (onSoftwareCpu) return;
  await mkdir(DOCS_SHOTS, { recursive: true });
  await copyFile(path, join(DOCS_SHOTS, `${name}.png`));
}

async function setCode(page: Page, code: string): Promise<void> {
  await page.locator(".cm-content").click();
  await page.keyboard.press("Control+A");
  await page.keyboard.press("Delete");
  await page.keyboard.insertText(code);
}

describe("the web console in chromium, against a gateway and daemon on KVM", () => {
  it(
    "signs in, runs code with streamed output, manages keys and sessions, and shows usage",
    async () => {
      const { key: adminKey } = await gw.issue({ scopes: ["admin"], credits: 100_000 });
      const page = await context.newPage();
      // Navigation and actions wait as long as the waits above (scaled on a software CPU).
      page.setDefaultTimeout(WAIT);
      watch(page);
      const accessibility: string[] = [];
      const scan = async (name: string) =>
        accessibility.push(...(await axeViolations(page)).map((v) => `${name}: ${v}`));

      // The bundle loads without credentials, under a strict CSP.
      const response = await page.goto(`${origin}/console`);
      expect(response?.status()).toBe(200);
      const csp = response?.headers()["content-security-policy"] ?? "";
      expect(csp).toContain("default-src 'self'");
      expect(csp).toContain("script-src 'self'");
      expect(csp).not.toContain("unsafe-inline");
      await page.getByLabel("API key").waitFor({ timeout: WAIT });
      await scan("sign-in");
      await shoot(page, "sign-in");

      await page.getByLabel("API key").fill(adminKey);
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.getByRole("navigation", { name: "Console sections" }).waitFor({ timeout: WAIT });
      // The key was traded for a token kept in memory: nothing is stored.
      expect(
        await page.evaluate("[localStorage.length, sessionStorage.length, document.cookie]"),
      ).toEqual([0, 0, ""]);

      // Usage before anything ran.
      await page.getByRole("link", { name: "Usage" }).click();
      const chartTotal = page.getByTestId("chart-total");
      await chartTotal.waitFor({ timeout: WAIT });
      const totalBefore = Number((await chartTotal.innerText()).match(/Total: (\d+)/)?.[1]);
      expect(totalBefore).toBe(0);

      // Playground: output streamed as the program writes it, then the record.
      await page.getByRole("link", { name: "Playground" }).click();
      const status = page.getByTestId("run-status");
      const output = page.getByTestId("output");
      await page.getByLabel("Template").waitFor({ timeout: WAIT });
      await expect
        .poll(() => page.getByLabel("Template").inputValue(), { timeout: WAIT })
        .toBe("python");
      await setCode(page, 'import time\nprint("first", flush=True)\ntime.sleep(1.5)\nprint(6*7)');
      await page.getByRole("button", { name: "Run" }).click();
      await expect.poll(() => output.innerText(), { timeout: WAIT }).toContain("first");
      // Streamed: the first line is shown while the run is still going.
      expect(await status.innerText()).toMatch(/^Running /);
      await expect
        .poll(() => status.innerText(), { timeout: WAIT })
        .toBe("completed (exit code 0)");
      expect(await output.innerText()).toBe("first\n42\n");

      await setCode(page, "print(6*7)");
      await page.getByRole("button", { name: "Run" }).click();
      await expect
        .poll(() => status.innerText(), { timeout: WAIT })
        .toBe("completed (exit code 0)");
      expect((await output.innerText()).trim()).toBe("42");
      await expect.poll(() => page.locator(".facts").innerText()).toMatch(/Charged\s+\d+ credits/);

      // Input files: a path the gateway refuses is its 422, with where and why; then one it takes.
      await page.getByRole("button", { name: "Add file" }).click();
      await page.getByLabel("Path", { exact: true }).fill("/work/data.txt");
      await page.getByLabel("Content", { exact: true }).fill("hello from a file");
      await setCode(page, "print(open('/work/data.txt').read())");
      await page.getByRole("button", { name: "Run", exact: true }).click();
      const runError = page.getByRole("alert");
      await expect.poll(() => runError.innerText(), { timeout: WAIT }).toContain("(422)");
      expect(await runError.innerText()).toContain("files.0.path: absolute paths are not allowed");
      await page.getByLabel("Path", { exact: true }).fill("data.txt");
      await page.getByRole("button", { name: "Run", exact: true }).click();
      await expect
        .poll(() => status.innerText(), { timeout: WAIT })
        .toBe("completed (exit code 0)");
      expect(await output.innerText()).toBe("hello from a file\n");
      expect(await runError.isVisible()).toBe(false);
      await scan("playground");
      await shoot(page, "playground");

      await setCode(page, "while True: pass");
      await page.getByLabel("Timeout (ms)").fill(String(1_000 * timeScale));
      await page.getByRole("button", { name: "Run" }).click();
      await expect.poll(() => status.innerText(), { timeout: WAIT }).toBe("timed_out");
      await shoot(page, "playground-timed-out");

      // Keys: create one (its secret shown once), check it works, revoke it, check it is refused.
      await page.getByRole("link", { name: "Keys" }).click();
      await page.getByLabel("Name").fill("console-test");
      await page.getByLabel("Credits").fill("500");
      await page.getByRole("button", { name: "Create key" }).click();
      const secret = (await page.getByTestId("new-secret").innerText({ timeout: WAIT })).trim();
      expect(secret).toMatch(/^sfk_/);
      expect((await gw.call("GET", "/v1/templates", { credential: secret })).status).toBe(200);
      await page.getByRole("button", { name: "Copy" }).waitFor();
      await scan("keys");
      await shoot(page, "keys");
      await page.getByRole("button", { name: "Revoke console-test" }).click();
      await page.getByRole("row", { name: /console-test.*revoked/ }).waitFor({ timeout: WAIT });
      expect((await gw.call("GET", "/v1/templates", { credential: secret })).status).toBe(401);

      // Sessions: create one and run two cells in it.
      await page.getByRole("link", { name: "Sessions" }).click();
      await expect
        .poll(() => page.locator("#main select").first().inputValue(), { timeout: WAIT })
        .toBe("python");
      await page.getByRole("button", { name: "Create session" }).click();
      const cell = page.getByLabel("Cell", { exact: true });
      await cell.waitFor({ timeout: WAIT });
      await cell.fill("x = 6 * 7\nx");
      await page.getByRole("button", { name: "Run cell" }).click();
      await expect
        .poll(() => page.getByTestId("cell-value").allInnerTexts(), { timeout: WAIT })
        .toEqual(["→ 42"]);
      await cell.fill("x + 1");
      await page.getByRole("button", { name: "Run cell" }).click();
      await expect
        .poll(() => page.getByTestId("cell-value").allInnerTexts(), { timeout: WAIT })
        .toEqual(["→ 42", "→ 43"]);
      // The list shows the session with its two cells (the fourth column).
      await expect
        .poll(() => page.locator("#main tbody tr").first().locator("td").nth(3).innerText(), {
          timeout: WAIT,
        })
        .toBe("2");

      // Session files: upload text at a path, read it from a cell, download it.
      await page.getByLabel("File path").fill("hello.txt");
      await page.getByLabel("File content").fill("uploaded text");
      await page.getByRole("button", { name: "Upload" }).click();
      await expect
        .poll(() => page.getByTestId("session-files").innerText(), { timeout: WAIT })
        .toContain("hello.txt 13 bytes");
      await cell.fill("open('/work/hello.txt').read()");
      await page.getByRole("button", { name: "Run cell" }).click();
      await expect
        .poll(() => page.getByTestId("cell-value").allInnerTexts(), { timeout: WAIT })
        .toEqual(["→ 42", "→ 43", "→ 'uploaded text'"]);
      const downloading = page.waitForEvent("download", { timeout: WAIT });
      await page.getByRole("button", { name: "Download hello.txt" }).click();
      const downloaded = await downloading;
      expect(downloaded.suggestedFilename()).toBe("hello.txt");
      expect(await readFile(await downloaded.path(), "utf8")).toBe("uploaded text");
      await scan("sessions");
      await shoot(page, "sessions");

      // Usage after: the executions are listed and the chart's total went up.
      await page.getByRole("link", { name: "Usage" }).click();
      const table = page.getByTestId("executions");
      await expect.poll(() => table.innerText(), { timeout: WAIT }).toContain("timed_out");
      expect(await table.innerText()).toContain("completed");
      const totalAfter = Number(
        (await page.getByTestId("chart-total").innerText()).match(/Total: (\d+)/)?.[1],
      );
      expect(totalAfter).toBeGreaterThan(totalBefore);
      await page.getByLabel("Status").selectOption("timed_out");
      await expect
        .poll(
          async () =>
            (await table.locator("tbody tr").allInnerTexts()).every((row) =>
              row.includes("timed_out"),
            ),
          { timeout: WAIT },
        )
        .toBe(true);
      await page.getByLabel("Status").selectOption("");
      await expect
        .poll(() => table.locator("tbody tr").count(), { timeout: WAIT })
        .toBeGreaterThan(2);
      await scan("usage");
      await shoot(page, "usage");

      // Dark, at phone width.
      await page.emulateMedia({ colorScheme: "dark" });
      await page.setViewportSize({ width: 390, height: 844 });
      await scan("usage (dark, phone)");
      await shoot(page, "usage-dark-phone");
      await page.getByRole("link", { name: "Sessions" }).click();
      await page
        .getByRole("button", { name: /^Open session/ })
        .first()
        .click();
      await page.getByLabel("File path").waitFor({ timeout: WAIT });
      await scan("sessions (dark, phone)");
      await shoot(page, "sessions-dark-phone");
      await page.getByRole("link", { name: "Playground" }).click();
      await page.getByRole("button", { name: "Add file" }).click();
      await page.getByLabel("Path", { exact: true }).fill("data.txt");
      await scan("playground (dark, phone)");
      await shoot(page, "playground-dark-phone");

      // Sign out forgets the token.
      await page.getByRole("button", { name: "Sign out" }).click();
      await page.getByLabel("API key").waitFor();
      expect(await page.getByRole("navigation", { name: "Console sections" }).isVisible()).toBe(
        false,
      );

      expect(accessibility).toEqual([]);
      expect(cspViolations).toEqual([]);
      expect(pageErrors).toEqual([]);
      expect(blocked).toEqual([]);
    },
    300_000 * timeScale,
  );
});
