-- A leased execution's record may carry an Idempotency-Key (idempotency_key; absent: none). On
-- embedded PGlite the one gateway that owns the database claims keys in memory, so an execution
-- with one is leased and journaled like any other (gateway/idempotency-claims.ts); the unique
-- (key_id, idempotency_key) index still refuses a second record with the same key.
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
                          stdout, stderr, truncated, timings, reserved_units, charged_units, created_at, finished_at)
  SELECT r.id, r.account_id, r.key_id, r.token_id, r.idempotency_key, r.request_hash, r.template, r.gateway_id, r.status, r.exit_code,
         r.stdout, r.stderr, r.truncated, r.timings, r.reserved_units, LEAST(r.charged_units, r.reserved_units), to_timestamp(r.created_ms / 1000.0),
         coalesce(to_timestamp(r.finished_ms / 1000.0), now())
  FROM jsonb_to_recordset(batch) AS r(id uuid, account_id uuid, key_id uuid, token_id text, idempotency_key text, request_hash text,
                                       template text, gateway_id text, status text, exit_code int, stdout text, stderr text, truncated boolean,
                                       timings jsonb, reserved_units int8, charged_units int8, created_ms float8, finished_ms float8)
  RETURNING executions.*;
END $$;
