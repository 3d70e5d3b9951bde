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

-- name: keep_runs.count
WITH given AS (
    SELECT k.value -> 1 ->> 'name' AS name, k.value ->> 0 AS run_id,
           (k.value ->> 3)::double precision AS accepted_at
    FROM jsonb_array_elements(%(rows)s::jsonb) k
    WHERE jsonb_typeof(k.value -> 1) = 'object' AND k.value -> 1 ->> 'name' IS NOT NULL
)
INSERT INTO kept_counts AS c (name, runs, latest, accepted_at)
SELECT DISTINCT ON (name) name, count(*) OVER (PARTITION BY name), run_id, accepted_at
FROM given ORDER BY name, accepted_at DESC, run_id DESC
ON CONFLICT (name) DO UPDATE SET
    runs = c.runs + excluded.runs,
    latest = CASE WHEN (excluded.accepted_at, excluded.latest) > (c.accepted_at, c.latest)
                  THEN excluded.latest ELSE c.latest END,
    accepted_at = greatest(c.accepted_at, excluded.accepted_at)
