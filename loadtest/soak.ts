// `npm run soak` (flags: `-- --help`): the soak of loadtest/lib/soak.ts at full
// length (the KVM tier runs a short one: gateway/soak.kvm.test.ts). `--cpu-hog` spins a child on
// every core through the measured run and `--requests N` sends exactly N (`npm run soak:loaded`:
// 200 beside the hog). Prints the report as JSON and exits 1 when a check failed.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { commandLine } from "../gateway/cli/command-line.js";
import { soak } from "./lib/soak.js";

const { values, fail } = commandLine(
  "npm run soak -- [--seconds 120] [--concurrency 8] [--requests N] [--cpu-hog]",
  {
    seconds: { type: "string", default: "120" },
    concurrency: { type: "string", default: "8" },
    requests: { type: "string" },
    "cpu-hog": { type: "boolean", default: false },
  },
);
const seconds = Number(values.seconds);
const concurrency = Number(values.concurrency);
const requests = values.requests === undefined ? undefined : Number(values.requests);
for (const n of [seconds, concurrency, requests ?? 1]) {
  if (!Number.isSafeInteger(n) || n <= 0)
    fail("--seconds, --concurrency and --requests must be positive integers");
}
// The templates `npm run build` made, when there are; otherwise the soak builds its own.
const built = join(fileURLToPath(new URL("..", import.meta.url)), ".sandfork", "templates");
const report = await soak({
  seconds,
  concurrency,
  ...(requests === undefined ? {} : { requests }),
  cpuHog: values["cpu-hog"],
  ...(existsSync(join(built, "python")) ? { templatesDir: built } : {}),
  log: (line) => console.error(line),
});
console.log(JSON.stringify(report, null, 2));
if (report.failures.length > 0) {
  console.error(`soak failed:\n  ${report.failures.join("\n  ")}`);
  process.exitCode = 1;
}
