-- Version 9: apps own their data. Versions 3, 4 and 7 made the review app's column
-- (events.project) and tables (project_exports, kept_audio, project_references) in
-- the engine's schema; the review's own migration line (agentbox/archive/tables)
-- now makes its tables, and its version 3 moves the column's values into its own
-- table (run_projects) and drops the column. This version drops each of them only
-- when it holds nothing: a database made with no app ends with none of them, and
-- one an earlier release wrote keeps what it holds, whether the review is loaded
-- now or later, until the review's line has taken it over (it runs after this
-- version, and makes again, empty, a table dropped here).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM events WHERE project IS NOT NULL) THEN
        DROP INDEX IF EXISTS events_project;
        ALTER TABLE events DROP COLUMN project;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM project_exports) THEN
        BEGIN
            DROP TABLE project_exports;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            NULL;  -- an app's line builds on it already (a view of its own): it stays
        END;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM kept_audio) THEN
        BEGIN
            DROP TABLE kept_audio;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            NULL;  -- an app's line builds on it already (a view of its own): it stays
        END;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM project_references) THEN
        BEGIN
            DROP TABLE project_references;
        EXCEPTION WHEN dependent_objects_still_exist THEN
            NULL;  -- an app's line builds on it already (a view of its own): it stays
        END;
    END IF;
END
$$;
