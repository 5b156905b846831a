// Sandfork's Worker defaults for the Node template, preloaded into the agent's main thread and
// into every Worker (`--require`, NODE_AGENT in native-vmm/src/agent.rs: a Worker inherits its
// parent's preloads, so a Worker started by a Worker gets the defaults too). A Worker applies
// them as it loads this file; the agent does once its own warm-up has loaded the built-in
// modules (applied before that, a fork copied ~100 pages more per execution: bench exec).
//
// A Worker is a V8 isolate of its own, which reserves a range for its JIT code when it starts:
// 512 MiB unless `resourceLimits.codeRangeSizeMb` says otherwise. In the VM reserved address
// space is memory (README.md, "Memory"), and the main isolate's own 512 MiB range leaves about
// 440 MiB of the template's 1024 to a request, so a Worker with Node's default does not fit.
// Workers get a 32 MiB range unless their options name a size: ten times the code the
// TypeScript compiler generates running in a Worker (~3 MiB); an idle Worker then holds ~44 MiB.
"use strict";

const Module = require("node:module");
const workerThreads = require("node:worker_threads");

const WORKER_CODE_RANGE_MB = 32;

/** `options` with the code range default; options Node would reject are left to it. */
function withCodeRange(options) {
  if (options === undefined) return { resourceLimits: { codeRangeSizeMb: WORKER_CODE_RANGE_MB } };
  if (options === null || typeof options !== "object") return options;
  const limits = options.resourceLimits;
  if (limits === undefined)
    return { ...options, resourceLimits: { codeRangeSizeMb: WORKER_CODE_RANGE_MB } };
  if (limits === null || typeof limits !== "object" || limits.codeRangeSizeMb !== undefined)
    return options;
  return { ...options, resourceLimits: { ...limits, codeRangeSizeMb: WORKER_CODE_RANGE_MB } };
}

/** Replaces the Worker class by one that applies the default. */
function applyWorkerDefaults() {
  const NodeWorker = workerThreads.Worker;
  workerThreads.Worker = class Worker extends NodeWorker {
    // `options = undefined`: Worker.length stays 1, as Node's.
    constructor(filename, options = undefined) {
      super(filename, withCodeRange(options));
    }
  };
  // `import { Worker } from "node:worker_threads"` sees the replacement too.
  Module.syncBuiltinESMExports();
}

if (!workerThreads.isMainThread) applyWorkerDefaults();
module.exports = { applyWorkerDefaults };
