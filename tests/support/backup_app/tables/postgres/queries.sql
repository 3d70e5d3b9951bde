-- name: add_copy
-- Again for the same run (an attempt after a crash): the same row.
INSERT INTO backup_copies (run_id, source, copy, copied_at)
VALUES (%(run_id)s, %(source)s, %(copy)s, %(copied_at)s)
ON CONFLICT (run_id) DO UPDATE SET copy = excluded.copy, copied_at = excluded.copied_at

-- name: copies
SELECT c.run_id, c.source, c.copy, c.copied_at, r.status
FROM backup_copies c LEFT JOIN runs r ON r.run_id = c.run_id
ORDER BY c.copied_at DESC LIMIT %(limit)s
