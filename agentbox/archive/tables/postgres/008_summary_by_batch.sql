-- The review's tables, version 8: the kept summary (version 4) is brought up to date
-- once per write batch by the ingest's own statement (queries.sql: keep_runs, one row
-- per project the batch names), no longer by a trigger on each run_projects row (a
-- function call, three lookups and an upsert per event). The summary's rows are
-- unchanged.
DROP TRIGGER IF EXISTS project_summary_export ON run_projects;
DROP FUNCTION IF EXISTS project_summary_export();
