CREATE TABLE "credit_leases" (
	"gateway_id" text NOT NULL,
	"account_id" uuid NOT NULL,
	"units" bigint NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "credit_leases_gateway_id_account_id_pk" PRIMARY KEY("gateway_id","account_id"),
	CONSTRAINT "credit_leases_units_non_negative" CHECK ("credit_leases"."units" >= 0)
);
--> statement-breakpoint
ALTER TABLE "credit_leases" ADD CONSTRAINT "credit_leases_account_id_accounts_id_fk" FOREIGN KEY ("account_id") REFERENCES "public"."accounts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint

-- Records a batch of executions that ran on credits of their gateway's leases (db/leases.ts):
-- each account pays its executions' charges (at most what each held) out of its reserved units
-- and its gateway's lease, accounts locked in id order (concurrent batches cannot deadlock); the
-- final records are inserted and the ledger gets one usage row each. A lease that is missing or
-- cannot cover its charges fails the whole call, so nothing of the batch is billed.
CREATE FUNCTION sandfork_record(batch jsonb) RETURNS SETOF executions LANGUAGE plpgsql AS $$
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
  WITH settled AS (
    INSERT INTO executions (id, account_id, key_id, token_id, request_hash, template, gateway_id, status, exit_code, stdout, stderr,
                            truncated, timings, reserved_units, charged_units, created_at, finished_at)
    SELECT r.id, r.account_id, r.key_id, r.token_id, r.request_hash, r.template, r.gateway_id, r.status, r.exit_code, r.stdout, r.stderr,
           r.truncated, r.timings, r.reserved_units, LEAST(r.charged_units, r.reserved_units), to_timestamp(r.created_ms / 1000.0), now()
    FROM jsonb_to_recordset(batch) AS r(id uuid, account_id uuid, key_id uuid, token_id text, request_hash text, template text,
                                         gateway_id text, status text, exit_code int, stdout text, stderr text, truncated boolean,
                                         timings jsonb, reserved_units int8, charged_units int8, created_ms float8)
    RETURNING executions.*
  ), ledger AS (
    INSERT INTO usage_ledger (account_id, key_id, execution_id, kind, template, units)
    SELECT settled.account_id, settled.key_id, settled.id, 'usage', settled.template, settled.charged_units FROM settled
  )
  SELECT * FROM settled;
END $$;
