// For the cluster test: hosts as network namespaces this process makes, each joined by a veth
// pair to a bridge of its own in a private test range (10.217.N.0/24, N chosen free), so that
// every server the test runs listens inside a namespace it made (or on loopback), and nothing
// it sends leaves the machine. Everything made is removed by `remove()`.
import { execFileSync } from "node:child_process";

function ip(args: string[]): string {
  return execFileSync("ip", args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

export interface TestHost {
  name: string;
  /** The namespace's name (for `ip netns exec`). */
  netns: string;
  address: string;
}

export interface TestNetwork {
  /** The bridge's address: this (root) namespace's side, from which the test reaches the hosts. */
  gateway: string;
  subnet: string;
  hosts: Map<string, TestHost>;
  /** Every process in host `name`'s namespace. */
  pids(name: string): number[];
  remove(): void;
}

/** A /24 in 10.217.0.0/16 that no interface here uses yet. */
function freeSubnet(): number {
  const used = ip(["-4", "-o", "addr"]);
  for (let attempt = 0; attempt < 64; attempt++) {
    const n = 1 + Math.floor(Math.random() * 250);
    if (!used.includes(`10.217.${n}.`)) return n;
  }
  throw new Error("no free 10.217.N.0/24 for the test network");
}

/** Makes the bridge and one namespace per name, at 10.217.N.(10 + index). */
export function makeTestNetwork(names: string[]): TestNetwork {
  const tag = (process.pid % 100_000).toString(36);
  const n = freeSubnet();
  const bridge = `sfkbr${tag}`;
  const made: (() => void)[] = [];
  const remove = () => {
    for (const undo of made.reverse()) {
      try {
        undo();
      } catch {
        // Already gone (a namespace takes its veth end with it).
      }
    }
    made.length = 0;
  };
  const hosts = new Map<string, TestHost>();
  // A kernel that has them as modules and does not load them on demand (the QEMU guest's).
  try {
    execFileSync("modprobe", ["-a", "bridge", "veth"], { stdio: "ignore" });
  } catch {
    // Built in, or loaded on demand: `ip link add` says if not.
  }
  try {
    ip(["link", "add", bridge, "type", "bridge"]);
    made.push(() => ip(["link", "del", bridge]));
    ip(["addr", "add", `10.217.${n}.1/24`, "dev", bridge]);
    ip(["link", "set", bridge, "up"]);
    names.forEach((name, index) => {
      const netns = `sfk${tag}-${name}`;
      const outside = `sfv${tag}${index}`;
      const address = `10.217.${n}.${10 + index}`;
      ip(["netns", "add", netns]);
      made.push(() => ip(["netns", "del", netns]));
      ip(["link", "add", outside, "type", "veth", "peer", "name", `${outside}p`]);
      made.push(() => ip(["link", "del", outside]));
      ip(["link", "set", `${outside}p`, "netns", netns]);
      ip(["link", "set", outside, "master", bridge, "up"]);
      const inside = (args: string[]) => ip(["-n", netns, ...args]);
      inside(["link", "set", `${outside}p`, "name", "eth0"]);
      inside(["addr", "add", `${address}/24`, "dev", "eth0"]);
      inside(["link", "set", "eth0", "up"]);
      inside(["link", "set", "lo", "up"]);
      hosts.set(name, { name, netns, address });
    });
  } catch (error) {
    remove();
    throw error;
  }
  return {
    gateway: `10.217.${n}.1`,
    subnet: `10.217.${n}.0/24`,
    hosts,
    pids(name) {
      const host = hosts.get(name);
      if (host === undefined) return [];
      return ip(["netns", "pids", host.netns])
        .split("\n")
        .filter((line) => line.trim() !== "")
        .map(Number);
    },
    remove,
  };
}
