"""`agentbox mcp` end to end: the MCP SDK's own client (`stdio_client`, `ClientSession`)
starts the installed `agentbox mcp` as a real subprocess and talks to it over stdio;
the MCP server talks to a real `agentbox serve` on 127.0.0.1 with a real SQLite store,
which reviews real WAV files the tests write (the built-in mix_review agent) and runs
the scripted test agents (tests/support/agents.py) for failures and dead letters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

from agentbox.cli import MCP_INSTALL
from agentbox.client import build_event
from agentbox.runs import RunStatus
from tests.conftest import SECRET, Server, free_port, wait_until_async

# Each test but the last starts `agentbox mcp` (most also `agentbox serve`): slow.
slow = pytest.mark.slow

AGENTS = ("session.exported=agentbox.review.agent:mix_review,"
          "mix.review_requested=tests.support.agents:scripted")
TOOLS = {"send_export", "request_review", "send_event", "list_runs", "show_run",
         "list_dead_letters", "replay_run", "project_history"}
RATE = 48_000
OLD = 1_700_000_000  # the mixes were rendered long ago: settled


def write_mix(path: Path, dbfs: float, seconds: float = 4.0) -> Path:
    """A stereo 1 kHz sine at `dbfs` (peak), 24-bit WAV."""
    t = np.arange(round(seconds * RATE)) / RATE
    wave = 10 ** (dbfs / 20) * np.sin(2 * np.pi * 1000.0 * t)
    soundfile.write(path, np.repeat(wave[:, None], 2, axis=1), RATE, subtype="PCM_24")
    os.utime(path, (OLD, OLD))
    return path


def agentbox_command() -> str:
    """The installed console script, as an assistant's configuration names it."""
    script = shutil.which("agentbox", path=str(Path(sys.executable).parent))
    assert script, f"agentbox is not installed beside {sys.executable}"
    return script


