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


# -- where a musician types it --------------------------------------------------------------------


@pytest.mark.slow  # a server and its analysis process, the CLI in processes of its own
@pytest.mark.anyio
async def test_send_watch_the_client_and_the_mcp_tool_give_the_genre(
        server_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import subprocess
    import sys

    from mcp import Client as McpClient

    from agentbox.client import Client, Refused
    from agentbox.mcp_server import Agentbox, build_server
    from tests.conftest import SECRET

    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    song = song_audio(Song(lufs=-20.0))[:48_000 * 20]
    folder = tmp_path / "exports"
    folder.mkdir()

    def agentbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                              env=server.env, capture_output=True, text=True, timeout=180,
                              cwd=tmp_path)

    def genre_of(run_id: str) -> str | None:
        result = server.wait_terminal(run_id, timeout=120)["result"]
        return None if result is None else result["genre"]

    suite = write(tmp_path / "suite.wav", song)
    sent = agentbox("send", str(suite), "--genre", "orchestral", "--wait", "--json")
    assert sent.returncode == 0, sent.stderr
    run = json.loads(sent.stdout.split("\n", 1)[1])  # the answer, then the run
    assert run["result"]["genre"] == "orchestral"
    assert run["result"]["metrics"]["tonal_reference"] == (
        "the reference curve for orchestral music")
    runs_before = len(server.client.get("/runs", params={"limit": 50}).json()["runs"])
    unknown = agentbox("send", str(suite), "--genre", "polka")
    assert unknown.returncode == 2 and "'polka' is not one of" in unknown.stderr
    assert all(f"'{name}'" in unknown.stderr for name in GENRES)  # never sent
    assert len(server.client.get("/runs", params={"limit": 50}).json()["runs"]) == runs_before

    write(folder / "session.wav", song[::-1].copy())
    watched = agentbox("watch", str(folder), "--genre", "jazz", "--existing", "--once")
    assert watched.returncode == 0, watched.stderr
    by_watch = [r for r in server.client.get("/runs", params={"limit": 50}).json()["runs"]
                if r["source"] == "watch"]
    assert len(by_watch) == 1 and genre_of(by_watch[0]["run_id"]) == "jazz"

    for name in ("XDG_CONFIG_HOME", "AGENTBOX_DATA_DIR"):
        monkeypatch.setenv(name, server.env[name])
    monkeypatch.setenv("AGENTBOX_WEBHOOK_SECRET", SECRET)
    take = write(tmp_path / "take-2.wav", song * 0.8)
    with Client(server.url) as client:
        assert genre_of(client.send_export(take, genre="acoustic").run_id) == "acoustic"
        with pytest.raises(Refused) as refused:
            client.send_export(take, genre="polka")
    assert refused.value.status == 422
    assert [e["loc"] for e in refused.value.errors] == [["payload", "genre"]]

    ambient = write(tmp_path / "drift.wav", song * 0.7)
    async with McpClient(build_server(Agentbox(server.url))) as mcp:
        told = await mcp.call_tool("send_export", {"mix_path": str(ambient), "genre": "ambient"})
        assert not told.is_error and isinstance(told.structured_content, dict)
        assert genre_of(told.structured_content["run_id"]) == "ambient"
        wrong = await mcp.call_tool("request_review", {
            "mix_path": str(ambient), "project": "drift", "requested_by": "ana",
            "genre": "polka"})
        assert wrong.is_error
        assert wrong.content[0].text == ("request_review: genre must be one of "  # type: ignore[union-attr]
                                         f"{', '.join(GENRES)}, not \"polka\"")
