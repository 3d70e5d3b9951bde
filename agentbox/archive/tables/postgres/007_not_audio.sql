-- The review's tables, version 7: a file that could not be reviewed as audio (its
-- review failed with mix_unreadable: a text file named .wav, an empty file) is no
-- export of its project: not its latest, not counted, not numbered, in no list of
-- exports. It is noted in not_audio as its review fails, and listed apart on the home
-- page ("couldn't review") until a musician dismisses it (dismissed_at).
-- project_latest leaves those runs out; runs that failed so before this version are
-- noted here, and the summary is made again from the view.
CREATE TABLE IF NOT EXISTS not_audio (
    run_id       TEXT COLLATE "C" PRIMARY KEY,
    project      TEXT COLLATE "C" NOT NULL,  -- as the event named it
    noted_at     DOUBLE PRECISION NOT NULL,
    dismissed_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS not_audio_shown ON not_audio (noted_at, run_id)
    WHERE dismissed_at IS NULL;
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
    WHERE (d.project IS NULL OR x.accepted_at > d.removed_at)
      AND NOT EXISTS (SELECT 1 FROM not_audio n WHERE n.run_id = x.run_id)
) ranked WHERE n = 1;
INSERT INTO not_audio (run_id, project, noted_at)
SELECT r.run_id, p.project, COALESCE(r.completed_at, r.accepted_at)
FROM runs r JOIN run_projects p ON p.run_id = r.run_id
WHERE r.status = 'failed_permanent' AND r.error_code = 'mix_unreadable'
ON CONFLICT (run_id) DO NOTHING;
DELETE FROM project_summary;
INSERT INTO project_summary (project, run_id, accepted_at, exports)
SELECT project, run_id, accepted_at, exports FROM project_latest
ON CONFLICT (project) DO NOTHING;
