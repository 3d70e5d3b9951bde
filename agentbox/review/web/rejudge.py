"""Judge a review again at the other stage: `POST /runs/{run_id}/rejudge`, from the
review's page (its one-click button, with the page's CSRF token) or from
`agentbox rejudge` (the admin token). The same bytes the review heard (the
archive's copy) are reviewed anew as a `mix.review_requested` whose `rejudge_of`
names the first review: a new run beside the first, its `stage_source` "rejudge".

The event goes through the receiver's own hand-over (as a webhook's would, without
the signature: the page or the token vouched for it), so its runs start at once.
The event id is the review's and the stage's: asking twice answers the first
re-judgment. A review that asks (its stage inferred from split evidence) may be
judged again at either stage: confirming the stage it leaned to settles it too.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from agentbox.archive import Archive, Gone
from agentbox.archive.history import History
from agentbox.events import SCHEMA_VERSION
from agentbox.http.access import Access, page_form, posted_form, small_body, token_required
from agentbox.http.errors import error_response
from agentbox.http.pages import StatusPages
from agentbox.http.receiver import Rejected
from agentbox.review.model import MixReview, as_review
from agentbox.review.stage import STAGES
from agentbox.review.web.audio import reviewed
from agentbox.store import IngestResult

# Stores an event the page vouches for and starts its runs (agentbox.apps.Host.take).
Take = Callable[[bytes], Awaitable[IngestResult]]

REJUDGE_SOURCE = "agentbox.rejudge"  # the events' source: a re-judgment asked for here
REJUDGE_EVENT = "mix.review_requested"


class Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def refused_answer(refused: Refusal, pages: StatusPages | None = None) -> Response:
    """A refusal as a program reads it (JSON), or, given the pages, as a page a form's
    post lands on (in words, with the same status)."""
    if pages is not None:
        return pages.error(refused.status, refused.message)
    return error_response(refused.status, refused.code, refused.message)


class RejudgeRoutes:
    def __init__(self, history: History, archive: Archive, access: Access, csrf: str,
                 take: Take, pages: StatusPages | None = None) -> None:
        self.take = take  # the host's: events this page vouches for
        self.pages = pages  # a form's refusal is a page
        self.history = history
        self.archive = archive
        self.access = access
        self.csrf = csrf  # the page's

    async def rejudge(self, request: Request) -> Response:
        """The form's post (a redirect to the new review's page) or the CLI's (JSON:
        the new run's id and where to follow it)."""
        from_form = posted_form(request)
        asked = await (self._form(request) if from_form else self._json(request))
        if isinstance(asked, Response):
            return asked
        try:
            result = await self.submit(request, request.path_params["run_id"], asked)
        except Refusal as refused:
            return refused_answer(refused, self.pages if from_form else None)
        run_id = result.runs[0].run_id
        if from_form:
            return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)
        return JSONResponse(accepted(result), status_code=200 if result.duplicate else 202)

    async def _form(self, request: Request) -> str | Response:
        form = await page_form(request, self.csrf)
        if isinstance(form, Response):
            return form
        return str(form.get("stage") or "")

    async def _json(self, request: Request) -> str | Response:
        if not self.access.may_change(request, self.csrf):
            return token_required()
        try:
            body = json.loads(await small_body(request) or b"{}")
            return str(body.get("stage") or "") if isinstance(body, dict) else ""
        except ValueError:
            return error_response(422, "invalid_request", 'The body is JSON: {"stage": '
                                  '"mix"} or {"stage": "master"}.')

    async def submit(self, request: Request, run_id: str, stage: str) -> IngestResult:
        """Store the re-judgment's event and hand its run over to start."""
        if stage not in STAGES:
            raise Refusal(422, "invalid_stage", f"stage must be {' or '.join(STAGES)}.")
        review = await self._review(run_id)
        if review.stage == stage and not asks(review):
            other = next(s for s in STAGES if s != stage)
            raise Refusal(409, "same_stage", f"This review already judges it as a {stage}; "
                          f"judge it as a {other} to read it the other way.")
        mix = await self.archive.heard_at(_heard(review))
        if isinstance(mix, Gone):
            raise Refusal(410, "audio_gone", f"It cannot be judged again: {mix.reason}.")
        body = _envelope(run_id, review, stage, str(mix))
        return await hand_over(self.take, body, "This review cannot be judged again")

    async def _review(self, run_id: str) -> MixReview:
        found = await self.history.export(run_id)
        review = None if found is None else as_review(found.result)
        if found is None or review is None:
            raise Refusal(404, "not_found", f"No finished review {run_id[:200]!r}: only a "
                          "finished review of a project can be judged again.")
        return review


def asks(review: MixReview) -> bool:
    """The review asks which stage it is (inferred from split evidence): either
    button settles it, the stage it leaned to as well as the other."""
    return review.stage_source == "auto" and review.stage_split


async def hand_over(take: Take, body: bytes, cannot: str) -> IngestResult:
    """Store an event the page or the admin token vouched for (no signature) through
    the receiver (`take`: agentbox.apps.Host.take: the contract, the agents'
    admission, the store's refusals, and its runs started at once); Refusal, with
    `cannot` leading the sentence, when it is not taken."""
    try:
        return await take(body)
    except Rejected as refused:
        why = refused.errors[0]["msg"] if refused.errors else refused.message
        raise Refusal(refused.status, refused.code, f"{cannot}: {why}") from None


def accepted(result: IngestResult) -> dict[str, Any]:
    """The answer, in the receiver's shape (agentbox.models.Accepted)."""
    runs = [{"run_id": r.run_id, "agent": r.agent, "status": r.status,
             "status_url": f"/runs/{r.run_id}"} for r in result.runs]
    return {**runs[0], "duplicate": result.duplicate, "runs": runs}


def _heard(review: MixReview) -> Any:
    found = reviewed(review.model_dump(mode="json"))
    assert found is not None  # a review always names its mix
    return found


def _envelope(run_id: str, review: MixReview, stage: str, mix: str) -> bytes:
    """The re-judgment's event: the first review's project, profile and genre, the
    bytes it heard, the stage asked for."""
    event_id = f"{run_id}.rejudge.{stage}"
    payload: dict[str, Any] = {
        "project_id": review.project_id, "mix_url": mix, "stage": stage,
        "requested_by": "agentbox", "rejudge_of": run_id, "profile": review.profile.name}
    if review.file is not None:
        payload["file_name"] = review.file.name
    if review.genre:
        payload["genre"] = review.genre
    return json.dumps({
        "schema_version": SCHEMA_VERSION, "event_id": event_id,
        "idempotency_key": f"{REJUDGE_SOURCE}:{REJUDGE_EVENT}:{event_id}",
        "event_type": REJUDGE_EVENT, "source": REJUDGE_SOURCE,
        "timestamp": datetime.now(UTC).isoformat(), "payload": payload,
    }, separators=(",", ":")).encode()
