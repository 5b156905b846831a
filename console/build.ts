// Bundles the web console (console/index.html, src/, styles.css) into console/dist with esbuild:
// content-hashed script and stylesheet, and an index.html that names them. Everything the page
// loads comes from the gateway itself: no CDN, nothing inline, so a strict CSP holds.
import { createHash } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

export const CONSOLE_SOURCE = dirname(fileURLToPath(import.meta.url));
export const CONSOLE_DIST = join(CONSOLE_SOURCE, "dist");
const STAMP = ".source-hash";

/** A hash of the console's sources: the bundle in dist is current when it was built from them. */
export function sourceHash(): string {
  const hash = createHash("sha256");
  const walk = (dir: string) => {
    for (const name of readdirSync(dir).sort()) {
      const path = join(dir, name);
      if (name === "dist" || name === "node_modules") continue;
      if (statSync(path).isDirectory()) walk(path);
      else hash.update(relative(CONSOLE_SOURCE, path)).update("\0").update(readFileSync(path));
    }
  };
  walk(CONSOLE_SOURCE);
  return hash.digest("hex");
}

export function isBuilt(outDir = CONSOLE_DIST): boolean {
  try {
    return readFileSync(join(outDir, STAMP), "utf8") === sourceHash();
  } catch {
    return false;
  }
}

/** Builds the console into outDir (replacing what is there). */
export async function buildConsole(outDir = CONSOLE_DIST): Promise<void> {
  const hash = sourceHash();
  rmSync(outDir, { recursive: true, force: true });
  const assets = join(outDir, "assets");
  const result = await build({
    entryPoints: {
      app: join(CONSOLE_SOURCE, "src", "main.ts"),
      style: join(CONSOLE_SOURCE, "styles.css"),
    },
    bundle: true,
    format: "esm",
    target: "es2022",
    minify: true,
    sourcemap: false,
    legalComments: "none",
    entryNames: "[name]-[hash]",
    outdir: assets,
    metafile: true,
    logLevel: "warning",
  });
  const outputs = Object.keys(result.metafile.outputs).map((path) => relative(assets, path));
  const script = outputs.find((name) => name.startsWith("app-") && name.endsWith(".js"));
  const style = outputs.find((name) => name.startsWith("style-") && name.endsWith(".css"));
  if (script === undefined || style === undefined)
    throw new Error(`esbuild wrote ${outputs.join(", ")}`);
  const html = readFileSync(join(CONSOLE_SOURCE, "index.html"), "utf8")
    .replace("%SCRIPT%", `/console/assets/${script}`)
    .replace("%STYLE%", `/console/assets/${style}`);
  mkdirSync(outDir, { recursive: true });
  writeFileSync(join(outDir, "index.html"), html);
  writeFileSync(join(outDir, STAMP), hash);
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  // Skipped when the bundle is current (each `npm start` asks), unless --force.
  if (!process.argv.includes("--force") && isBuilt()) process.exit(0);
  await buildConsole();
  console.log(`console built in ${relative(process.cwd(), CONSOLE_DIST) || "."}`);
}
