CREATE TABLE "accounts" (
	"id" uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
	"name" text NOT NULL,
	"balance_units" bigint DEFAULT 0 NOT NULL,
	"reserved_units" bigint DEFAULT 0 NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "accounts_balance_non_negative" CHECK ("accounts"."balance_units" >= 0),
	CONSTRAINT "accounts_reserved_non_negative" CHECK ("accounts"."reserved_units" >= 0),
	CONSTRAINT "accounts_reserved_within_balance" CHECK ("accounts"."reserved_units" <= "accounts"."balance_units")
);
--> statement-breakpoint
CREATE TABLE "api_keys" (
	"id" uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
	"account_id" uuid NOT NULL,
	"name" text NOT NULL,
	"key_hash" text NOT NULL,
	"hint" text NOT NULL,
	"scopes" text[] NOT NULL,
	"expires_at" timestamp with time zone,
	"revoked_at" timestamp with time zone,
	"rate_limit_per_minute" integer NOT NULL,
	"max_concurrency" integer NOT NULL,
	"max_body_bytes" integer NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "api_keys_limits_positive" CHECK ("api_keys"."rate_limit_per_minute" > 0 AND "api_keys"."max_concurrency" > 0 AND "api_keys"."max_body_bytes" > 0)
);
--> statement-breakpoint
CREATE TABLE "executions" (
	"id" uuid PRIMARY KEY NOT NULL,
	"account_id" uuid NOT NULL,
	"key_id" uuid NOT NULL,
	"token_id" text,
	"idempotency_key" text,
	"request_hash" text NOT NULL,
	"template" text NOT NULL,
	"status" text NOT NULL,
	"exit_code" integer,
	"stdout" text,
	"stderr" text,
	"truncated" boolean,
	"timings" jsonb,
	"reserved_units" bigint NOT NULL,
	"charged_units" bigint,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "usage_ledger" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"account_id" uuid NOT NULL,
	"key_id" uuid,
	"execution_id" uuid,
	"kind" text NOT NULL,
	"template" text,
	"units" bigint NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "usage_ledger_units_non_negative" CHECK ("usage_ledger"."units" >= 0),
	CONSTRAINT "usage_ledger_kind_known" CHECK ("usage_ledger"."kind" IN ('grant', 'usage'))
);
--> statement-breakpoint
ALTER TABLE "api_keys" ADD CONSTRAINT "api_keys_account_id_accounts_id_fk" FOREIGN KEY ("account_id") REFERENCES "public"."accounts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "executions" ADD CONSTRAINT "executions_account_id_accounts_id_fk" FOREIGN KEY ("account_id") REFERENCES "public"."accounts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "executions" ADD CONSTRAINT "executions_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD CONSTRAINT "usage_ledger_account_id_accounts_id_fk" FOREIGN KEY ("account_id") REFERENCES "public"."accounts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD CONSTRAINT "usage_ledger_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD CONSTRAINT "usage_ledger_execution_id_executions_id_fk" FOREIGN KEY ("execution_id") REFERENCES "public"."executions"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "api_keys_key_hash_unique" ON "api_keys" USING btree ("key_hash");--> statement-breakpoint
CREATE INDEX "api_keys_account_idx" ON "api_keys" USING btree ("account_id");--> statement-breakpoint
CREATE UNIQUE INDEX "executions_key_idempotency_unique" ON "executions" USING btree ("key_id","idempotency_key");--> statement-breakpoint
CREATE INDEX "executions_account_created_idx" ON "executions" USING btree ("account_id","created_at");--> statement-breakpoint
CREATE UNIQUE INDEX "usage_ledger_execution_kind_unique" ON "usage_ledger" USING btree ("execution_id","kind");--> statement-breakpoint
CREATE INDEX "usage_ledger_key_created_idx" ON "usage_ledger" USING btree ("key_id","created_at");