-- adds column: events project TEXT
-- The project an event names (payload.project_id, NFC), read once at ingest:
-- project pages and searches compare it exactly, through its index. The column
-- is added by the engine when missing (SQLite has no ADD COLUMN IF NOT EXISTS);
-- nfc() is the engine's Python function, unicodedata's NFC.
UPDATE events SET project = nfc(json_extract(CAST(body AS TEXT), '$.payload.project_id'))
WHERE project IS NULL AND json_valid(CAST(body AS TEXT))
  AND json_type(CAST(body AS TEXT), '$.payload.project_id') = 'text';
CREATE INDEX IF NOT EXISTS events_project ON events (project, pk) WHERE project IS NOT NULL;
