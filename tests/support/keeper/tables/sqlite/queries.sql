-- name: keep_runs
INSERT INTO kept_values (run_id, value, name, tags, size, source, accepted_at)
VALUES (:run_id, :value, :name, :tags, :size, :source, :accepted_at)

-- name: keep_runs.again
-- A second statement, the same parameter twice: each named once in the binding.
UPDATE kept_values SET name = :name || '/' || :name WHERE run_id = :run_id AND :name IS NOT NULL

-- name: keep_runs.count
-- Takes :runs: run once per name (and source) a transaction names, bound to the latest
-- of its runs, :runs their number. (:ghost, named in a comment, is no parameter, nor is
-- ':x' in a literal below: the statement fails to bind if either is taken for one.)
INSERT INTO kept_counts (name, runs, latest, accepted_at)
SELECT :name, :runs, :run_id, :accepted_at WHERE :name IS NOT NULL AND ':x' <> '' /* :y */
ON CONFLICT (name) DO UPDATE SET
    runs = runs + excluded.runs,
    latest = CASE WHEN (excluded.accepted_at, excluded.latest) > (accepted_at, latest)
                  THEN excluded.latest ELSE latest END,
    accepted_at = max(accepted_at, excluded.accepted_at)
