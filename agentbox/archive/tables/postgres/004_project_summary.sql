-- The review's tables, version 4: a kept summary of each project (project_summary),
-- so that the home page and GET /exports read only the projects they show, in the
-- order of their latest export, whatever the number of runs. One row per project
-- shown (its current name), kept in the transaction that records an export (the
-- trigger below, on run_projects), and made again from project_latest when a
-- project is renamed, merged or removed (queries.sql: summary.*). Retention changes
-- nothing here: a removed run's export is kept in project_exports, and counted.
--
-- project_latest is the one definition of a project's latest export and of its
-- exports: every export still shown (stored or kept after retention, by the name
-- its project goes by now, without what a removal took away), the latest by
-- acceptance, then run id. The trigger applies the same order to one new export.
CREATE OR REPLACE VIEW project_latest AS
SELECT project, run_id, accepted_at, exports FROM (
    SELECT x.project, x.run_id, x.accepted_at,
           row_number() OVER (PARTITION BY x.project
                              ORDER BY x.accepted_at DESC, x.run_id DESC) AS n,
           count(*) OVER (PARTITION BY x.project) AS exports
    FROM (
        SELECT COALESCE(a.project, p.project) AS project, r.run_id, r.accepted_at
        FROM run_projects p JOIN runs r ON r.run_id = p.run_id
        LEFT JOIN project_aliases a ON a.name = p.project
        UNION ALL
        SELECT project, run_id, accepted_at FROM project_exports
    ) x
    LEFT JOIN removed_projects d ON d.project = x.project
    WHERE d.project IS NULL OR x.accepted_at > d.removed_at
) ranked WHERE n = 1;
CREATE TABLE IF NOT EXISTS project_summary (
    project     TEXT COLLATE "C" PRIMARY KEY,  -- the name it goes by now
    run_id      TEXT COLLATE "C" NOT NULL,     -- its latest export's run
    accepted_at DOUBLE PRECISION NOT NULL,     -- that run's acceptance: the home page's order
    exports     BIGINT NOT NULL                -- how many exports it shows
);
CREATE INDEX IF NOT EXISTS project_summary_latest ON project_summary (accepted_at, run_id);
INSERT INTO project_summary (project, run_id, accepted_at, exports)
SELECT project, run_id, accepted_at, exports FROM project_latest
ON CONFLICT (project) DO NOTHING;
-- A new export (its run is stored first, in the same transaction): one more for its
-- project, and its latest if it came after the one the summary holds.
CREATE OR REPLACE FUNCTION project_summary_export() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO project_summary AS s (project, run_id, accepted_at, exports)
    SELECT COALESCE((SELECT a.project FROM project_aliases a WHERE a.name = NEW.project),
                    NEW.project), r.run_id, r.accepted_at, 1
    FROM runs r WHERE r.run_id = NEW.run_id
    ON CONFLICT (project) DO UPDATE SET
        exports = s.exports + 1,
        run_id = CASE WHEN (excluded.accepted_at, excluded.run_id) > (s.accepted_at, s.run_id)
                      THEN excluded.run_id ELSE s.run_id END,
        accepted_at = CASE WHEN (excluded.accepted_at, excluded.run_id)
                                > (s.accepted_at, s.run_id)
                           THEN excluded.accepted_at ELSE s.accepted_at END;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS project_summary_export ON run_projects;
CREATE TRIGGER project_summary_export AFTER INSERT ON run_projects
    FOR EACH ROW EXECUTE FUNCTION project_summary_export();
