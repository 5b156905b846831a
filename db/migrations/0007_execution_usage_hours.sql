CREATE TABLE "execution_usage_hours" (
	"key_id" uuid NOT NULL,
	"hour" timestamp with time zone NOT NULL,
	"template" text NOT NULL,
	"executions" bigint NOT NULL,
	"units" bigint NOT NULL,
	CONSTRAINT "execution_usage_hours_key_id_hour_template_pk" PRIMARY KEY("key_id","hour","template")
);
--> statement-breakpoint
CREATE TABLE "execution_usage_keys" (
	"key_id" uuid PRIMARY KEY NOT NULL,
	"rolled_up_before" timestamp with time zone NOT NULL
);
--> statement-breakpoint

-- The time before which every execution that finished has committed, so its usage can be summed
-- for good. A record's finished_at is its transaction's start (now()), so this is the oldest
-- start among the transactions open on this database's other connections (a record waiting for
-- a lock), or the clock less `margin` (a transaction takes its start a moment before
-- pg_stat_activity shows it). Only clients write records (autovacuum's long transactions do not
-- hold it back). Gateways sharing a server connect as one role, which sees its own sessions'
-- transactions.
CREATE FUNCTION sandfork_usage_horizon(margin interval) RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
  SELECT LEAST(clock_timestamp() - margin, min(xact_start)) FROM pg_stat_activity
  WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
$$;
--> statement-breakpoint

-- Sums the key's finished executions by UTC hour and template, from where its sums stopped to the
-- last hour that closed before the horizon, and answers where its sums stop now. One call sums a
-- key at a time: another waits on the key's mark, then finds the hours summed.
CREATE FUNCTION sandfork_roll_up_usage(key uuid) RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
  done timestamptz;
  sealed timestamptz;
BEGIN
  SELECT rolled_up_before INTO done FROM execution_usage_keys WHERE key_id = key;
  -- Summed up to the clock's last hour: the horizon (pg_stat_activity's, costlier) cannot be later.
  IF done >= date_trunc('hour', clock_timestamp() - interval '5 seconds', 'UTC') THEN
    RETURN done;
  END IF;
  sealed := date_trunc('hour', sandfork_usage_horizon(interval '5 seconds'), 'UTC');
  INSERT INTO execution_usage_keys (key_id, rolled_up_before) VALUES (key, '-infinity') ON CONFLICT (key_id) DO NOTHING;
  SELECT rolled_up_before INTO done FROM execution_usage_keys WHERE key_id = key FOR UPDATE;
  IF done >= sealed THEN
    RETURN done;
  END IF;
  INSERT INTO execution_usage_hours (key_id, hour, template, executions, units)
  SELECT key, date_trunc('hour', finished_at, 'UTC'), template, count(*), coalesce(sum(charged_units), 0)
  FROM executions
  WHERE key_id = key AND finished_at >= done AND finished_at < sealed AND status <> 'aborted'
  GROUP BY 2, 3;
  UPDATE execution_usage_keys SET rolled_up_before = sealed WHERE key_id = key;
  RETURN sealed;
END $$;
