"""A backup of every export: an agent that copies each exported mix into a folder,
a table of the copies, and a page that lists them. Built only from what
agentbox/docs/apps.md says, as a user's app would be."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from jinja2 import FileSystemLoader
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from agentbox import AgentContext, Event, PermanentAgentError
from agentbox.http.apps import App, Host
from agentbox.store import Schema, Tables

SCHEMA = Schema(line="backup", package="tests.support.backup_app")
TEMPLATES = Path(__file__).parent / "templates"


class Copies:
    """The backup folder and the table of what is in it."""

    def __init__(self, tables: Tables, folder: Path) -> None:
        self.tables, self.folder = tables, folder

    async def add(self, run_id: str, source: Path, copy: Path) -> None:
        await self.tables.write(lambda db: db.run("add_copy", {
            "run_id": run_id, "source": str(source), "copy": str(copy),
            "copied_at": time.time()}))


class Copied(BaseModel):
    saved_to: str


async def copy(event: Event, ctx: AgentContext) -> Copied:
    copies = ctx.service(Copies)
    if copies is None:
        raise PermanentAgentError("no backup folder here", "no_backup")
    source = Path(event.payload.mix_url)
    target = copies.folder / f"{ctx.run_id}{source.suffix}"  # the run id: one copy per run
    await asyncio.to_thread(shutil.copyfile, source, target)
    await copies.add(ctx.run_id, source, target)
    return Copied(saved_to=str(target))


class BackupApp(App):
    name = "backup"
    schemas = (SCHEMA,)

    def agents(self) -> Mapping[str, Sequence[str]]:
        return {"session.exported": ("tests.support.backup_app.app:copy",)}

    def setup(self, host: Host) -> None:
        folder = host.settings.data_dir / "backup"
        folder.mkdir(exist_ok=True)
        self.copies = Copies(host.tables(SCHEMA), folder)
        self.pages = host.pages
        host.provide(Copies, self.copies)
        self.pages.env.loader.loaders.append(FileSystemLoader(TEMPLATES))  # type: ignore[union-attr]

    def routes(self) -> Sequence[BaseRoute]:
        return [Route("/backup", self.page)]

    async def page(self, request: Request) -> Response:
        rows = await self.copies.tables.rows("copies", limit=100)
        return self.pages.page("backup.html", copies=rows)


app = BackupApp()
