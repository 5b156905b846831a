-- The executions table is the journal of execution charges: a record's charged_units, attributed
-- to its finished_at, is its execution's one entry. The ledger's per-execution "usage" rows
-- repeated it at the cost of a second insert per execution (its heap row, three indexes, three
-- foreign-key checks); they go only if every one of them says what its execution says, and the
-- ledger keeps grants and session charges. Indexes: a key's usage over a period; the running
-- records (all the recovery pass reads) instead of one by account no query used; the
-- Idempotency-Key index holds only keyed records. Stop every gateway on the database first: one
-- still running the code before it would fail its settlements (a 502, nothing billed) until it
-- restarts. The ledger is locked before it is checked, so no usage row can land in between.
LOCK TABLE "usage_ledger", "executions" IN SHARE ROW EXCLUSIVE MODE;--> statement-breakpoint
DO $$
BEGIN
  IF EXISTS (
    SELECT 1 FROM usage_ledger l LEFT JOIN executions e ON e.id = l.execution_id
    WHERE l.kind = 'usage' AND (e.id IS NULL OR e.charged_units IS DISTINCT FROM l.units OR e.key_id IS DISTINCT FROM l.key_id)
  ) THEN
    RAISE EXCEPTION 'usage_ledger holds usage rows that differ from their executions: not migrated';
  END IF;
END $$;
--> statement-breakpoint
DELETE FROM "usage_ledger" WHERE "kind" = 'usage';--> statement-breakpoint
ALTER TABLE "usage_ledger" DROP CONSTRAINT "usage_ledger_kind_known";--> statement-breakpoint
ALTER TABLE "usage_ledger" DROP CONSTRAINT "usage_ledger_execution_id_executions_id_fk";
--> statement-breakpoint
DROP INDEX "executions_account_created_idx";--> statement-breakpoint
DROP INDEX "usage_ledger_execution_kind_unique";--> statement-breakpoint
DROP INDEX "executions_key_idempotency_unique";--> statement-breakpoint
CREATE INDEX "executions_running_idx" ON "executions" USING btree ("created_at") WHERE "executions"."status" = 'running';--> statement-breakpoint
CREATE INDEX "executions_key_finished_idx" ON "executions" USING btree ("key_id","finished_at");--> statement-breakpoint
CREATE UNIQUE INDEX "executions_key_idempotency_unique" ON "executions" USING btree ("key_id","idempotency_key") WHERE "executions"."idempotency_key" IS NOT NULL;--> statement-breakpoint
ALTER TABLE "usage_ledger" DROP COLUMN "execution_id";--> statement-breakpoint
ALTER TABLE "usage_ledger" ADD CONSTRAINT "usage_ledger_kind_known" CHECK ("usage_ledger"."kind" IN ('grant', 'session'));
--> statement-breakpoint

-- As in 0003, without the ledger row: the settled record is the charge's entry.
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
      AS r(id uuid, status text, exit_code int, stdout text, stderr text, truncated boolean, timings jsonb, charged_units int8)
  LOOP
    UPDATE executions SET status = outcome.status, exit_code = outcome.exit_code, stdout = outcome.stdout, stderr = outcome.stderr,
           truncated = outcome.truncated, timings = outcome.timings,
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

-- As in 0004, without the ledger row.
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
  INSERT INTO executions (id, account_id, key_id, token_id, request_hash, template, gateway_id, status, exit_code, stdout, stderr,
                          truncated, timings, reserved_units, charged_units, created_at, finished_at)
  SELECT r.id, r.account_id, r.key_id, r.token_id, r.request_hash, r.template, r.gateway_id, r.status, r.exit_code, r.stdout, r.stderr,
         r.truncated, r.timings, r.reserved_units, LEAST(r.charged_units, r.reserved_units), to_timestamp(r.created_ms / 1000.0), now()
  FROM jsonb_to_recordset(batch) AS r(id uuid, account_id uuid, key_id uuid, token_id text, request_hash text, template text,
                                       gateway_id text, status text, exit_code int, stdout text, stderr text, truncated boolean,
                                       timings jsonb, reserved_units int8, charged_units int8, created_ms float8)
  RETURNING executions.*;
END $$;
