// A CPU hog, as a busy neighbour would be: a child process spinning on each core at nice 0.
import { type ChildProcess, spawn } from "node:child_process";
import { availableParallelism, setPriority } from "node:os";

export interface CpuHog {
  cores: number;
  /** Ends every child (SIGKILL); idempotent. */
  stop(): void;
}

export function startCpuHog(cores = availableParallelism()): CpuHog {
  const children: ChildProcess[] = [];
  for (let i = 0; i < cores; i++) {
    const child = spawn(process.execPath, ["-e", "for (;;) {}"], { stdio: "ignore" });
    if (child.pid !== undefined) {
      try {
        setPriority(child.pid, 0);
      } catch {
        // Raising a child's priority back to 0 needs privileges where this process runs niced.
      }
    }
    children.push(child);
  }
  // Not left spinning when this process ends without stopping them.
  const stop = () => {
    for (const child of children)
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  };
  process.once("exit", stop);
  return {
    cores,
    stop() {
      stop();
      process.off("exit", stop);
    },
  };
}
