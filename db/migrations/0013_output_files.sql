CREATE TABLE "output_files" (
	"execution_id" uuid NOT NULL,
	"path" text NOT NULL,
	"account_id" uuid NOT NULL,
	"key_id" uuid NOT NULL,
	"token_id" text,
	"bytes" bigint NOT NULL,
	"content" "bytea" NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	CONSTRAINT "output_files_execution_id_path_pk" PRIMARY KEY("execution_id","path"),
	CONSTRAINT "output_files_bytes_non_negative" CHECK ("output_files"."bytes" >= 0)
);
--> statement-breakpoint
CREATE INDEX "output_files_key_expires_idx" ON "output_files" USING btree ("key_id","expires_at");--> statement-breakpoint
CREATE INDEX "output_files_expires_idx" ON "output_files" USING btree ("expires_at");--> statement-breakpoint

-- Keeps one output file unless its key's files not yet expired and it would hold more than
-- `quota` bytes: true when kept. The key's advisory lock (held to the end of the calling
-- statement's transaction) makes concurrent keeps of one key count one after the other.
CREATE FUNCTION sandfork_keep_output_file(execution uuid, file_path text, account uuid, key uuid, token text, file_content bytea, expires timestamptz, quota bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(key::text, 7413));
  IF (SELECT coalesce(sum(bytes), 0) FROM output_files WHERE key_id = key AND expires_at > now()) + length(file_content) > quota THEN
    RETURN false;
  END IF;
  INSERT INTO output_files (execution_id, path, account_id, key_id, token_id, bytes, content, expires_at)
    VALUES (execution, file_path, account, key, token, length(file_content), file_content, expires);
  RETURN true;
END $$;
