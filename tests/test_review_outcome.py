"""What became of an export without a verdict, in a musician's words
(agentbox.review.present.outcome): the page's words where a verdict would be."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbox.review.present import outcome
from agentbox.runs import RunStatus

EMPTY = ("the file is empty (0 bytes): nothing was rendered into it; export it again")


@pytest.mark.parametrize(("status", "code", "message", "kind", "text"), [
    ("accepted", None, None, "reviewing", "reviewing…"),
    ("processing", None, None, "reviewing", "reviewing…"),
    ("failed_retryable", "mix_incomplete", "/m/a.wav is still being written", "waiting",
     "waiting for the render to finish"),
    ("failed_retryable", "mix_truncated", "the header promises 3:00", "waiting",
     "waiting for the render to finish"),
    ("failed_retryable", "timeout", "the agent ran longer than 300 s", "reviewing",
     "reviewing… (trying again shortly)"),
    ("failed_permanent", "mix_unreadable", EMPTY, "failed",
     "couldn't review: the file is empty — export it again"),
    ("failed_permanent", "mix_unreadable", "not a readable audio file: Format not recognised",
     "failed", "couldn't review: it is not audio agentbox can read (whatever its name "
               "says) — export it again as WAV, AIFF or FLAC"),
    ("failed_permanent", "mix_not_found", "no file at /music/gone.wav", "failed",
     "couldn't review: the file is not there any more — export it again"),
    ("dead_lettered", "mix_truncated", "cut short", "failed",
     "couldn't review: the render was cut short — export it again"),
    ("failed_permanent", "unknown_profile", "unknown profile 'loud'; use one of streaming",
     "failed", "couldn't review: unknown profile 'loud'; use one of streaming"),
    ("succeeded", None, None, "done", "finished without a review"),
    ("dead_lettered", None, None, "failed",
     "couldn't review: something went wrong — its Details say what"),
])
def test_each_state_is_said_as_a_musician_reads_it(status: str, code: str | None,
                                                   message: str | None, kind: str,
                                                   text: str) -> None:
    said = outcome(status, code, message)
    assert (said.kind, said.text) == (kind, text)
    assert said.pending is (kind in ("reviewing", "waiting"))


@given(st.sampled_from(list(RunStatus)), st.none() | st.text(max_size=40),
       st.none() | st.text(max_size=2000))
def test_no_state_is_said_by_its_engine_name(status: RunStatus, code: str | None,
                                             message: str | None) -> None:
    said = outcome(status.value, code, message)
    words = said.text.removeprefix("couldn't review: ")
    if not message or status.value not in (message or ""):
        assert not any(s.value in words for s in RunStatus), said
    assert said.text and "\n" not in said.text and len(said.text) <= 220
