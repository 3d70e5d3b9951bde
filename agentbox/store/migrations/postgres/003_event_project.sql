-- The project an event names (payload.project_id, NFC), read once at ingest:
-- project pages and searches compare it exactly, through its index. A body whose
-- JSON holds a \u0000 (which jsonb refuses) names no project.
ALTER TABLE events ADD COLUMN IF NOT EXISTS project TEXT COLLATE "C";
UPDATE events SET project = normalize(doc ->> 'project_id', NFC)
FROM (SELECT pk AS event_pk, convert_from(body, 'UTF8')::jsonb -> 'payload' AS doc
      FROM events
      WHERE project IS NULL AND position('\u0000' in convert_from(body, 'UTF8')) = 0) parsed
WHERE pk = parsed.event_pk AND jsonb_typeof(doc -> 'project_id') = 'string';
CREATE INDEX IF NOT EXISTS events_project ON events (project, pk) WHERE project IS NOT NULL;
