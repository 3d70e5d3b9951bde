"""The server's log: JSON lines, one object per line, for machines (field values
are escaped, so event data (newlines, ANSI escapes, quotes) can never forge a
line of its own); or, for a person at a terminal, text lines: one readable line
per thing a person cares about (started, where, each review with its verdict,
problems), the same escaping. `log_format` chooses: auto (text on a terminal,
else JSON), text or json."""

from __future__ import annotations

import contextvars
import io
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from agentbox.jsontext import encoder

if TYPE_CHECKING:
    import asyncio

LOGGER_NAME = "agentbox"
# The run whose agent the current task (or a thread it started) works for: a line it
# prints carries it (`capture_output`). Set by the dispatcher in each run's task.
CURRENT_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentbox_run", default=None)
_RESERVED = set(vars(logging.makeLogRecord({})))
_REFUSED = frozenset(_RESERVED | {"message", "asctime"})  # as fields (`extra`)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # A second and its text, replaced as one (lines are formatted on any thread).
        self._stamped = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        line = self.head(record.created, record.levelname.lower(), record.name,
                         record.getMessage())
        line.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if "run_id" not in line and (run_id := CURRENT_RUN.get()) is not None:
            line["run_id"] = run_id  # a warning or a library's line, in an agent's run
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _ENCODE(line)

    def head(self, created: float, level: str, logger: str, msg: str) -> dict[str, Any]:
        """A line's first fields; its own follow them."""
        second = int(created)
        stamped_second, stamp = self._stamped
        if second != stamped_second:  # at INFO a busy server logs many lines a second
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._stamped = (second, stamp)
        # The milliseconds as a LogRecord's `msecs`.
        msecs = int((created - second) * 1000)
        return {"ts": f"{stamp}.{msecs:03d}Z", "level": level, "logger": logger, "msg": msg}


_ENCODE = encoder(default=str, ensure_ascii=True)  # as json.dumps(default=str)


class JsonLines(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `setup_logging` installs: a JSON line per record, and `write`
    for the lines that `info` writes without a record.

    The lines `write` is given on the event loop's thread go out together once
    the loop's turn is over: one system call for all of them, where each line
    was one (stderr writes every line as it comes), several per request under
    load. A record handled meanwhile (any thread) writes them first, so the
    order stays; `flush` (at exit too, by the logging module) writes them; a
    process killed outright loses the lines of that one turn.
    """

    formatter: JsonFormatter

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(JsonFormatter())
        self._pending: list[str] = []  # written once the loop's turn is over
        self._turn_loop: asyncio.AbstractEventLoop | None = None  # ... that loop's

    def write(self, logger: str, msg: str, fields: Mapping[str, Any]) -> None:
        """The line `logger.info(msg, extra=fields)` would write through this handler."""
        try:
            line = self.formatter.head(time.time(), "info", logger, msg)
            line.update(fields)
            text = _ENCODE(line) + self.terminator
            # No loop running in this thread (or no asyncio at all): at once. (Not an
            # import: a client that logs nothing starts without asyncio.)
            asyncio = sys.modules.get("asyncio")
            loop = None if asyncio is None else asyncio._get_running_loop()
            with self.lock:  # type: ignore[union-attr]
                # (A loop closed before its turn was over never writes: the next
                # loop's turn does.)
                if loop is not None and (not self._pending or loop is not self._turn_loop):
                    loop.call_soon(self._turn_over)
                    self._turn_loop = loop
                self._pending.append(text)
                if loop is None:  # at once, after what waits
                    self._write_pending()
        except Exception:  # as a handler does: say so on stderr, never raise to the caller
            self.handleError(logging.makeLogRecord({"name": logger, "msg": msg}))

    def emit(self, record: logging.LogRecord) -> None:
        with self.lock:  # type: ignore[union-attr]  # (an RLock: emit's own takes it again)
            try:
                self._write_pending()
            except Exception:  # as emit does: say so on stderr, never raise to the caller
                self.handleError(record)
            super().emit(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_pending()
            super().flush()

    def _turn_over(self) -> None:
        try:
            self.flush()
        except Exception:  # as a handler does: say so on stderr, never raise in the loop
            self.handleError(logging.makeLogRecord({"name": LOGGER_NAME,
                                                    "msg": "writing log lines failed"}))

    def _at_fork_reinit(self) -> None:
        super()._at_fork_reinit()  # type: ignore[misc]  # (logging's, not in its stubs)
        self._pending = []  # the parent writes them

    def _write_pending(self) -> None:
        if self._pending:
            text, self._pending = "".join(self._pending), []
            self.stream.write(text)
            self.stream.flush()


def info(logger: logging.Logger, msg: str, fields: Mapping[str, Any]) -> None:
    """`logger.info(msg, extra=fields)`, for the lines a request logs at INFO.

    When `setup_logging`'s handler is the only one listening (no other handler, no
    filter anywhere on the way), it writes the line itself: the same bytes,
    without the LogRecord and the handling the logging module does for every
    handler's sake, most of a line's cost. Anything else (a test's capture, an
    added handler or filter, a field the logging module refuses) gets the record
    as usual.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _sole_handler(logger)
    # A field named as a record's attribute: the logging module refuses it (KeyError).
    if handler is None or not _REFUSED.isdisjoint(fields):
        logger.info(msg, extra=dict(fields))
    else:
        handler.write(logger.name, msg, fields)


