"""An export log: every export sent to the review is a line of a CSV file, and a page
shows the log. Written from agentbox/docs/apps.md alone, as a user's app would be:
it takes the review's `session.exported` (so it requires the review), lends its log
to its agent by type, and ships a template and a stylesheet named as the engine's
and the review's are (`home.html`, `page.css`), which its name keeps apart."""

from __future__ import annotations

import asyncio
import csv
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from agentbox import AgentContext, Event, PermanentAgentError
from agentbox.apps import App, Host

HERE = Path(__file__).parent
FIELDS = ("run_id", "project", "file", "logged_at")


class ExportLog:
    """The CSV file: one line per export, once per run (an attempt after a crash
    finds its line there already)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()

    async def add(self, row: dict[str, str]) -> None:
        async with self._lock:
            await asyncio.to_thread(self._append, row)

    async def rows(self) -> list[dict[str, str]]:
        return await asyncio.to_thread(self._read)

    def _append(self, row: dict[str, str]) -> None:
        if any(line["run_id"] == row["run_id"] for line in self._read()):
            return
        new = not self.path.exists()
        with open(self.path, "a", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, FIELDS)
            if new:
                writer.writeheader()
            writer.writerow(row)

    def _read(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="", encoding="utf-8") as file:
            return list(csv.DictReader(file))


class Logged(BaseModel):
    log: str  # the CSV file


async def log_export(event: Event, ctx: AgentContext) -> Logged:
    log = ctx.service(ExportLog)
    if log is None:
        raise PermanentAgentError("no export log here", "no_export_log")
    await log.add({"run_id": ctx.run_id, "project": event.payload.project_id,
                   "file": Path(event.payload.mix_url).name,
                   "logged_at": f"{time.time():.3f}"})
    return Logged(log=str(log.path))


class ExportLogApp(App):
    name = "exportlog"
    requires = ("review",)  # session.exported is the review's
    templates = HERE / "templates"
    static = HERE / "static"

    def agents(self) -> Mapping[str, Sequence[str]]:
        return {"session.exported": (f"{__name__}:log_export",)}

    def setup(self, host: Host) -> None:
        self.log = ExportLog(host.settings.data_dir / "exports.csv")
        self.pages = host.pages
        host.provide(ExportLog, self.log)
        host.add_menu_link("Export log", "/exportlog")

    def routes(self) -> Sequence[BaseRoute]:
        return [Route("/exportlog", self.page), Route("/exportlog.csv", self.csv)]

    async def page(self, request: Request) -> Response:
        return self.pages.page("exportlog/home.html", rows=await self.log.rows())

    async def csv(self, request: Request) -> Response:
        body = await asyncio.to_thread(self.log.path.read_bytes) if self.log.path.exists() else b""
        return Response(body, media_type="text/csv")


app = ExportLogApp()
