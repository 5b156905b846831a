// What stateful sessions cost and how far a key may use them (gateway/session-service.ts).

import type { SessionRates } from "../db/sessions.js";
import { positiveIntegerFromEnv } from "../runtime/config.js";

export interface SessionSettings extends SessionRates {
  /** Charged for each cell a session runs (as an execution of the session's template). */
  unitsPerCell: number;
  /** Sessions a key holds at once (running, paused or ended but not deleted). */
  maxSessionsPerKey: number;
  /** Bytes of checkpoints a key's sessions hold together; a checkpoint beyond it is refused. */
  maxCheckpointBytesPerKey: number;
  defaultIdleTimeoutS: number;
  maxIdleTimeoutS: number;
  defaultMaxLifetimeS: number;
  maxLifetimeS: number;
  /** How often idle sessions are paused and expired ones deleted. */
  sweepIntervalMs: number;
}

export function loadSessionSettings(env: NodeJS.ProcessEnv): SessionSettings {
  return {
    unitsPerGibSecond: positiveIntegerFromEnv(env, "SANDFORK_SESSION_UNITS_PER_GIB_SECOND", 10),
    unitsPerGibHour: positiveIntegerFromEnv(
      env,
      "SANDFORK_SESSION_UNITS_PER_CHECKPOINT_GIB_HOUR",
      1,
    ),
    unitsPerCell: positiveIntegerFromEnv(env, "SANDFORK_SESSION_UNITS_PER_CELL", 1),
    maxSessionsPerKey: positiveIntegerFromEnv(env, "SANDFORK_SESSION_MAX_PER_KEY", 10),
    maxCheckpointBytesPerKey: positiveIntegerFromEnv(
      env,
      "SANDFORK_SESSION_MAX_CHECKPOINT_BYTES_PER_KEY",
      1 << 30,
    ),
    defaultIdleTimeoutS: positiveIntegerFromEnv(
      env,
      "SANDFORK_SESSION_DEFAULT_IDLE_TIMEOUT_S",
      300,
    ),
    maxIdleTimeoutS: positiveIntegerFromEnv(env, "SANDFORK_SESSION_MAX_IDLE_TIMEOUT_S", 3_600),
    defaultMaxLifetimeS: positiveIntegerFromEnv(
      env,
      "SANDFORK_SESSION_DEFAULT_MAX_LIFETIME_S",
      86_400,
    ),
    maxLifetimeS: positiveIntegerFromEnv(env, "SANDFORK_SESSION_MAX_LIFETIME_S", 7 * 86_400),
    sweepIntervalMs: positiveIntegerFromEnv(env, "SANDFORK_SESSION_SWEEP_INTERVAL_MS", 1_000),
  };
}
