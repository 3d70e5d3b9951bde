"""The watched folders' routes (the desktop app's): `GET /watch` says whether they
are paused and how each folder is; `POST /watch/pause` and `POST /watch/resume`
change it, for the admin token (the CLI, the tray) or the page's own script (its
CSRF token in X-CSRF-Token, from this site): on loopback the page is open to this
machine, so a form another site posts must not pause anyone's folders."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentbox.desktop.answers import WatchedFolderOut, WatchState
from agentbox.desktop.watched import Pause, WatchedFolders
from agentbox.http.access import Access, token_required
from agentbox.http.errors import error_response
from agentbox.http.openapi import ApiPart, errors, json_answer


class WatchRoutes:
    def __init__(self, pause: Pause, folders: WatchedFolders | None, access: Access,
                 csrf: str) -> None:
        self.pause = pause
        self.folders = folders  # None: no folder is configured (the pause is kept all the same)
        self.access = access
        self.csrf = csrf

    def state(self) -> WatchState:
        found = [] if self.folders is None else self.folders.status()
        return WatchState(paused=self.pause.paused, folders=[
            WatchedFolderOut(path=str(f.path), stage=f.stage, state=f.state, said=f.said,
                             note=f.note, last_file=f.last_file, last_at=f.last_at)
            for f in found])

    async def get(self, request: Request) -> Response:
        return JSONResponse(self.state().model_dump(mode="json"))

    async def pause_folders(self, request: Request) -> Response:
        return self._set(request, True)

    async def resume_folders(self, request: Request) -> Response:
        return self._set(request, False)

    def _set(self, request: Request, paused: bool) -> Response:
        if not self._may_change(request):
            return token_required()
        try:
            self.pause.set(paused)
        except OSError as exc:
            return error_response(503, "storage_unavailable", "The pause cannot be kept in "
                                  f"the data directory ({exc.strerror}).")
        return JSONResponse(self.state().model_dump(mode="json"))

    def _may_change(self, request: Request) -> bool:
        return self.access.may_change(request, self.csrf)


def api() -> ApiPart:
    admin: list[dict[str, list[str]]] = [{"admin": []}]
    change: dict[str, Any] = {
        "security": admin,
        "description": "The admin token, or the page's own script with its CSRF token "
                       "in X-CSRF-Token. Kept in the data directory: a restart keeps it.",
        "responses": {"200": json_answer("WatchState", "the folders' state now"),
                      **errors(401, 503)}}
    return ApiPart(models=[WatchedFolderOut, WatchState], paths={
        "/watch": {"get": {
            "summary": "The watched folders: paused or not, and how each folder is",
            "responses": {"200": json_answer("WatchState", "paused, and each folder")},
        }},
        "/watch/pause": {"post": {
            **change, "summary": "Pause the watched folders: renders are found but not "
                                 "sent until resumed (admin, or the page with CSRF)"}},
        "/watch/resume": {"post": {
            **change, "summary": "Resume the watched folders: what was written meanwhile "
                                 "is sent, the newest last (admin, or the page with CSRF)"}},
    })
