// Failures of the runtime itself (not of the user's program). The gateway releases the credit
// reservation for these: nothing ran, or what ran cannot be reported.

/** The runtime lost (or never had) its connection to the daemon, or cannot create VMs. Retryable. */
export class RuntimeUnavailableError extends Error {
  constructor(message = "the execution runtime is not connected") {
    super(message);
    this.name = "RuntimeUnavailableError";
  }
}

/** The daemon is at its concurrency limit (protocol error `busy`). Retryable shortly. */
export class RuntimeBusyError extends Error {
  constructor(message = "the execution runtime is at capacity") {
    super(message);
    this.name = "RuntimeBusyError";
  }
}
