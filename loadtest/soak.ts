// `npm run soak` (flags: `-- --help`): the soak of loadtest/lib/soak.ts at full
// length (the KVM tier runs a short one: gateway/soak.kvm.test.ts). Prints the report as JSON and
// exits 1 when a check failed.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { commandLine } from "../gateway/cli/command-line.js";
import { soak } from "./lib/soak.js";

const { values, fail } = commandLine("npm run soak -- [--seconds 120] [--concurrency 8]", {
  seconds: { type: "string", default: "120" },
  concurrency: { type: "string", default: "8" },
});
const seconds = Number(values.seconds);
const concurrency = Number(values.concurrency);
if (!Number.isSafeInteger(seconds) || seconds <= 0 || !Number.isSafeInteger(concurrency) || concurrency <= 0) fail("--seconds and --concurrency must be positive integers");
// The templates `npm run build` made, when there are; otherwise the soak builds its own.
const built = join(fileURLToPath(new URL("..", import.meta.url)), ".sandfork", "templates");
const report = await soak({ seconds, concurrency, ...(existsSync(join(built, "python")) ? { templatesDir: built } : {}), log: (line) => console.error(line) });
console.log(JSON.stringify(report, null, 2));
if (report.failures.length > 0) {
  console.error(`soak failed:\n  ${report.failures.join("\n  ")}`);
  process.exitCode = 1;
}
