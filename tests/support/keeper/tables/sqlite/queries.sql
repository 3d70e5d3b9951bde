-- name: keep_runs
INSERT INTO kept_values (run_id, value, name, tags, size, source, accepted_at)
VALUES (:run_id, :value, :name, :tags, :size, :source, :accepted_at)

-- name: keep_runs.again
-- A second statement, the same parameter twice: each named once in the binding.
UPDATE kept_values SET name = :name || '/' || :name WHERE run_id = :run_id AND :name IS NOT NULL
