ALTER TABLE "api_keys" ADD COLUMN "network_policy" jsonb;--> statement-breakpoint
ALTER TABLE "execution_usage_hours" ADD COLUMN "network_bytes_in" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "execution_usage_hours" ADD COLUMN "network_bytes_out" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "execution_usage_hours" ADD COLUMN "network_refused" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "executions" ADD COLUMN "network" jsonb;--> statement-breakpoint

-- Settle and record as in 0005 and 0010, now also writing what the execution did on the network
-- (network: null when it was granted none).
CREATE OR REPLACE FUNCTION sandfork_settle(batch jsonb) RETURNS SETOF executions LANGUAGE plpgsql AS $$
DECLARE
  account uuid;
  outcome record;
  settled executions;
BEGIN
  FOR account IN
    SELECT DISTINCT (SELECT executions.account_id FROM executions WHERE executions.id = r.id)
    FROM jsonb_to_recordset(batch) AS r(id uuid)
    ORDER BY 1
  LOOP
    PERFORM 1 FROM accounts WHERE id = account FOR UPDATE;
  END LOOP;
  FOR outcome IN
    SELECT * FROM jsonb_to_recordset(batch)
      AS r(id uuid, status text, exit_code int, stdout text, stderr text, truncated boolean, timings jsonb, network jsonb,
           charged_units int8)
  LOOP
    UPDATE executions SET status = outcome.status, exit_code = outcome.exit_code, stdout = outcome.stdout, stderr = outcome.stderr,
           truncated = outcome.truncated, timings = outcome.timings, network = outcome.network,
           charged_units = LEAST(outcome.charged_units, executions.reserved_units), finished_at = now()
    WHERE executions.id = outcome.id AND executions.status = 'running'
    RETURNING executions.* INTO settled;
    IF FOUND THEN
      UPDATE accounts SET reserved_units = reserved_units - settled.reserved_units, balance_units = balance_units - settled.charged_units
      WHERE id = settled.account_id;
      RETURN NEXT settled;
    END IF;
  END LOOP;
END $$;
--> statement-breakpoint

CREATE OR REPLACE FUNCTION sandfork_record(batch jsonb) RETURNS SETOF executions LANGUAGE plpgsql AS $$
DECLARE
  account uuid;
  gateway text;
  spent int8;
BEGIN
  FOR account, gateway, spent IN
    SELECT r.account_id, r.gateway_id, sum(LEAST(r.charged_units, r.reserved_units))::int8
    FROM jsonb_to_recordset(batch) AS r(account_id uuid, gateway_id text, charged_units int8, reserved_units int8)
    GROUP BY 1, 2
    ORDER BY 1, 2
  LOOP
    UPDATE credit_leases SET units = units - spent WHERE credit_leases.account_id = account AND credit_leases.gateway_id = gateway;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'gateway % holds no credit lease on account %', gateway, account;
    END IF;
    UPDATE accounts SET reserved_units = reserved_units - spent, balance_units = balance_units - spent WHERE id = account;
  END LOOP;
  RETURN QUERY
  INSERT INTO executions (id, account_id, key_id, token_id, idempotency_key, request_hash, template, gateway_id, status, exit_code,
                          stdout, stderr, truncated, timings, network, reserved_units, charged_units, created_at, finished_at)
  SELECT r.id, r.account_id, r.key_id, r.token_id, r.idempotency_key, r.request_hash, r.template, r.gateway_id, r.status, r.exit_code,
         r.stdout, r.stderr, r.truncated, r.timings, r.network, r.reserved_units, LEAST(r.charged_units, r.reserved_units),
         to_timestamp(r.created_ms / 1000.0), coalesce(to_timestamp(r.finished_ms / 1000.0), now())
  FROM jsonb_to_recordset(batch) AS r(id uuid, account_id uuid, key_id uuid, token_id text, idempotency_key text, request_hash text,
                                       template text, gateway_id text, status text, exit_code int, stdout text, stderr text, truncated boolean,
                                       timings jsonb, network jsonb, reserved_units int8, charged_units int8, created_ms float8,
                                       finished_ms float8)
  RETURNING executions.*;
END $$;
--> statement-breakpoint

-- As in 0008, the hourly sums now also add up network bytes and refusals.
CREATE OR REPLACE FUNCTION sandfork_roll_up_usage(key uuid) RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
  done timestamptz;
  horizon timestamptz;
BEGIN
  SELECT rolled_up_before INTO done FROM execution_usage_keys WHERE key_id = key;
  IF done >= clock_timestamp() - interval '10 seconds' THEN
    RETURN done;
  END IF;
  horizon := date_trunc('milliseconds', sandfork_usage_horizon(interval '5 seconds'));
  INSERT INTO execution_usage_keys (key_id, rolled_up_before) VALUES (key, '-infinity') ON CONFLICT (key_id) DO NOTHING;
  SELECT rolled_up_before INTO done FROM execution_usage_keys WHERE key_id = key FOR UPDATE;
  IF done >= horizon THEN
    RETURN done;
  END IF;
  INSERT INTO execution_usage_hours AS summed (key_id, hour, template, executions, units, network_bytes_in, network_bytes_out,
                                               network_refused)
  SELECT key, date_trunc('hour', finished_at, 'UTC'), template, count(*), coalesce(sum(charged_units), 0),
         coalesce(sum((network->>'bytesIn')::int8), 0), coalesce(sum((network->>'bytesOut')::int8), 0),
         coalesce(sum((network->>'refused')::int8), 0)
  FROM executions
  WHERE key_id = key AND finished_at >= done AND finished_at < horizon AND status <> 'aborted'
  GROUP BY 2, 3
  ON CONFLICT (key_id, hour, template)
  DO UPDATE SET executions = summed.executions + EXCLUDED.executions, units = summed.units + EXCLUDED.units,
                network_bytes_in = summed.network_bytes_in + EXCLUDED.network_bytes_in,
                network_bytes_out = summed.network_bytes_out + EXCLUDED.network_bytes_out,
                network_refused = summed.network_refused + EXCLUDED.network_refused;
  UPDATE execution_usage_keys SET rolled_up_before = horizon WHERE key_id = key;
  RETURN horizon;
END $$;
