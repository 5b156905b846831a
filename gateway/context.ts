// What route handlers share: the database, configuration, services and per-process limiters.
import type { Database } from "../db/client.js";
import type { ExecutionRuntime } from "../runtime/execution-runtime.js";
import type { Authenticator } from "./auth/authenticator.js";
import type { Principal } from "./auth/principal.js";
import type { TokenService } from "./auth/tokens.js";
import type { GatewayConfig } from "./config.js";
import type { CreditLeases } from "./credit-leases.js";
import type { ExecutionService } from "./execution-service.js";
import type { KeyRateLimit } from "./limits.js";
import type { OutputFiles } from "./output-files.js";
import type { SessionService } from "./session-service.js";
import type { Telemetry } from "./telemetry.js";
import type { TemplateService } from "./template-service.js";

export interface AppEnv {
  Variables: {
    principal: Principal;
    requestId: string;
  };
}

export interface GatewayContext {
  db: Database;
  config: GatewayConfig;
  telemetry: Telemetry;
  authenticator: Authenticator;
  tokens: TokenService;
  rateLimiter: KeyRateLimit;
  leases: CreditLeases;
  executions: ExecutionService;
  sessions: SessionService;
  outputFiles: OutputFiles;
  templates: TemplateService;
  runtime: () => ExecutionRuntime | undefined;
}
