// Failures of the runtime itself (not of the user's program). The gateway releases the credit
// reservation for these: nothing ran, or what ran cannot be reported.

/** The runtime lost (or never had) its connection to the daemon. Retryable. */
export class RuntimeUnavailableError extends Error {
  constructor(message = "the execution runtime is not connected") {
    super(message);
    this.name = "RuntimeUnavailableError";
  }
}
