CREATE TABLE "nodes" (
	"id" text PRIMARY KEY NOT NULL,
	"address" text NOT NULL,
	"templates" text[] NOT NULL,
	"capacity" integer NOT NULL,
	"load" integer NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"heartbeat_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "nodes_load_non_negative" CHECK ("nodes"."capacity" > 0 AND "nodes"."load" >= 0)
);
--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "node_id" text;--> statement-breakpoint
CREATE INDEX "nodes_heartbeat_idx" ON "nodes" USING btree ("heartbeat_at");