def _sole_handler(logger: logging.Logger) -> JsonLines | None:
    """The `JsonLines` handler that alone would handle an INFO record of `logger`."""
    found: JsonLines | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters or current.disabled:
            return None
        for handler in current.handlers:
            if (found is not None or type(handler) is not JsonLines or handler.filters
                    or handler.level > logging.INFO
                    or type(handler.formatter) is not JsonFormatter):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


# -- text lines, for a person ------------------------------------------------------------

# The INFO lines a person at the terminal reads, by message: how each is said.
# Everything else at INFO (each state change, each event, each callback) is the
# JSON log's; a WARNING or worse is always said.
SAID: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "agentbox is ready": lambda f: "agentbox is ready at {url} (data in {database}){open}".format(
        url=f.get("url", "?"), database=f.get("database", "?"),
        open=f"; open the page, logged in, at {f['open']}" if f.get("open") else ""),
    "agentbox stopped": lambda f: "agentbox stopped",
    "review finished": lambda f: str(f.get("told", "")),
    "watching a folder for renders": lambda f: f"watching {f.get('folder')} for renders",
    "recovering runs left processing by a previous process":
        lambda f: "taking up again the runs a previous start left unfinished",
    "the render was cut short; waiting for the rest of it":
        lambda f: "a render was cut short: waiting for the rest of it",
}
SAID_LOGGERS = ("agentbox.watch",)  # whose every INFO line is for people (watched folders)
# Fields worth a problem line's parentheses, in this order.
PROBLEM_FIELDS = ("folder", "run_id", "error_code", "error", "reason", "database",
                  "destination", "alert")


def one_line(value: Any) -> str:
    """Text as one line of output (a log line's, a terminal's: from a run, a file's
    name, an agent's message): control characters written as escapes, so that a
    newline in it cannot forge a line of its own."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


class TextLines(logging.StreamHandler):  # type: ignore[type-arg]
    """A line a person reads for what SAID names and every problem; nothing else."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(sys.stderr if stream is None else stream)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            said = self.said(record)
            if said is not None:
                stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
                self.stream.write(f"{stamp} {said}{self.terminator}")
                self.flush()
        except Exception:  # as emit does: say so on stderr, never raise to the caller
            self.handleError(record)

    def said(self, record: logging.LogRecord) -> str | None:
        fields = {k: v for k, v in vars(record).items() if k not in _RESERVED}
        message = record.getMessage()
        if record.levelno < logging.WARNING:
            if message in SAID:
                return one_line(SAID[message](fields))
            return one_line(message) if record.name in SAID_LOGGERS else None
        told = [f"{k} {one_line(fields[k])}" for k in PROBLEM_FIELDS if fields.get(k)]
        line = one_line(message) + (f" ({', '.join(told)})" if told else "")
        if record.exc_info:  # a bug: its traceback, to report it
            line += "\n" + _TRACEBACKS.formatException(record.exc_info)
        return line


_TRACEBACKS = logging.Formatter()


