"""The log's lines: `logs.info` (the hot path's lines, written without a LogRecord)
writes what the logging module writes through `setup_logging`'s handler, and
hands the record to the logging module whenever anything else listens."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox import logs
from tests.conftest import ROOT

NAMES = (logs.LOGGER_NAME, "uvicorn", "uvicorn.error", "")  # ("": the root logger)


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """`setup_logging` writing into a buffer; the logging module as it was afterwards."""
    saved = {name: (logger.handlers[:], logger.level, logger.propagate, logger.filters[:])
             for name in NAMES if (logger := logging.getLogger(name))}
    for flag in ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile"):
        monkeypatch.setattr(logging, flag, getattr(logging, flag))
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    logs.setup_logging("info")
    yield buffer
    alone()  # (pytest's own, once more, before they are restored)
    for name, (handlers, level, propagate, filters) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
        logger.filters[:] = filters


def alone() -> None:
    """The handler `setup_logging` installed, without the capture handlers pytest
    attaches, for each test, to every logger that does not propagate."""
    logger = logging.getLogger(logs.LOGGER_NAME)
    logger.handlers[:] = [h for h in logger.handlers if isinstance(h, logs.JsonLines)]


def records_made(monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    """Every LogRecord made from now on."""
    made: list[logging.LogRecord] = []
    factory = logging.getLogRecordFactory()

    def counted(*args: object, **kwargs: object) -> logging.LogRecord:
        made.append(factory(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(logging, "_logRecordFactory", counted)
    return made


def lines(buffer: io.StringIO) -> list[str]:
    text = buffer.getvalue()
    assert text.endswith("\n")
    return text[:-1].split("\n")


FIELDS = {"event_id": "ev-1", "run_id": "run_1", "event_type": "session.exported",
          "source": "daw", "agent": "mix_review", "status": "processing", "attempt": 1,
          "error_code": None, "run_ids": ["run_1", "run_2"], "duration_ms": 1.5}


def test_the_direct_line_is_the_logging_modules_line(stderr: io.StringIO,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    alone()
    log = logs.get_logger("runs")
    log.info("run state changed", extra=FIELDS)
    made = records_made(monkeypatch)
    logs.info(log, "run state changed", FIELDS)
    assert made == []  # written without a record
    through_logging, direct = lines(stderr)
    # The same bytes after the timestamp: same fields, same order, same escaping.
    stamp = re.compile(r'^\{"ts": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ')
    assert stamp.match(through_logging) and stamp.match(direct)
    assert stamp.sub("", direct) == stamp.sub("", through_logging)
    assert list(json.loads(direct)) == ["ts", "level", "logger", "msg", *FIELDS]
    assert json.loads(direct)["logger"] == "agentbox.runs"


@settings(max_examples=200, deadline=None)
@given(msg=st.text(), value=st.one_of(st.text(), st.integers(), st.floats(allow_nan=False),
                                      st.none(), st.lists(st.text(), max_size=3)))
def test_hostile_values_stay_in_their_line(value: object, msg: str) -> None:
    buffer = io.StringIO()
    handler = logs.JsonLines()
    handler.setStream(buffer)
    handler.write("agentbox.http.receiver", msg, {"source": value, "event_id": "e"})
    handler.handle(logging.makeLogRecord({"name": "agentbox.http.receiver", "msg": msg,
                                          "levelname": "INFO", "source": value,
                                          "event_id": "e"}))
    direct, through_logging = lines(buffer)  # a newline in a value is escaped: two lines
    assert json.loads(direct) | {"ts": 0} == json.loads(through_logging) | {"ts": 0}
    assert json.loads(direct)["source"] == value and json.loads(direct)["msg"] == msg
    assert "\x1b" not in buffer.getvalue()  # escapes too (ensure_ascii)


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def not_attempt_2(record: logging.LogRecord) -> bool:
    return record.attempt != 2  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("where", ["beside", "on the child logger", "logger filter",
                                   "handler filter"])
def test_anything_else_listening_gets_the_record(stderr: io.StringIO, where: str) -> None:
    alone()
    log = logs.get_logger("runs")
    handler = logging.getLogger(logs.LOGGER_NAME).handlers[0]
    kept = Kept()
    if where == "beside":
        logging.getLogger(logs.LOGGER_NAME).addHandler(kept)
    elif where == "on the child logger":
        log.addHandler(kept)
    elif where == "logger filter":
        log.addFilter(not_attempt_2)
    else:
        handler.addFilter(not_attempt_2)
    try:
        logs.info(log, "run state changed", FIELDS)
        logs.info(log, "run state changed", FIELDS | {"attempt": 2})
    finally:
        log.removeHandler(kept)
        log.removeFilter(not_attempt_2)
        handler.removeFilter(not_attempt_2)
    if where.endswith("filter"):  # the filter saw the record and dropped the second line
        assert [json.loads(line)["attempt"] for line in lines(stderr)] == [1]
        return
    assert [(r.getMessage(), r.run_id, r.attempt) for r in kept.records] == [  # type: ignore[attr-defined]
        ("run state changed", "run_1", 1), ("run state changed", "run_1", 2)]
    assert [json.loads(line)["attempt"] for line in lines(stderr)] == [1, 2]


def test_nothing_below_the_level(stderr: io.StringIO) -> None:
    alone()
    logging.getLogger(logs.LOGGER_NAME).setLevel(logging.WARNING)
    logs.info(logs.get_logger("runs"), "run state changed", FIELDS)
    assert stderr.getvalue() == ""


def test_without_setup_the_logging_module_decides() -> None:
    """In-process (tests, embedding): no JsonLines handler, so a plain record."""
    kept = Kept()
    log = logging.getLogger("agentbox-test-elsewhere")
    log.addHandler(kept)
    log.setLevel(logging.INFO)
    log.propagate = False
    logs.info(log, "event accepted", {"event_id": "e"})
    assert [(r.getMessage(), r.event_id) for r in kept.records] == [  # type: ignore[attr-defined]
        ("event accepted", "e")]


class Writes(io.StringIO):
    """A stream that counts its writes (each one a system call on stderr)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_the_lines_of_one_loop_turn_go_out_in_one_write(stderr: io.StringIO) -> None:
    alone()
    handler = logging.getLogger(logs.LOGGER_NAME).handlers[0]
    stream = Writes()
    handler.setStream(stream)  # type: ignore[attr-defined]
    log = logs.get_logger("runs")

    async def turn() -> list[int]:
        for attempt in (1, 2, 3):
            logs.info(log, "run state changed", FIELDS | {"attempt": attempt})
        before = stream.writes
        await asyncio.sleep(0)  # the turn is over
        return [before, stream.writes]

    assert asyncio.run(turn()) == [0, 1]
    assert [json.loads(line)["attempt"] for line in lines(stream)] == [1, 2, 3]


