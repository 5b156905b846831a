CREATE TABLE "key_rates" (
	"key_id" uuid PRIMARY KEY NOT NULL,
	"tokens" double precision NOT NULL,
	"updated_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "key_slots" (
	"key_id" uuid NOT NULL,
	"gateway_id" text NOT NULL,
	"running" integer NOT NULL,
	CONSTRAINT "key_slots_key_id_gateway_id_pk" PRIMARY KEY("key_id","gateway_id"),
	CONSTRAINT "key_slots_running_non_negative" CHECK ("key_slots"."running" >= 0)
);
--> statement-breakpoint

-- Takes one of a key's `max_running` execution slots for `gateway`, counting every gateway's:
-- true, or false when all are taken. The key's advisory lock (held to the end of the calling
-- statement's transaction) makes concurrent takes of one key count one after the other.
CREATE FUNCTION sandfork_take_key_slot(key uuid, gateway text, max_running int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(key::text, 7411));
  IF (SELECT coalesce(sum(running), 0) FROM key_slots WHERE key_id = key) >= max_running THEN
    RETURN false;
  END IF;
  INSERT INTO key_slots (key_id, gateway_id, running) VALUES (key, gateway, 1)
    ON CONFLICT (key_id, gateway_id) DO UPDATE SET running = key_slots.running + 1;
  RETURN true;
END $$;
