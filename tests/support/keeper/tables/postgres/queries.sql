-- name: keep_runs
INSERT INTO kept_values (run_id, value, name, tags, size, source, accepted_at)
SELECT k.value ->> 0,
       CASE jsonb_typeof(k.value -> 1) WHEN 'object' THEN (k.value -> 1)::text
            ELSE k.value ->> 1 END,
       k.value -> 1 ->> 'name', (k.value -> 1 -> 'tags')::text,
       (k.value -> 1 ->> 'size')::bigint, k.value ->> 2, (k.value ->> 3)::double precision
FROM jsonb_array_elements(%(rows)s::jsonb) k

-- name: keep_runs.again
UPDATE kept_values SET name = name || '/' || name
WHERE run_id IN (SELECT k.value ->> 0 FROM jsonb_array_elements(%(rows)s::jsonb) k)
  AND name IS NOT NULL
