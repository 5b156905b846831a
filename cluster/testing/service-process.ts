// For the cluster's tests: a node (cluster/node-main.ts) or a gateway (gateway/main.ts) started
// by gateway/testing/gateway-process.ts's startService, optionally inside a network namespace
// (`ip netns exec NS`, which execs, so the pid is the service's).
import { fileURLToPath } from "node:url";
import { type ServiceProcess, startService } from "../../gateway/testing/gateway-process.js";

export const NODE_MAIN = fileURLToPath(new URL("../node-main.ts", import.meta.url));
export const NODE_READY = /sandfork node \S+ serving/;

export interface HostServiceOptions {
  /** The TypeScript entry point. */
  main: string;
  ready: RegExp;
  /** Set over this process's environment. */
  env: Record<string, string>;
  /** The network namespace to run in; undefined: this one. */
  netns?: string | undefined;
  startTimeoutMs: number;
}

export function startOnHost(options: HostServiceOptions): Promise<ServiceProcess> {
  return startService({
    main: options.main,
    ready: options.ready,
    env: { ...process.env, ...options.env },
    ...(options.netns === undefined ? {} : { launcher: ["ip", "netns", "exec", options.netns] }),
    startTimeoutMs: options.startTimeoutMs,
  });
}
