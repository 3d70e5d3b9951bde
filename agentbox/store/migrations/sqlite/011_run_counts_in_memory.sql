-- Version 11: the runs by state are kept by the one process that writes the store
-- (SqliteStore.run_counts: counted at open, then changed by the writer connection's
-- TEMP triggers as each transaction commits), where version 10 kept them in a table:
-- its row for a state was a page more in the WAL with every commit that changed a
-- run, about 2 % of an event's cost end to end. One process serves a SQLite store
-- (its lock file), so nothing else changes runs while the counts are kept.
DROP TRIGGER IF EXISTS run_counts_insert;
DROP TRIGGER IF EXISTS run_counts_update;
DROP TRIGGER IF EXISTS run_counts_delete;
DROP TABLE IF EXISTS run_counts;
