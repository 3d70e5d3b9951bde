-- Version 10: the runs by state, kept (run_counts), so that the run list, /healthz
-- and /metrics read a few rows where they counted every run's entry of the status
-- index on each page (8 ms at 30,000 runs in SQLite). The trigger below keeps it in
-- the transaction of each write to runs (ingest, claim, outcome, lease recovery,
-- replay, retention's removal), whichever statement makes it: a count can never be
-- committed apart from the change it counts.
--
-- Each writer connection (a backend: pg_backend_pid()) adds to rows of its own
-- (`writer`), so that instances sharing the database never wait for each other's
-- commits on one hot row per state; a state's count is the sum of its rows. Row 0
-- holds the counts made here, and what a writer folds in at start-up of the rows of
-- backends that are gone (queries: fold_run_counts), so the rows stay few.
CREATE TABLE IF NOT EXISTS run_counts (
    status TEXT COLLATE "C" NOT NULL,
    writer BIGINT NOT NULL,
    runs   BIGINT NOT NULL,
    PRIMARY KEY (status, writer)
);
-- Other instances (an older release, during an upgrade) may be writing runs: none
-- commits a change between the count below and the triggers, which would leave it
-- out of the counts for good (the lock waits for their writes, and theirs for it).
LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM run_counts;
INSERT INTO run_counts (status, writer, runs)
SELECT status, 0, count(*) FROM runs GROUP BY status;
CREATE OR REPLACE FUNCTION run_counts_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO run_counts AS c (status, writer, runs)
        VALUES (OLD.status, pg_backend_pid(), -1)
        ON CONFLICT (status, writer) DO UPDATE SET runs = c.runs - 1;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO run_counts AS c (status, writer, runs)
        VALUES (NEW.status, pg_backend_pid(), 1)
        ON CONFLICT (status, writer) DO UPDATE SET runs = c.runs + 1;
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS run_counts_insert_delete ON runs;
CREATE TRIGGER run_counts_insert_delete AFTER INSERT OR DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION run_counts_change();
DROP TRIGGER IF EXISTS run_counts_update ON runs;
CREATE TRIGGER run_counts_update AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION run_counts_change();
