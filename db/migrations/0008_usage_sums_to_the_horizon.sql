-- A key's usage is summed up to the horizon itself, not only to the last hour that closed before
-- it: every query read all the current hour's records, however many the key had run in it. The
-- row of the hour a key's mark falls in holds that hour's part before the mark, and later calls
-- add to it.
--
-- Sums the key's finished executions by UTC hour and template, from where its sums stopped to the
-- horizon (rounded down to the millisecond, so that a JavaScript Date holds the mark exactly), and
-- answers where its sums stop now. While the mark is less than 10 s behind the clock (set at most
-- 5 s ago) a call sums nothing: it would read pg_stat_activity and write for a few seconds'
-- records. One call sums a key at a time: another waits on the key's mark, then finds it moved.
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
  INSERT INTO execution_usage_hours AS summed (key_id, hour, template, executions, units)
  SELECT key, date_trunc('hour', finished_at, 'UTC'), template, count(*), coalesce(sum(charged_units), 0)
  FROM executions
  WHERE key_id = key AND finished_at >= done AND finished_at < horizon AND status <> 'aborted'
  GROUP BY 2, 3
  ON CONFLICT (key_id, hour, template)
  DO UPDATE SET executions = summed.executions + EXCLUDED.executions, units = summed.units + EXCLUDED.units;
  UPDATE execution_usage_keys SET rolled_up_before = horizon WHERE key_id = key;
  RETURN horizon;
END $$;
