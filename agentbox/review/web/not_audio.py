"""Files that could not be reviewed as audio (a text file named .wav, an empty file):
no export of any project, listed apart on the home page ("couldn't review") until a
musician dismisses them.

Whichever door a file came by (a watched folder, `agentbox send`, a signed event),
its review fails with mix_unreadable when it holds no audio; as that failure commits,
the run is noted as such in the review's `not_audio` table, which takes it out of
its project's exports, its latest and its count (the review's version 7). The page's
drop box refuses such a file before it is sent (422 not_audio): nothing to note.

`POST /runs/{run_id}/dismiss`, from the home page's form (its CSRF token: answered
with a redirect home) or a program (the admin token: JSON), stops listing one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from agentbox.archive.history import History
from agentbox.http.access import Access, page_form, posted_form, token_required
from agentbox.http.pages import StatusPages
from agentbox.review.web.rejudge import Refusal, refused_answer
from agentbox.runs import RunStatus
from agentbox.store import Transition

NOT_AUDIO = "mix_unreadable"  # the review's error code for a file that holds no audio
log = logging.getLogger("agentbox.review")


class NotAudio:
    def __init__(self, history: History, access: Access, csrf: str,
                 reviews: Callable[[str], bool], clock: Callable[[], float] = time.time,
                 pages: StatusPages | None = None) -> None:
        self.history = history
        self.access = access
        self.csrf = csrf  # the page's
        self.reviews = reviews  # whether a run's agent is the mix review
        self.clock = clock
        self.pages = pages  # a form's refusal is a page
        self._noting: set[asyncio.Task[None]] = set()

    def on_transition(self, t: Transition) -> None:
        """A review failed as its file holds no audio: noted, as no export; one noted
        and replayed that succeeds (its file holds audio now): an export again."""
        failed = t.status == RunStatus.FAILED_PERMANENT and t.error_code == NOT_AUDIO
        if not (failed or t.status == RunStatus.SUCCEEDED) or not self.reviews(t.agent):
            return
        task = asyncio.get_running_loop().create_task(self._note(t.run_id, failed))
        self._noting.add(task)
        task.add_done_callback(self._noting.discard)

    async def catch_up(self) -> None:
        """At start: note what a stop between a review's end and its noting left
        undone (the noting follows the outcome's commit), so that a crash in between
        loses no note."""
        for run_id, agent, failed in await self.history.missed_not_audio():
            if self.reviews(agent):
                await self._note(run_id, failed)

    async def _note(self, run_id: str, failed: bool) -> None:
        try:
            if failed:
                await self.history.note_not_audio(run_id, self.clock())
            else:
                await self.history.unnote_not_audio(run_id)
        except Exception:  # the store's trouble is logged by it; the run page still says
            log.exception("could not note whether run %s holds audio", run_id)

    async def dismiss(self, request: Request) -> Response:
        """`POST /runs/{run_id}/dismiss`: no longer listed as couldn't review."""
        from_form = posted_form(request)
        if from_form:
            form = await page_form(request, self.csrf)
            if isinstance(form, Response):
                return form
        elif not self.access.may_change(request, self.csrf):
            return token_required()
        run_id = request.path_params["run_id"][:200]
        if not await self.history.dismiss_not_audio(run_id, self.clock()):
            return refused_answer(Refusal(404, "not_listed", "No file that could not be "
                                          "reviewed is listed under this run."),
                                  self.pages if from_form else None)
        if from_form:
            return RedirectResponse("/", status_code=303)
        return JSONResponse({"run_id": run_id, "dismissed": True})
