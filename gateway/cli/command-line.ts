// The npm command-line tools' flags (keys:create, loadtest, soak): --help prints the usage; an
// unknown flag or a bad value prints what is wrong and the usage and exits with status 2, instead
// of a stack trace.
import { type ParseArgsConfig, parseArgs } from "node:util";

type Options = NonNullable<ParseArgsConfig["options"]>;

export interface CommandLine<O extends Options> {
  values: ReturnType<typeof parseArgs<{ options: O }>>["values"];
  /** Prints `message` and the usage to stderr and exits with status 2. */
  fail(message: string): never;
}

export function commandLine<const O extends Options>(
  usage: string,
  options: O,
  args: string[] = process.argv.slice(2),
): CommandLine<O> {
  const fail = (message: string): never => {
    process.stderr.write(`${message}\n\nusage: ${usage}\n`);
    process.exit(2);
  };
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(`usage: ${usage}\n`);
    process.exit(0);
  }
  try {
    return { values: parseArgs({ args, options }).values, fail };
  } catch (error) {
    return fail(error instanceof Error ? error.message : String(error));
  }
}
