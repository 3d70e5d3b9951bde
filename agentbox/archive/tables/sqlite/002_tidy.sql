-- The review's tables, version 2: projects a musician tidies. A renamed or merged
-- project's old name stays an alias of the project it became (its events keep the
-- name they were sent with, in the engine's table: the pages read them through the
-- alias, and an export still sent under the old name joins the project); a removed
-- project's exports up to its removal are no longer shown (a later export under
-- its name starts it anew).
CREATE TABLE IF NOT EXISTS project_aliases (
    name    TEXT PRIMARY KEY,  -- a project's former name
    project TEXT NOT NULL      -- the project it is now
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS project_aliases_project ON project_aliases (project);
CREATE TABLE IF NOT EXISTS removed_projects (
    project    TEXT PRIMARY KEY,
    removed_at REAL NOT NULL  -- its exports accepted up to then are gone from the pages
) WITHOUT ROWID;
