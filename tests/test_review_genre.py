"""`payload.genre`: the review's genres (agentbox.review.genres) on both review
events, an unknown one refused at once with the field named."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from agentbox.events import InvalidEvent, parse_event
from agentbox.review.genres import GENRES
from tests.conftest import encode, in_process, make_event


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
