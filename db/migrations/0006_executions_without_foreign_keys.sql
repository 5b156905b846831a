-- An execution's record is written once per execution, from the authenticated key's own row; accounts
-- and keys are never deleted (a key is revoked). The foreign keys could not fail there, and cost each
-- insert two index lookups and a KEY SHARE lock on the account row: the columns stay, the checks go.
ALTER TABLE "executions" DROP CONSTRAINT "executions_account_id_accounts_id_fk";
--> statement-breakpoint
ALTER TABLE "executions" DROP CONSTRAINT "executions_key_id_api_keys_id_fk";