@asynccontextmanager
async def mcp_session(home: Path, url: str) -> AsyncIterator[ClientSession]:
    """`agentbox mcp` started by the SDK's stdio client, configured as a user's would
    be: AGENTBOX_URL, the config directory (its admin token), the webhook secret."""
    params = StdioServerParameters(command=agentbox_command(), args=["mcp"], env={
        "AGENTBOX_URL": url, "XDG_CONFIG_HOME": str(home / "config"),
        "AGENTBOX_WEBHOOK_SECRET": SECRET}, cwd=home)
    with open(home / "mcp.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer; the call must not be an error."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert isinstance(result.structured_content, dict)
    # The text a client without structured output reads: people's words, then the JSON.
    assert json.loads(text_of(result, 1)) == result.structured_content
    return result.structured_content


async def error(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return text_of(result)


def text_of(result: CallToolResult, index: int = 0) -> str:
    block = result.content[index]
    assert isinstance(block, TextContent)
    return block.text


async def finished(session: ClientSession, run_id: str, timeout: float = 60
                   ) -> dict[str, Any]:
    """show_run, asked through MCP until the run is terminal."""
    async def done() -> dict[str, Any] | None:
        report = await call(session, "show_run", run_id=run_id)
        return report if report["terminal"] else None
    found: dict[str, Any] = await wait_until_async(done, timeout, f"run {run_id} to finish",
                                                   interval=0.2)
    return found


@slow
@pytest.mark.anyio
async def test_tools_are_listed_with_their_schemas(server_factory: Callable[..., Server],
                                                   tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": AGENTS}).start()
    async with mcp_session(tmp_path, server.url) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None, tool.name
    export = tools["send_export"].input_schema
    assert export["required"] == ["mix_path"]
    assert export["properties"]["wait_seconds"]["maximum"] == 600
    runs = tools["list_runs"].input_schema
    assert runs["properties"]["limit"]["maximum"] == 500
    assert set(runs["$defs"]["RunStatus"]["enum"]) == {s.value for s in RunStatus}
    assert tools["show_run"].input_schema["required"] == ["run_id"]
    # what a client may call without asking: the reading tools, and nothing destroys
    hints = {name: tool.annotations for name, tool in tools.items()}
    assert all(h is not None and h.destructive_hint is not True for h in hints.values())
    assert {name for name, h in hints.items() if h and h.read_only_hint} == {
        "list_runs", "show_run", "list_dead_letters", "project_history"}
    assert hints["send_export"] and hints["send_export"].idempotent_hint
    assert hints["request_review"] and hints["request_review"].idempotent_hint is False
    assert {"verdict", "figures", "notes", "review", "run"} <= set(
        tools["show_run"].output_schema["properties"])


@slow
@pytest.mark.anyio
async def test_an_export_is_reviewed_and_the_project_s_history_read(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": AGENTS}).start()
    quiet = write_mix(tmp_path / "night-drive-v1.wav", -20.0)
    loud = write_mix(tmp_path / "night-drive-v2.wav", -12.0)
    async with mcp_session(tmp_path, server.url) as session:
        sent = await call(session, "send_export", mix_path=str(quiet), project="Night Drive")
        assert sent["duplicate"] is False and sent["status"] == "accepted"
        first = await finished(session, sent["run_id"])
        assert first["status"] == "succeeded", first["review"]
        assert first["verdict"] in ("pass", "warn", "fail")
        assert first["project"] == "Night Drive" and first["file"] == "night-drive-v1.wav"
        # What the musician reads: the same review the CLI prints, in the same words.
        result = server.run(sent["run_id"])["result"]
        assert first["run"]["result"] == result
        assert first["figures"]["integrated_lufs"] == result["metrics"]["integrated_lufs"]
        assert first["review"].startswith(f"night-drive-v1.wav: {first['verdict']}\n")
        assert first["headline"] in first["review"]
        assert [n["text"] for n in first["notes"]] == [
            n["text"] for n in result["notes"]] != []
        assert "First export of this project" in first["review"]

        again = await call(session, "send_export", mix_path=str(quiet), project="Night Drive")
        assert again["duplicate"] is True and again["run_id"] == sent["run_id"]

        waited = await call(session, "send_export", mix_path=str(loud),
                            project="Night Drive", wait_seconds=60)
        second = waited["review"]
        assert second is not None and second["status"] == "succeeded"
        louder = (second["figures"]["integrated_lufs"]
                  - first["figures"]["integrated_lufs"])
        assert louder == pytest.approx(8.0, abs=0.2)  # -12 dBFS against -20 dBFS
        assert "Compared with the previous export" in second["review"]

        history = await call(session, "project_history", project="Night Drive")
        assert history["project"] == "Night Drive"
        assert [e["run_id"] for e in history["exports"]] == [first["run_id"],
                                                              second["run_id"]]
        assert [e["file"] for e in history["exports"]] == ["night-drive-v1.wav",
                                                           "night-drive-v2.wav"]
        assert [e["verdict"] for e in history["exports"]] == [first["verdict"],
                                                              second["verdict"]]
        assert history["exports"][1]["figures"] == second["figures"]

        listed = (await call(session, "list_runs", limit=5))["runs"]
        assert [r["run_id"] for r in listed] == [second["run_id"], first["run_id"]]
        assert listed[0]["headline"] == second["headline"]
        assert listed[0]["line"].startswith(f"night-drive-v2.wav: {second['verdict']} · ")
        none_failed = await call(session, "list_runs", status="failed_permanent")
        assert none_failed["runs"] == []


@slow
@pytest.mark.anyio
async def test_a_dead_letter_is_listed_and_replayed_and_errors_are_told(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": AGENTS}).start()
    mix = write_mix(tmp_path / "mix.wav", -14.0, seconds=1.0)

    def request(project: str) -> dict[str, Any]:
        return build_event("mix.review_requested", "assistant", uuid.uuid4().hex, {
            "project_id": project, "mix_url": str(mix), "requested_by": "test"})

    async with mcp_session(tmp_path, server.url) as session:
        failing = (await call(session, "send_event", event=request("always-fail")))["run_id"]

        async def dead_letters() -> list[str]:
            found = await call(session, "list_dead_letters")
            return [r["run_id"] for r in found["runs"]]
        assert await wait_until_async(dead_letters, 30, "the dead letter",
                                      interval=0.2) == [failing]
        dead = await call(session, "show_run", run_id=failing)
        assert dead["status"] == "dead_lettered"
        # As `agentbox show` tells it: no review, so the run is named by its event's file.
        assert dead["review"] == ("mix.wav: dead_lettered: agent_retryable_error: "
                                  "scripted failure, every time")

        replayed = await call(session, "replay_run", run_id=failing)
        assert replayed["run_id"] == failing and replayed["status"] == "accepted"
        again = await finished(session, failing)
        assert again["run"]["replays"] == 1 and again["status"] == "dead_lettered"
        assert any(h["note"] and "replay" in h["note"] for h in again["run"]["history"])

        ok = (await call(session, "request_review", mix_path=str(mix), project="ok",
                          requested_by="test", wait_seconds=30))["review"]
        assert ok["status"] == "succeeded"
        refused = await error(session, "replay_run", run_id=ok["run_id"])
        assert "409: " in refused and "succeeded" in refused

        unknown = await error(session, "show_run", run_id="run_nope")
        assert "404: No run has the id 'run_nope'." in unknown
        invalid = await error(session, "send_event", event={**request("ok"), "extra": 1})
        assert "agentbox refused the event (422 invalid_event)" in invalid
        assert "extra: " in invalid
        relative = await error(session, "send_export", mix_path="mix.wav")
        assert "mix_path must be an absolute path" in relative
        missing = await error(session, "send_export", mix_path=str(tmp_path / "gone.wav"))
        assert "no file at" in missing
        no_project = await error(session, "project_history", project="nothing yet")
        assert "404: No export of a project named 'nothing yet' has arrived yet." \
            in no_project

        server.stop()
        down = await error(session, "list_runs")
        assert f"cannot reach agentbox at {server.url}" in down
        assert "Start it with: agentbox serve" in down
        not_sent = await error(session, "send_export", mix_path=str(mix))
        assert f"cannot reach agentbox at {server.url}" in not_sent
        # The MCP server lives on: it still answers.
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
    log = (tmp_path / "mcp.log").read_text()
    assert "Traceback" not in log and SECRET not in log
    # stderr is a log of JSON lines, the SDK's own (each tool that failed) included
    said = [json.loads(line) for line in log.splitlines()]
    assert any("Tool 'show_run' failed" in line["msg"] for line in said), said


@slow
@pytest.mark.anyio
async def test_an_agentbox_that_is_not_running_is_a_tool_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with mcp_session(tmp_path, url) as session:
        told = await error(session, "show_run", run_id="run_1")
        assert f"cannot reach agentbox at {url}" in told
        assert "Start it with: agentbox serve" in told
        assert "Traceback" not in told
        assert (await session.list_tools()).tools  # still serving


@slow
@pytest.mark.anyio
async def test_in_process_a_result_that_is_no_review_is_shown_as_the_cli_shows_it(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same tools connected in the test's own process (the SDK's in-memory
    transport), against the scripted agents, whose results are not mix reviews."""
    from mcp import Client

    from agentbox.mcp_server import Agentbox, build_server

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the server's token
    monkeypatch.setenv("AGENTBOX_WEBHOOK_SECRET", SECRET)
    mix = write_mix(tmp_path / "ok.wav", -14.0, seconds=0.5)
    async with Client(build_server(Agentbox(server.url))) as client:
        sent = await client.call_tool("send_export", {"mix_path": str(mix),
                                                      "wait_seconds": 20})
        assert not sent.is_error, sent.content
        done = sent.structured_content["review"]
        assert done["status"] == "succeeded" and done["verdict"] is None
        assert done["figures"] == {} and done["notes"] == []
        assert done["review"] == (f"{done['run_id']}: succeeded\nresult: "
                                  + json.dumps(server.run(done["run_id"])["result"]))
        history = (await client.call_tool("project_history", {"project": "ok"}))
        assert [e["run_id"] for e in history.structured_content["exports"]] == [
            done["run_id"]]
        dead = server.post(build_event("session.exported", "studio", uuid.uuid4().hex, {
            "project_id": "always-fail", "mix_url": str(mix)})).json()["run_id"]
        server.wait_terminal(dead)
        listed = await client.call_tool("list_dead_letters", {})
        assert [r["run_id"] for r in listed.structured_content["runs"]] == [dead]
        assert text_of(listed).startswith(f"{dead}  ")
        replayed = await client.call_tool("replay_run", {"run_id": dead})
        assert replayed.structured_content["status"] == "accepted"
        unknown = await client.call_tool("replay_run", {"run_id": "run_nope"})
        assert unknown.is_error and "404: No run has the id 'run_nope'." in text_of(unknown)


@pytest.mark.anyio
async def test_arguments_that_do_not_fit_are_told_as_the_cli_tells_a_bad_option() -> None:
    """Refused by the tools' own schemas before anything is sent (so no agentbox is
    needed): each argument named, with what it must be and what it got, not pydantic's
    text. The SDK's in-memory transport, in the test's process."""
    from mcp import Client

    from agentbox.mcp_server import Agentbox, build_server

    statuses = ", ".join(s.value for s in RunStatus)
    async with Client(build_server(Agentbox(f"http://127.0.0.1:{free_port()}"))) as client:
        async def told(tool: str, arguments: dict[str, Any]) -> str:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, result
            text = text_of(result)
            for raw in ("validation error", "Input should", "errors.pydantic.dev", "type="):
                assert raw not in text, text
            return text

        assert await told("list_runs", {"limit": 0}) == (
            "list_runs: limit must be a whole number from 1 to 500, not 0")
        assert await told("list_runs", {"limit": 501, "status": "done"}) == (
            f'list_runs: status must be one of {statuses}, not "done"; '
            "limit must be a whole number from 1 to 500, not 501")
        assert await told("show_run", {"run_id": ""}) == (
            'show_run: run_id must be text of 1 to 256 characters, not ""')
        assert await told("send_event", {"event": "session.exported"}) == (
            'send_event: event must be a JSON object, not "session.exported"')
        missing = await told("send_export", {"wait_seconds": 601})
        assert missing.startswith("send_export: mix_path is missing: text (not empty), "
                                  "the rendered mix on this machine: an absolute path")
        assert "; wait_seconds must be a number from 0 to 600, not 601" in missing


@pytest.mark.anyio
async def test_every_tool_has_a_title_and_an_unknown_argument_is_an_error_naming_it() -> None:
    """The SDK drops an argument its tool does not declare: `{"limt": 3}` listed 20 runs.
    Refused before anything is sent (nothing listens at the address), each unknown
    argument named; and every tool carries a title for a client's menus."""
    from mcp import Client

    from agentbox.mcp_server import Agentbox, build_server

    async with Client(build_server(Agentbox(f"http://127.0.0.1:{free_port()}"))) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        titles = [t.title for t in tools]
        assert all(titles) and len(set(titles)) == len(titles), titles
        result = await client.call_tool("list_runs", {"limt": 3, "status": "succeeded"})
        assert result.is_error, result
        assert text_of(result) == ("list_runs: limt is not an argument of list_runs "
                                   "(its arguments: status, limit, correlation_id)")
        two = await client.call_tool("show_run", {"run_id": "run_x", "histroy": 1, "b": 2})
        assert two.is_error and text_of(two).startswith(
            "show_run: b is not an argument of show_run; histroy is not an argument")


@pytest.mark.anyio
async def test_a_run_id_that_is_no_run_id_is_refused_before_anything_is_sent() -> None:
    """`replay_run("../prune?")` once made the client POST /prune?/replay with the admin
    token. Nothing listens at the address: a request would say it cannot reach it."""
    from mcp import Client

    from agentbox.mcp_server import Agentbox, build_server

    async with Client(build_server(Agentbox(f"http://127.0.0.1:{free_port()}"))) as client:
        for tool in ("replay_run", "show_run"):
            for hostile in ("../prune?", "run_1/replay", "run_1?history=1"):
                result = await client.call_tool(tool, {"run_id": hostile})
                assert result.is_error
                assert f"{hostile!r} is not a run id" in text_of(result)


def test_without_the_sdk_it_says_how_to_install_it(tmp_path: Path) -> None:
    """The SDK hidden from the import system (None in sys.modules) in a real process."""
    hide = ("import sys; sys.modules['mcp'] = None; from agentbox.cli import main; "
            "main(['mcp'], prog_name='agentbox')")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == MCP_INSTALL
    assert "pip install 'agentbox[mcp]'" in done.stderr and "Traceback" not in done.stderr
