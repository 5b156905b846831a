// Network egress policies at the edge: the rule grammar (the same as the VMM's,
// native-vmm/src/net/policy.rs, which checks every rule again), the key's policy and a call's
// narrowing of it, and the grant the runtime gets: the key's list, then the token's and the
// call's, each allowed destination allowed by every list. No policy on the key: no network.
import { isIPv4, isIPv6 } from "node:net";
import { z } from "@hono/zod-openapi";
import type { NetworkPolicy } from "../db/keys.js";
import type { NetworkGrant } from "../runtime/execution-runtime.js";
import { ProblemError } from "./problems.js";

/** Rules per list at most (the VMM's MAX_RULES). */
export const MAX_NETWORK_RULES = 256;
/** A rule's text at most, in bytes. */
const MAX_RULE_BYTES = 300;
/** Connections at once a policy may allow at most (the VMM's clamp). */
export const MAX_NETWORK_CONNECTIONS = 1024;
/** Bytes in and out a run may move when no policy says (the VMM's default). */
export const DEFAULT_NETWORK_MAX_BYTES = 256 * 1024 * 1024;
/** Bytes in and out a policy may allow at most. */
const MAX_NETWORK_BYTES = 64 * 1024 * 1024 * 1024;

export const NETWORK_RULES_DOC =
  "A rule is `host[:ports]`: a domain (`example.com`, that name), `*.example.com` (names below it, not the name itself), " +
  "an address or CIDR (`192.0.2.7`, `203.0.113.0/24`, `[2001:db8::/32]`), with a port or range (`443`, `8000-8100`); " +
  "all ports when none is given. Loopback, link-local and metadata, private, shared, multicast, documentation and " +
  "reserved ranges and the host's own addresses are refused unless a CIDR rule inside the range names them (the exact /32 for one host)";

/** A domain as rules compare them (lower case, no trailing dot), or undefined when it is none. */
function normalizeName(name: string): string | undefined {
  const bare = (name.endsWith(".") ? name.slice(0, -1) : name).toLowerCase();
  const labels = bare.split(".");
  const valid =
    bare.length > 0 &&
    bare.length <= 253 &&
    labels.every((l) => l.length > 0 && l.length <= 63 && /^[a-z0-9_-]+$/.test(l));
  return valid ? bare : undefined;
}

function checkPorts(text: string): string | undefined {
  const port = (p: string) => (/^[0-9]+$/.test(p) && +p >= 1 && +p <= 65535 ? +p : undefined);
  const dash = text.indexOf("-");
  if (dash < 0) return port(text) === undefined ? `'${text}' is not a port (1-65535)` : undefined;
  const [lowText, highText] = [text.slice(0, dash), text.slice(dash + 1)];
  const low = port(lowText);
  if (low === undefined) return `'${lowText}' is not a port (1-65535)`;
  const high = port(highText);
  if (high === undefined) return `'${highText}' is not a port (1-65535)`;
  return low > high ? `port range ${low}-${high} is empty` : undefined;
}

