-- The review's tables, version 5: a re-judgment (an event of source agentbox.rejudge:
-- a new judgment of an export the project has) is no export of its own: not the
-- project's latest, not counted among its exports. project_latest and the summary's
-- trigger leave those runs out, and the summary is made again from the view.
CREATE OR REPLACE VIEW project_latest AS
SELECT project, run_id, accepted_at, exports FROM (
    SELECT x.project, x.run_id, x.accepted_at,
           row_number() OVER (PARTITION BY x.project
                              ORDER BY x.accepted_at DESC, x.run_id DESC) AS n,
           count(*) OVER (PARTITION BY x.project) AS exports
    FROM (
        SELECT COALESCE(a.project, p.project) AS project, r.run_id, r.accepted_at
        FROM run_projects p JOIN runs r ON r.run_id = p.run_id
        JOIN events e ON e.pk = r.event_pk
        LEFT JOIN project_aliases a ON a.name = p.project
        WHERE e.source <> 'agentbox.rejudge'
        UNION ALL
        SELECT project, run_id, accepted_at FROM project_exports
    ) x
    LEFT JOIN removed_projects d ON d.project = x.project
    WHERE d.project IS NULL OR x.accepted_at > d.removed_at
) ranked WHERE n = 1;
CREATE OR REPLACE FUNCTION project_summary_export() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM runs r JOIN events e ON e.pk = r.event_pk
               WHERE r.run_id = NEW.run_id AND e.source = 'agentbox.rejudge') THEN
        RETURN NULL;  -- a re-judgment: no export of its own
    END IF;
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
DELETE FROM project_summary;
INSERT INTO project_summary (project, run_id, accepted_at, exports)
SELECT project, run_id, accepted_at, exports FROM project_latest
ON CONFLICT (project) DO NOTHING;
