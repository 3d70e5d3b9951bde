-- Version 11: SQLite's runs by state moved out of its table into the one process that
-- writes the store. On PostgreSQL several instances share the database: its counts
-- stay in run_counts (version 10), a row per state and writer. The version keeps both
-- engines' numbers alike; this only says so where a reader of the schema looks.
COMMENT ON TABLE run_counts IS
    'Runs by state, kept by triggers on runs: a row per state and writer (version 10).';
