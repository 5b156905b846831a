// Failures of the runtime itself (not of the user's program). The gateway releases the credit
// reservation for these: nothing ran, or what ran cannot be reported.
//
// Every class carries the protocol's error `code` (native-vmm/PROTOCOL.md, "Errors") or a code of
// the client's own, and whether the same request may succeed later (`retryable`). The gateway
// maps RuntimeUnavailableError (and its subclass) to 503 runtime-unavailable, RuntimeBusyError
// (and its subclass) to 503 runtime-busy, anything else to 502 runtime-failed.

/** The error codes of protocol v1's error frames. */
export type DaemonErrorCode =
  | "bad_frame"
  | "bad_request"
  | "unsupported_protocol"
  | "unknown_template"
  | "unavailable"
  | "busy"
  | "internal"
  | "not_found"
  | "session_ended";

/** Codes the client assigns to failures that are not a daemon's error frame. */
export type ClientErrorCode =
  | "not_connected"
  | "connection_lost"
  | "queue_full"
  | "timeout"
  | "frame_too_large"
  | "protocol_violation";

export abstract class RuntimeError extends Error {
  abstract readonly retryable: boolean;
  readonly code: DaemonErrorCode | ClientErrorCode;

  constructor(
    code: DaemonErrorCode | ClientErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.code = code;
  }
}

/**
 * The runtime lost (or never had) its connection to the daemon, or cannot create VMs (protocol
 * `unavailable`: no KVM, template not ready). Retryable.
 */
export class RuntimeUnavailableError extends RuntimeError {
  readonly retryable = true;

  constructor(
    message = "the execution runtime is not connected",
    code: "unavailable" | "not_connected" | "connection_lost" = "not_connected",
  ) {
    super(code, message);
    this.name = "RuntimeUnavailableError";
  }
}

/**
 * The connection to the daemon closed (or the daemon died) while this request was in flight.
 * Whether the request ran is unknown; its result is lost. Retryable.
 */
export class RuntimeConnectionLostError extends RuntimeUnavailableError {
  constructor(message: string) {
    super(message, "connection_lost");
    this.name = "RuntimeConnectionLostError";
  }
}

/**
 * The daemon is at one of its bounds (protocol error `busy`, whose `reason` names it:
 * queue_full, template_queue_full, key_queue_full, connections_full, sessions_full). Retryable
 * shortly.
 */
export class RuntimeBusyError extends RuntimeError {
  readonly retryable = true;

  constructor(
    message = "the execution runtime is at capacity",
    code: "busy" | "queue_full" = "busy",
    readonly reason?: string,
  ) {
    super(code, message);
    this.name = "RuntimeBusyError";
  }
}

/** The client's own bound on waiting requests is reached; the request was not sent. Retryable. */
export class RuntimeQueueFullError extends RuntimeBusyError {
  constructor(message: string) {
    super(message, "queue_full");
    this.name = "RuntimeQueueFullError";
  }
}

/** The daemon failed on its side (protocol error `internal`); the request was not run. Retryable. */
export class RuntimeInternalError extends RuntimeError {
  readonly retryable = true;

  constructor(message: string) {
    super("internal", message);
    this.name = "RuntimeInternalError";
  }
}

/** No answer within the request's deadline. The daemon may still be running it. Retryable. */
export class RuntimeTimeoutError extends RuntimeError {
  readonly retryable = true;

  constructor(message: string) {
    super("timeout", message);
    this.name = "RuntimeTimeoutError";
  }
}

/**
 * The daemon refused the request as given (`bad_request`, `unknown_template`, `bad_frame`,
 * `unsupported_protocol`; for sessions `not_found` and `session_ended`), or the client could not encode it (`frame_too_large`). Sending it
 * again unchanged fails again.
 */
export class RuntimeRequestError extends RuntimeError {
  readonly retryable = false;

  constructor(
    code:
      | "bad_frame"
      | "bad_request"
      | "unsupported_protocol"
      | "unknown_template"
      | "frame_too_large"
      | "not_found"
      | "session_ended",
    message: string,
  ) {
    super(code, message);
    this.name = "RuntimeRequestError";
  }
}

/** The daemon answered with something protocol v1 does not allow (a client or daemon bug). */
export class RuntimeProtocolError extends RuntimeError {
  readonly retryable = false;

  constructor(message: string, options?: { cause?: unknown }) {
    super("protocol_violation", message, options);
    this.name = "RuntimeProtocolError";
  }
}