def test_a_record_between_keeps_the_order(stderr: io.StringIO) -> None:
    alone()
    log = logs.get_logger("runs")

    async def turn() -> None:
        logs.info(log, "run state changed", FIELDS | {"attempt": 1})
        log.warning("through the logging module", extra={"attempt": 2})
        logs.info(log, "run state changed", FIELDS | {"attempt": 3})
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert [json.loads(line)["attempt"] for line in lines(stderr)] == [1, 2, 3]


def test_lines_still_pending_are_written_at_exit(tmp_path: Path) -> None:
    """The process ends in the turn that logged: the logging module's flush at exit
    writes what waited for the turn's end."""
    script = ("import asyncio, logging\n"
              "from agentbox import logs\n"
              "logs.setup_logging('info')\n"
              "async def main():\n"
              "    logs.info(logs.get_logger('runs'), 'last words', {'n': 1})\n"
              "    asyncio.get_running_loop().stop()  # before the turn's end\n"
              "loop = asyncio.new_event_loop()\n"
              "loop.create_task(main())\n"
              "loop.run_forever()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["msg"] for line in done.stderr.splitlines()] == ["last words"]


class Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_stream_that_fails_never_raises_to_the_caller(
        stderr: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines pending when a record comes, and the stream gone (the log's reader
    died): the logging module's way, a report on stderr, never an exception."""
    alone()
    handler = logging.getLogger(logs.LOGGER_NAME).handlers[0]
    handler.setStream(Broken())  # type: ignore[attr-defined]
    reported: list[str] = []
    monkeypatch.setattr(handler, "handleError", lambda record: reported.append(record.msg))
    log = logs.get_logger("runs")

    async def turn() -> None:
        logs.info(log, "run state changed", FIELDS)
        log.warning("ALERT: a run was dead-lettered")  # writes the pending line first
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert reported == ["ALERT: a run was dead-lettered", "ALERT: a run was dead-lettered"]


def test_a_loop_closed_before_its_turn_was_over_holds_nothing_up(stderr: io.StringIO) -> None:
    alone()
    log = logs.get_logger("runs")
    first = asyncio.new_event_loop()

    async def log_then_stop() -> None:
        logs.info(log, "run state changed", FIELDS | {"attempt": 1})
        asyncio.get_running_loop().stop()  # the turn's write never runs

    task = first.create_task(log_then_stop())
    first.run_forever()
    first.close()
    assert task.done()

    async def turn() -> None:
        logs.info(log, "run state changed", FIELDS | {"attempt": 2})
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert [json.loads(line)["attempt"] for line in lines(stderr)] == [1, 2]


@pytest.mark.parametrize("field", ["message", "name", "msg", "asctime"])
def test_a_field_the_logging_module_refuses_is_refused(stderr: io.StringIO, field: str) -> None:
    alone()
    with pytest.raises(KeyError, match=f"overwrite {field!r}|{field}"):
        logs.info(logs.get_logger("runs"), "run state changed", {field: "x"})


def test_another_formatter_gets_the_record(stderr: io.StringIO) -> None:
    alone()
    handler = logging.getLogger(logs.LOGGER_NAME).handlers[0]
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s %(run_id)s"))
    logs.info(logs.get_logger("runs"), "run state changed", FIELDS)
    assert lines(stderr) == ["INFO run state changed run_1"]


# -- text lines, for a person at a terminal --------------------------------------------------


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr in a window is."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    """`setup_logging` with log_format auto, writing into a terminal."""
    saved = {name: (logger.handlers[:], logger.level, logger.propagate)
             for name in NAMES if (logger := logging.getLogger(name))}
    buffer = Terminal()
    monkeypatch.setattr("sys.stderr", buffer)
    logs.setup_logging("info", "auto")
    logger = logging.getLogger(logs.LOGGER_NAME)
    logger.handlers[:] = [h for h in logger.handlers if isinstance(h, logs.TextLines)]
    yield buffer
    for name, (handlers, level, propagate) in saved.items():
        found = logging.getLogger(name)
        found.handlers[:], found.level, found.propagate = handlers, level, propagate


def said(buffer: io.StringIO) -> list[str]:
    """The lines without their time (HH:MM:SS)."""
    found = buffer.getvalue().splitlines()
    assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in found), found
    return [line[9:] for line in found]


def test_a_terminal_reads_what_a_person_cares_about(window: Terminal) -> None:
    log = logs.get_logger("app")
    log.info("agentbox is ready", extra={"url": "http://127.0.0.1:8000",
                                         "database": "/data/agentbox.sqlite3"})
    logs.info(log, "event accepted", {"event_id": "e1", "run_ids": ["run_1"]})
    logs.info(log, "run state changed", {"run_id": "run_1", "status": "processing"})
    logs.get_logger("reviews").info("review finished", extra={
        "run_id": "run_1", "verdict": "pass",
        "told": "night-drive.wav: pass · -14.2 LUFS · true peak -1.1 dBTP"})
    logs.get_logger("watch").info("b.wav: accepted run_2", extra={"folder": "/x"})
    log.warning("the store cannot take writes; events are refused (503)",
                extra={"reason": "disk full", "database": "/d\nforged"})
    log.info("agentbox stopped")
    assert said(window) == [
        "agentbox is ready at http://127.0.0.1:8000 (data in /data/agentbox.sqlite3)",
        "night-drive.wav: pass · -14.2 LUFS · true peak -1.1 dBTP",
        "b.wav: accepted run_2",
        "the store cannot take writes; events are refused (503) (reason disk full, "
        "database /d\\nforged)",
        "agentbox stopped"]


def test_a_bug_is_said_with_its_traceback(window: Terminal) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logs.get_logger("dispatcher").exception("claiming runs failed")
    text = window.getvalue()
    assert re.match(r"\d\d:\d\d:\d\d claiming runs failed\nTraceback", text)
    assert "ValueError: boom" in text


@pytest.mark.parametrize(("log_format", "tty", "text"), [
    ("auto", True, True), ("auto", False, False), ("text", False, True),
    ("json", True, False)])
def test_the_format_is_chosen_by_the_setting_and_the_stream(log_format: str, tty: bool,
                                                            text: bool) -> None:
    stream = Terminal() if tty else io.StringIO()
    assert logs.text_lines(log_format, stream) is text


@pytest.mark.anyio
async def test_the_review_finished_line_names_the_file(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its `file` was always null: the store's view of a run names no file."""
    from tests.conftest import in_process, make_event, wait_until_async
    from tests.test_archive import render

    render(tmp_path / "night-drive.wav", 1)
    caplog.set_level(logging.INFO, logger="agentbox.reviews")
    async with in_process(tmp_path, AGENTBOX_AGENTS="") as box:
        answer = await box.post(make_event(payload={
            "project_id": "Night Drive", "mix_url": str(tmp_path / "night-drive.wav")}))
        await box.wait_status(answer.json()["run_id"], "succeeded", timeout=60)

        async def finished() -> logging.LogRecord | None:
            return next((r for r in caplog.records if r.getMessage() == "review finished"),
                        None)
        line = await wait_until_async(finished, 30, "the review finished line")
    assert line.file == "night-drive.wav", vars(line)
    assert line.told.startswith("night-drive.wav: ")


def test_a_librarys_lines_are_json_lines_too(stderr: io.StringIO) -> None:
    """psycopg_pool says it cannot reach the database on its own logger, which reaches
    only the root logger: a JSON line as every other, not the last resort's text."""
    logging.getLogger("psycopg.pool").warning("error connecting in 'pool-1': refused")
    line = json.loads(stderr.getvalue().splitlines()[-1])
    assert (line["level"], line["logger"], line["msg"]) == (
        "warning", "psycopg.pool", "error connecting in 'pool-1': refused")


# -- every line of a real server's output is JSON ---------------------------------------


@pytest.mark.slow
def test_every_line_a_server_writes_is_json_through_a_refusal_warnings_and_prints(
        server_factory: Any, tmp_path: Path) -> None:
    """AGENTBOX_LOG_FORMAT=json: a refused start (with its exit status), an agent's
    print() in pieces and from a thread (each with its run's run_id), its
    warnings.warn, a library's logger and a stray stderr write, and the accepted
    event's line (with run_id) are each one JSON object per line, stdout and stderr
    alike (the test's server writes both into one file)."""
    from tests.conftest import make_event

    server = server_factory({"AGENTBOX_LOG_FORMAT": "json",
                             "AGENTBOX_AGENTS": "session.exported=tests.support.agents:chatty"})
    server.start()
    run_id = server.post(make_event()).json()["run_id"]
    assert server.wait_terminal(run_id)["status"] == "succeeded"
    # A second agentbox on the same port: refused, in a JSON line with its status.
    second = subprocess.run([sys.executable, "-m", "agentbox", "serve", "--port",
                             str(server.port)], env=server.env, cwd=server.home,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and second.stdout == ""
    refusal = [json.loads(line) for line in second.stderr.splitlines()]
    assert refusal[-1]["level"] == "error" and refusal[-1]["exit_status"] == 1
    assert f"port {server.port} is in use" in refusal[-1]["msg"]
    bad = subprocess.run([sys.executable, "-m", "agentbox", "serve"],
                         env={**server.env, "AGENTBOX_PORT": "-4"}, cwd=server.home,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert [json.loads(line)["exit_status"] for line in bad.stderr.splitlines()] == [2]
    server.stop()

    lines = [json.loads(line) for line in server.log_path.read_text().splitlines()]
    said = {line["msg"]: line for line in lines}
    assert said["event accepted"]["run_id"] == run_id
    assert said["event accepted"]["run_ids"] == [run_id]
    printed = said[f"printed by {run_id} (the rest of the line)"]
    assert printed["run_id"] == run_id and printed["logger"] == "agentbox.stdout"
    assert said[f"printed in a thread for {run_id}"]["run_id"] == run_id
    stray = said[f"written to stderr by {run_id}"]
    assert stray["run_id"] == run_id and stray["level"] == "warning"
    warned = [line for line in lines if line["logger"] == "py.warnings"]
    assert len(warned) == 1 and f"UserWarning: a warning of {run_id}" in warned[0]["msg"]
    assert warned[0]["run_id"] == run_id
    assert said[f"a library says {run_id}"]["logger"] == "somelibrary.client"
    assert said[f"a library says {run_id}"]["run_id"] == run_id