def setup_logging(level: str = "info", log_format: str = "json") -> None:
    """agentbox's lines, uvicorn's, asyncio's and any library's, through one handler:
    JSON lines, or text lines for a person (`log_format`)."""
    # A line holds none of a record's process and thread fields: not worth looking up
    # for each of the several lines a request logs at INFO.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # Nor the caller's file and line: setting _srcfile to None is the logging module's
    # own documented way to skip walking the stack for them.
    logging._srcfile = None
    handler: logging.Handler = TextLines() if text_lines(log_format) else JsonLines()
    root = logging.getLogger(LOGGER_NAME)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # asyncio's own (an exception no task retrieved, a slow callback): JSON lines too,
    # in order with the rest, not plain text from the logging module's last resort.
    for name in ("uvicorn", "uvicorn.error", "asyncio"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    # Every other library's lines (psycopg_pool's reconnections, at WARNING, the root
    # logger's level) reach the root logger: the same handler there, in place of one
    # an earlier call put (pytest's capture handlers, on the root too, stay).
    top = logging.getLogger()
    for found in [h for h in top.handlers if isinstance(h, JsonLines | TextLines)]:
        top.removeHandler(found)
    top.addHandler(handler)
    # A warnings.warn (an agent's, a library's): a record of py.warnings, so a line as
    # every other, where the warnings module wrote two raw lines to stderr.
    logging.captureWarnings(True)


def refusal_line(sentence: str, status: int, log_format: str) -> str:
    """Why agentbox does not start, as its log writes it: `agentbox: ...` for a person,
    else a JSON line (an error, with the exit status), so `jq` reads the stream to
    its end."""
    if text_lines(log_format):
        return f"agentbox: {sentence}"
    head = JsonFormatter().head(time.time(), "error", f"{LOGGER_NAME}.server", sentence)
    return _ENCODE({**head, "exit_status": status})


class OutputLines(io.TextIOBase):
    """sys.stdout or sys.stderr while the server writes JSON lines (`capture_output`):
    what is written to it (an agent's print, a library's stray write) becomes a line
    of the log, one a line of text, with the run it was written for (`run_id`, from
    CURRENT_RUN). Text without its newline waits for the rest of its line, per run."""

    def __init__(self, name: str, level: int, raw: TextIO) -> None:
        super().__init__()
        self.name, self.level, self.raw = name, level, raw
        self._logger = get_logger(name)
        self._partial: dict[str | None, str] = {}
        self._lock = threading.Lock()
        self._inside = threading.local()  # a line the log writes here: raw, not again

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", None) or "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.raw.fileno()

    def write(self, text: str) -> int:
        if getattr(self._inside, "on", False):  # the handler's own trouble: as it is
            return self.raw.write(text)
        run_id = CURRENT_RUN.get()
        with self._lock:
            lines = (self._partial.pop(run_id, "") + text).split("\n")
            if lines[-1]:
                self._partial[run_id] = lines[-1]
        for line in lines[:-1]:
            self._say(line, run_id)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            partial, self._partial = self._partial, {}
        for run_id, line in partial.items():
            self._say(line, run_id)

    def _say(self, line: str, run_id: str | None) -> None:
        self._inside.on = True
        try:
            self._logger.log(self.level, line.rstrip("\r"),
                             extra={} if run_id is None else {"run_id": run_id})
        finally:
            self._inside.on = False


def unwrapped(stream: TextIO) -> TextIO:
    """The stream itself, where `capture_output` wrapped it: for a line that is a
    JSON line already."""
    return stream.raw if isinstance(stream, OutputLines) else stream


def capture_output(log_format: str) -> None:
    """With JSON lines, what is written to stdout and stderr outside the log (an
    agent's print, a stray write) goes through the log as lines of its own
    (`OutputLines`): every line of the server's output is JSON. For a person
    (text lines) they stay as they are."""
    if text_lines(log_format):
        return
    if not isinstance(sys.stdout, OutputLines):
        sys.stdout = OutputLines("stdout", logging.INFO, sys.stdout)
    if not isinstance(sys.stderr, OutputLines):
        sys.stderr = OutputLines("stderr", logging.WARNING, sys.stderr)


def text_lines(log_format: str, stream: Any = None) -> bool:
    """Whether `log_format` means text lines: text, or auto on a terminal."""
    stream = sys.stderr if stream is None else stream
    return log_format == "text" or (log_format == "auto" and _isatty(stream))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or closed
        return False


def get_logger(part: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{part}")
