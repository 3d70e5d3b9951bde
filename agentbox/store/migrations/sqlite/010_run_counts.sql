-- Version 10: the runs by state, kept (run_counts), so that the run list, /healthz
-- and /metrics read seven rows where they counted every run's entry of the status
-- index on each page (8 ms at 30,000 runs). The triggers below keep it in the
-- transaction of each write to runs (ingest, claim, outcome, lease recovery,
-- replay, retention's removal), whichever statement makes it: a count can never
-- be committed apart from the change it counts. Made from the runs stored.
CREATE TABLE IF NOT EXISTS run_counts (
    status TEXT PRIMARY KEY,
    runs   INTEGER NOT NULL
) WITHOUT ROWID;
DELETE FROM run_counts;
INSERT INTO run_counts (status, runs) SELECT status, count(*) FROM runs GROUP BY status;
CREATE TRIGGER IF NOT EXISTS run_counts_insert AFTER INSERT ON runs
BEGIN
    INSERT INTO run_counts (status, runs) VALUES (NEW.status, 1)
    ON CONFLICT (status) DO UPDATE SET runs = runs + 1;
END;
CREATE TRIGGER IF NOT EXISTS run_counts_update AFTER UPDATE OF status ON runs
WHEN OLD.status IS NOT NEW.status
BEGIN
    UPDATE run_counts SET runs = runs - 1 WHERE status = OLD.status;
    INSERT INTO run_counts (status, runs) VALUES (NEW.status, 1)
    ON CONFLICT (status) DO UPDATE SET runs = runs + 1;
END;
CREATE TRIGGER IF NOT EXISTS run_counts_delete AFTER DELETE ON runs
BEGIN
    UPDATE run_counts SET runs = runs - 1 WHERE status = OLD.status;
END;
