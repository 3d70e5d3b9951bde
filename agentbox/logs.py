"""JSON log lines, one object per line: field values are escaped, so event data
(newlines, ANSI escapes, quotes) can never forge a line of its own."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOGGER_NAME = "agentbox"
_RESERVED = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1  # the second `_stamp` holds the text of
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # at INFO a busy server logs many lines a second
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        line: dict[str, Any] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(line)


_ENCODER = json.JSONEncoder(default=str, ensure_ascii=True)  # as json.dumps(default=str)


def setup_logging(level: str = "info") -> None:
    # A line holds none of a record's process and thread fields: not worth looking up
    # for each of the several lines a request logs at INFO.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # Nor the caller's file and line: setting _srcfile to None is the logging module's
    # own documented way to skip walking the stack for them.
    logging._srcfile = None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger(LOGGER_NAME)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False


def get_logger(part: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{part}")
