"""The log's lines: `logs.info` (the hot path's lines, written without a LogRecord)
writes what the logging module writes through `setup_logging`'s handler, and
hands the record to the logging module whenever anything else listens."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox import logs

NAMES = (logs.LOGGER_NAME, "uvicorn", "uvicorn.error")


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
    for name, (handlers, level, propagate, filters) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
        logger.filters[:] = filters


def lines(buffer: io.StringIO) -> list[str]:
    text = buffer.getvalue()
    assert text.endswith("\n")
    return text[:-1].split("\n")


FIELDS = {"event_id": "ev-1", "run_id": "run_1", "event_type": "session.exported",
          "source": "daw", "agent": "mix_review", "status": "processing", "attempt": 1,
          "error_code": None, "run_ids": ["run_1", "run_2"], "duration_ms": 1.5}


def test_the_direct_line_is_the_logging_modules_line(stderr: io.StringIO) -> None:
    log = logs.get_logger("runs")
    log.info("run state changed", extra=FIELDS)
    logs.info(log, "run state changed", FIELDS)
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
    handler.write("agentbox.receiver", msg, {"source": value, "event_id": "e"})
    handler.handle(logging.makeLogRecord({"name": "agentbox.receiver", "msg": msg,
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
