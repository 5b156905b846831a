CREATE TABLE "custom_templates" (
	"id" uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
	"account_id" uuid NOT NULL,
	"key_id" uuid NOT NULL,
	"name" text NOT NULL,
	"version" text NOT NULL,
	"definition" jsonb NOT NULL,
	"status" text NOT NULL,
	"step" text,
	"error" text,
	"logs" text DEFAULT '' NOT NULL,
	"image_bytes" bigint,
	"snapshot_bytes" bigint,
	"published" boolean DEFAULT false NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone,
	CONSTRAINT "custom_templates_status_known" CHECK ("custom_templates"."status" IN ('queued', 'building', 'ready', 'failed'))
);
--> statement-breakpoint
ALTER TABLE "custom_templates" ADD CONSTRAINT "custom_templates_account_id_accounts_id_fk" FOREIGN KEY ("account_id") REFERENCES "public"."accounts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "custom_templates_account_name_version_unique" ON "custom_templates" USING btree ("account_id","name","version");--> statement-breakpoint
CREATE INDEX "custom_templates_name_idx" ON "custom_templates" USING btree ("name");