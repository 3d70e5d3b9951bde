-- The review's tables, version 6: the bytes of each render as its admission read them
-- (the size and SHA-256 of the file a session.exported named), kept with its run's
-- project in the ingest's transaction. A project's latest export is known by its
-- bytes from the moment it is accepted, not only once its review has heard them: the
-- same bytes sent again while it is queued or running are that export. NULL: a run
-- stored before this version, or one that is no render (a re-judgment).
ALTER TABLE run_projects ADD COLUMN IF NOT EXISTS size BIGINT;
ALTER TABLE run_projects ADD COLUMN IF NOT EXISTS sha256 TEXT;
