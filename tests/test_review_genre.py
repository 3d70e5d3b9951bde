"""`payload.genre`: the review's genres (agentbox.review.genres) on both review
events, an unknown one refused at once with the field named."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from agentbox.archive.records import ProjectExport
from agentbox.engine.agents import AgentContext
from agentbox.events import InvalidEvent, parse_event
from agentbox.review.agent import mix_review
from agentbox.review.analysis import Analysis
from agentbox.review.genres import GENRES
from agentbox.review.model import MixReview
from tests.conftest import encode, in_process, make_event
from tests.support.corpus import Song, song_audio, write
from tests.support.history import services_with

ANALYSIS = Analysis()


@pytest.fixture(scope="module", autouse=True)
def analysis_processes() -> Iterator[None]:
    yield
    ANALYSIS.shutdown()


@pytest.mark.parametrize("event_type", ["session.exported", "mix.review_requested"])
def test_a_known_genre_is_taken(event_type: str) -> None:
    payload = {"project_id": "p", "mix_url": "/tmp/mix.wav", "genre": "orchestral"}
    if event_type == "mix.review_requested":
        payload["requested_by"] = "ana"
    event = parse_event(encode(make_event(event_type=event_type, payload=payload)))
    assert event.payload.genre == "orchestral"


@pytest.mark.parametrize("event_type", ["session.exported", "mix.review_requested"])
def test_an_unknown_genre_is_refused_naming_the_field(event_type: str) -> None:
    payload = {"project_id": "p", "mix_url": "/tmp/mix.wav", "genre": "polka"}
    if event_type == "mix.review_requested":
        payload["requested_by"] = "ana"
    with pytest.raises(InvalidEvent) as refused:
        parse_event(encode(make_event(event_type=event_type, payload=payload)))
    errors = refused.value.errors
    assert [(e["loc"], e["type"]) for e in errors] == [(["payload", "genre"], "unknown_genre")]
    assert all(name in errors[0]["msg"] for name in GENRES)


@pytest.mark.anyio
async def test_the_receiver_answers_an_unknown_genre_with_a_422(tmp_path: Path) -> None:
    mix = tmp_path / "mix.wav"
    soundfile.write(mix, np.zeros((44_100, 2)), 44_100)
    old = time.time() - 60
    os.utime(mix, (old, old))
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as app:  # the built-in review
        answer = await app.post(make_event(payload={
            "project_id": "p", "mix_url": str(mix), "genre": "polka"}))
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert body["error_code"] == "invalid_event"
        assert [(e["loc"], e["type"]) for e in body["errors"]] == [
            (["payload", "genre"], "unknown_genre")]
        accepted = await app.post(make_event(payload={
            "project_id": "p", "mix_url": str(mix), "genre": "jazz"}))
        assert accepted.status_code == 202, accepted.text


def context(previous: MixReview | None = None) -> AgentContext:
    async def previous_export(project: str) -> ProjectExport | None:
        if previous is None:
            return None
        return ProjectExport(run_id="run_before", project=project,
                             agent="agentbox.review.agent:mix_review", status="succeeded",
                             accepted_at="2026-07-27T14:02:00Z", finished_at=None,
                             result=previous.model_dump(mode="json"))
    return AgentContext(run_id="run_genre", attempt=1, agent="agentbox.review.agent:mix_review",
                        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
                        services={**services_with(previous_export), Analysis: ANALYSIS})


def review(path: Path, ctx: AgentContext, **payload: Any) -> MixReview:
    event = parse_event(encode(make_event(payload={"project_id": "suite",
                                                   "mix_url": str(path), **payload})))
    return asyncio.run(mix_review(event, ctx))


def test_a_genre_given_for_the_project_sticks(tmp_path: Path) -> None:
    mix = write(tmp_path / "mix.wav", song_audio(Song(lufs=-20.0)))
    given = review(mix, context(), genre="orchestral")
    assert given.genre == "orchestral"
    assert given.metrics.tonal_reference == "the reference curve for orchestral music"
    later = review(mix, context(previous=given))
    assert later.genre == "orchestral"
    assert later.metrics.tonal_reference == given.metrics.tonal_reference
    other = review(mix, context(previous=given), genre="electronic")
    assert other.genre == "electronic"
    none = review(mix, context())
    assert none.genre is None and none.metrics.tonal_reference == "the reference curve for music"