/** An IPv6 address's 128 bits (the text already passed isIPv6, without a zone). */
function ipv6Bits(text: string): bigint {
  let groups = text;
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (v4?.[1] !== undefined) {
    const [a, b, c, d] = v4[1].split(".").map(Number) as [number, number, number, number];
    groups = `${text.slice(0, -v4[1].length)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = groups.includes("::") ? groups.split("::") : [groups, undefined];
  const parts = (s: string | undefined) => (s ? s.split(":") : []);
  const left = parts(head);
  const right = parts(tail);
  const all =
    tail === undefined
      ? left
      : [...left, ...Array(8 - left.length - right.length).fill("0"), ...right];
  return all.reduce((bits, group) => (bits << 16n) | BigInt(Number.parseInt(group, 16)), 0n);
}

function checkCidr(text: string): string | undefined {
  const slash = text.indexOf("/");
  const addr = slash < 0 ? text : text.slice(0, slash);
  const v4 = isIPv4(addr);
  if (!v4 && !(isIPv6(addr) && !addr.includes("%"))) return `'${addr}' is not an IP address`;
  const max = v4 ? 32 : 128;
  if (slash < 0) return undefined;
  const prefixText = text.slice(slash + 1);
  if (!/^[0-9]+$/.test(prefixText) || +prefixText > max)
    return `'/${prefixText}' is not a prefix length (0-${max})`;
  const bits = v4
    ? addr.split(".").reduce((n, octet) => (n << 8n) | BigInt(octet), 0n)
    : ipv6Bits(addr);
  const hostBits = BigInt(max - +prefixText);
  return (bits & ((1n << hostBits) - 1n)) === 0n
    ? undefined
    : `${text} has bits set past its prefix length`;
}

function checkName(text: string): string | undefined {
  const name = text.startsWith("*.") ? text.slice(2) : text;
  return normalizeName(name) === undefined ? `'${text}' is not a domain` : undefined;
}

/** Why `text` is not a rule, or undefined when it is one. */
export function ruleProblem(text: string): string | undefined {
  if (text.length === 0 || Buffer.byteLength(text) > MAX_RULE_BYTES)
    return `a rule is 1 to ${MAX_RULE_BYTES} bytes`;
  let host: string;
  let ports: string | undefined;
  if (text.startsWith("[")) {
    const close = text.indexOf("]");
    if (close < 0) return `'${text}': '[' without ']'`;
    host = text.slice(1, close);
    const after = text.slice(close + 1);
    if (after !== "") {
      if (!after.startsWith(":")) return `'${text}': only ':ports' may follow ']'`;
      ports = after.slice(1);
    }
    if (!host.includes(":")) return `'${host}' in brackets is not IPv6`;
  } else if (text.split(":").length > 2) {
    host = text;
  } else {
    const colon = text.indexOf(":");
    host = colon < 0 ? text : text.slice(0, colon);
    ports = colon < 0 ? undefined : text.slice(colon + 1);
  }
  const portProblem = ports === undefined ? undefined : checkPorts(ports);
  if (portProblem !== undefined) return portProblem;
  const first = host.charAt(0);
  if (host.includes(":") || host.includes("/") || /[0-9]/.test(first)) {
    // Names may start with a digit; only an all-numeric-and-dots one is an address.
    if (/^[A-Za-z0-9.-]*$/.test(host) && /[A-Za-z]/.test(host)) return checkName(host);
    return checkCidr(host);
  }
  return checkName(host);
}

export const NetworkRuleSchema = z
  .string()
  .superRefine((rule, ctx) => {
    const problem = ruleProblem(rule);
    if (problem !== undefined) ctx.addIssue({ code: "custom", message: problem });
  })
  .openapi({ example: "pypi.org:443", description: NETWORK_RULES_DOC });

const allowSchema = z.array(NetworkRuleSchema).max(MAX_NETWORK_RULES);
const maxConnectionsSchema = z.number().int().min(1).max(MAX_NETWORK_CONNECTIONS);
const maxBytesSchema = z.number().int().min(1).max(MAX_NETWORK_BYTES);

/** A key's network policy, as admins set it: what the key's executions may reach. */
export const NetworkPolicySchema = z
  .object({
    allow: allowSchema.min(1).openapi({ description: "What the key's executions may reach" }),
    max_connections: maxConnectionsSchema.optional().openapi({
      description: `Connections open at once per execution; default 32, at most ${MAX_NETWORK_CONNECTIONS}`,
    }),
    max_bytes: maxBytesSchema.optional().openapi({
      description: `Bytes received and sent per execution (or cell); past it the run ends network_exceeded. Default ${DEFAULT_NETWORK_MAX_BYTES}`,
    }),
  })
  .strict()
  .openapi("NetworkPolicy", {
    description: `The key's egress allowlist. No policy: no network at all. ${NETWORK_RULES_DOC}`,
  });

/** What a call (an execution, a cell, a token) asks for: it narrows its key's policy, never widens it. */
export const NetworkRequestSchema = z
  .object({
    allow: allowSchema.openapi({
      description:
        "Narrows the key's allowlist: a destination must be allowed by both (an empty list: no network for this call)",
    }),
    max_connections: maxConnectionsSchema
      .optional()
      .openapi({ description: "At most the key's (the lower one applies)" }),
    max_bytes: maxBytesSchema
      .optional()
      .openapi({ description: "At most the key's (the lower one applies)" }),
  })
  .strict()
  .openapi("NetworkRequest", {
    description: `Asking for it on a key without a network policy is refused (403 network-not-allowed). ${NETWORK_RULES_DOC}`,
  });

/** A policy or request as the schemas read it. */
export interface NetworkPolicyInput {
  allow: string[];
  max_connections?: number | undefined;
  max_bytes?: number | undefined;
}

export function networkPolicyOf(input: NetworkPolicyInput): NetworkPolicy {
  return {
    allow: input.allow,
    ...(input.max_connections === undefined ? {} : { maxConnections: input.max_connections }),
    ...(input.max_bytes === undefined ? {} : { maxBytes: input.max_bytes }),
  };
}

export function networkPolicyJson(policy: NetworkPolicy | null): NetworkPolicyInput | null {
  if (policy === null) return null;
  return {
    allow: policy.allow,
    ...(policy.maxConnections === undefined ? {} : { max_connections: policy.maxConnections }),
    ...(policy.maxBytes === undefined ? {} : { max_bytes: policy.maxBytes }),
  };
}

/**
 * The grant for a run: `held` is what the credential carries (the key's policy, then a token's
 * narrowing; empty: the key has no policy), `asked` the call's narrowing. Undefined: no network.
 * A call that asks for network on a key without a policy is refused (403 network-not-allowed).
 */
export function networkGrant(
  held: readonly NetworkPolicy[],
  asked: NetworkPolicy | undefined,
): NetworkGrant | undefined {
  if (held.length === 0) {
    if (asked === undefined) return undefined;
    throw new ProblemError(
      "network-not-allowed",
      "this key has no network policy; an admin sets one on the key (PUT /v1/keys/{id}/network)",
    );
  }
  const stack = asked === undefined ? held : [...held, asked];
  const least = (values: (number | undefined)[]) => {
    const set = values.filter((v): v is number => v !== undefined);
    return set.length === 0 ? undefined : Math.min(...set);
  };
  return {
    allowlists: stack.map((p) => p.allow),
    maxConnections: least(stack.map((p) => p.maxConnections)),
    maxBytes: least(stack.map((p) => p.maxBytes)),
  };
}

/** The most bytes a grant lets a run move: what its reservation covers. */
export function grantedBytes(grant: NetworkGrant): number {
  return grant.maxBytes ?? DEFAULT_NETWORK_MAX_BYTES;
}
