"""Projects a musician tidies: rename one, merge one into another, remove one.

`POST /projects/{project}/rename` (`to`), `/merge` (`into`) and `/remove`, from the
project page's forms (its CSRF token: answered with a redirect) or from `agentbox
project …` (the admin token, JSON). A renamed or merged project's exports, kept
audio and reference follow it, and its old name stays an alias of it
(agentbox.archive.history); a removed one's exports leave the pages and its audio
goes by the archive's rules.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from agentbox.archive import Archive
from agentbox.archive.history import History
from agentbox.http.access import Access, page_form, posted_form, small_body, token_required
from agentbox.http.errors import error_response
from agentbox.http.pages import StatusPages
from agentbox.review.contract import ProjectName
from agentbox.review.web.rejudge import Refusal, refused_answer

_NAME: TypeAdapter[str] = TypeAdapter(ProjectName)
Action = Callable[[str, dict[str, str]], Awaitable[dict[str, Any]]]


def project_url(name: str) -> str:
    return "/projects/" + quote(name, safe="")


class TidyRoutes:
    def __init__(self, history: History, archive: Archive, access: Access, csrf: str,
                 clock: Callable[[], float] = time.time,
                 pages: StatusPages | None = None) -> None:
        self.pages = pages  # a form's refusal is a page
        self.history = history
        self.archive = archive
        self.access = access
        self.csrf = csrf  # the page's
        self.clock = clock

    async def rename(self, request: Request) -> Response:
        return await self._act(request, self._rename)

    async def merge(self, request: Request) -> Response:
        return await self._act(request, self._merge)

    async def remove(self, request: Request) -> Response:
        return await self._act(request, self._remove)

    async def _act(self, request: Request, action: Action) -> Response:
        from_form = posted_form(request)
        asked = await (self._form(request) if from_form else self._json(request))
        if isinstance(asked, Response):
            return asked
        name = unicodedata.normalize("NFC", request.path_params["project"][:1024])
        try:
            done = await action(name, asked)
        except Refusal as refused:
            return refused_answer(refused, self.pages if from_form else None)
        if from_form:
            target = done.get("project")
            return RedirectResponse(project_url(target) if target else "/", status_code=303)
        return JSONResponse(done)

    async def _form(self, request: Request) -> dict[str, str] | Response:
        form = await page_form(request, self.csrf)
        if isinstance(form, Response):
            return form
        return {key: str(value) for key, value in form.items() if key != "csrf"}

    async def _json(self, request: Request) -> dict[str, str] | Response:
        if not self.access.may_change(request, self.csrf):
            return token_required()
        try:
            body = json.loads(await small_body(request) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error_response(422, "invalid_request", "The body is a JSON object.")
        return {key: str(value) for key, value in body.items()}

    # -- the actions ------------------------------------------------------------------

    async def _rename(self, name: str, asked: dict[str, str]) -> dict[str, Any]:
        old = await self._existing(name)
        new = _valid(asked.get("to", ""), "to")
        if new == old:
            raise Refusal(422, "invalid_request", f"The project is called {new!r} already.")
        if await self.history.project_exports(new, limit=1):
            raise Refusal(409, "project_exists", f"A project called {new!r} exists: merge "
                          "into it instead (the project page's Merge, or agentbox project "
                          "merge).")
        await self.history.move(old, new)
        return {"project": new, "was": old}

    async def _merge(self, name: str, asked: dict[str, str]) -> dict[str, Any]:
        old = await self._existing(name)
        into = await self._existing(_valid(asked.get("into", ""), "into"))
        if into == old:
            raise Refusal(422, "invalid_request", "A project cannot be merged into itself.")
        await self.history.move(old, into)
        return {"project": into, "merged": old}

    async def _remove(self, name: str, asked: dict[str, str]) -> dict[str, Any]:
        project = await self._existing(name)
        count = len(await self.history.project_exports(project, limit=100_000))
        await self.history.remove_project(project, self.clock())
        dropped = await self.archive.forget_project(project)
        return {"project": None, "removed": project, "exports": count,
                "audio_dropped": dropped}

    async def _existing(self, name: str) -> str:
        """The project `name` names now; Refusal when it has no export."""
        project = await self.history.resolve(name)
        if not await self.history.project_exports(project, limit=1):
            raise Refusal(404, "project_not_found",
                          f"No export of a project named {name[:200]!r} has arrived yet.")
        return project


def _valid(name: str, field: str) -> str:
    try:
        return _NAME.validate_python(name)
    except ValidationError:
        raise Refusal(422, "invalid_request", f"{field}: a project's name, 1 to 256 "
                      "characters without control characters or spaces at either end."
                      ) from None
