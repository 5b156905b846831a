CREATE TABLE "sessions" (
	"id" uuid PRIMARY KEY NOT NULL,
	"account_id" uuid NOT NULL,
	"key_id" uuid NOT NULL,
	"token_id" text,
	"template" text NOT NULL,
	"state" text NOT NULL,
	"memory_mib" integer NOT NULL,
	"idle_timeout_s" integer NOT NULL,
	"max_lifetime_s" integer NOT NULL,
	"last_checkpoint" integer,
	"last_checkpoint_sha256" text,
	"checkpoint_bytes" bigint DEFAULT 0 NOT NULL,
	"cells" integer DEFAULT 0 NOT NULL,
	"running_since" timestamp with time zone,
	"storage_since" timestamp with time zone DEFAULT now() NOT NULL,
	"running_mib_ms" numeric DEFAULT '0' NOT NULL,
	"storage_byte_ms" numeric DEFAULT '0' NOT NULL,
	"charged_units" bigint DEFAULT 0 NOT NULL,
	"ended_reason" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"last_active_at" timestamp with time zone DEFAULT now() NOT NULL,
	"ended_at" timestamp with time zone,
	CONSTRAINT "sessions_state_known" CHECK ("sessions"."state" IN ('running', 'paused', 'ended', 'deleted')),
	CONSTRAINT "sessions_charged_non_negative" CHECK ("sessions"."charged_units" >= 0 AND "sessions"."checkpoint_bytes" >= 0)
);
--> statement-breakpoint
ALTER TABLE "usage_ledger" DROP CONSTRAINT "usage_ledger_kind_known";--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD COLUMN "session_id" uuid;--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD COLUMN "running_mib_ms" numeric;--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD COLUMN "storage_byte_ms" numeric;--> statement-breakpoint
ALTER TABLE "sessions" ADD CONSTRAINT "sessions_account_id_accounts_id_fk" FOREIGN KEY ("account_id") REFERENCES "public"."accounts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "sessions" ADD CONSTRAINT "sessions_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "sessions_key_state_idx" ON "sessions" USING btree ("key_id","state");--> statement-breakpoint
CREATE INDEX "sessions_state_active_idx" ON "sessions" USING btree ("state","last_active_at");--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD CONSTRAINT "usage_ledger_session_id_sessions_id_fk" FOREIGN KEY ("session_id") REFERENCES "public"."sessions"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD CONSTRAINT "usage_ledger_kind_known" CHECK ("usage_ledger"."kind" IN ('grant', 'usage', 'session'));