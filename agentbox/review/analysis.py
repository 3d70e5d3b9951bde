"""Measuring a mix file: where it is, whether it has been written whole, and the
analysis processes that measure it (agentbox.review.meter runs in them), so that
the event loop and the receiver stay responsive while a long mix is analysed and
the server process itself never imports numpy or scipy.

`Analysis` is the pool of those processes, an object its owner creates and shuts
down: the app makes one at start and lends it to the agents (AgentContext.service),
a script or a test makes its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agentbox import portable
from agentbox.engine.agents import (
    AgentContext,
    AttemptGivenBack,
    PermanentAgentError,
    RetryableAgentError,
)
from agentbox.review.model import FileInfo
from agentbox.review.settings import DEFAULT_ANALYSIS_PROCESSES, parse_processes

if TYPE_CHECKING:
    from agentbox.archive.blobs import Keep

SETTLE_SECONDS = 2.0  # a file modified more recently may still be being written
SETTLE_MARGIN_SECONDS = 0.05
# A file cut short and modified more recently than this may still be being written
# (a stalled renderer): the attempt waits for the rest, and measures it again when
# it comes; left unchanged this long, it is a broken render (failed for good).
TRUNCATED_RETRY_SECONDS = 60.0
TRUNCATED_POLL_SECONDS = 0.5  # how often a waiting attempt looks at the file
# Left of the run's own time limit when an attempt stops waiting for the rest of a
# cut-short render and hands it to a retry: enough to measure it once more.
TRUNCATED_RESERVE_SECONDS = 30.0

# At most AGENTBOX_ANALYSIS_PROCESSES analyses at once (default 1: beside a DAW, one
# core is the most a review should take), each in its own process ("spawn": no
# copy of the event loop's threads) at low priority, ignoring the terminal's
# Ctrl-C, with the numerical libraries single-threaded. A process stays warm
# between reviews (numpy and scipy loaded: importing them costs more than
# measuring a song) and exits by itself after WARM_SECONDS idle; waiting, it is
# blocked on its pipe and costs nothing. A run that times out or is cancelled
# kills its process, so no orphaned analysis keeps a CPU busy or a slot taken;
# one that dies is replaced at the next review.
WARM_SECONDS = 600.0  # an idle analysis process exits after this
REUSE_MARGIN_SECONDS = 30.0  # one about to exit is not handed a review
SINGLE_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                           "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
BUSY_NAME, IDLE_NAME = "agentbox-analysis", "agentbox-analysis-idle"


def analysis_processes() -> int:
    """AGENTBOX_ANALYSIS_PROCESSES, else DEFAULT_ANALYSIS_PROCESSES (1), for a caller
    without the settings (the server's review reads its setting, `analysis_processes`
    of ReviewSettings, which the file may give too)."""
    return parse_processes(os.environ.get("AGENTBOX_ANALYSIS_PROCESSES", ""),
                           "AGENTBOX_ANALYSIS_PROCESSES")


# -- the pool ----------------------------------------------------------------------------------


class Analysis:
    """The analysis processes: at most `processes` measuring at once, idle ones
    kept warm. Its owner calls `shutdown` when done (the app, when it stops)."""

    def __init__(self, processes: int = DEFAULT_ANALYSIS_PROCESSES) -> None:
        self.processes = processes
        self._slots: asyncio.Semaphore | None = None
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        # Threads that wait for a starting process's "ready" (never the event loop).
        self._starters = concurrent.futures.ThreadPoolExecutor(
            thread_name_prefix="agentbox-analysis-start")

    @classmethod
    def configured(cls) -> Analysis:
        """One sized by AGENTBOX_ANALYSIS_PROCESSES (ConfigError when it is wrong)."""
        return cls(analysis_processes())

    def warm(self) -> None:
        """Start a process now, so that the first review finds it warm."""
        if not self._idle and not self._busy:
            self._idle.append(_Worker(self._starters))

    async def measure(self, path: Path, url: str, ctx: AgentContext | None,
                      keep_in: Keep | None = None) -> tuple[dict[str, Any], FileInfo]:
        """The measurements of the file at `path`, or the agent error that says why not.
        The file's identity (the SHA-256 of the bytes measured, size, modification
        time) is in its FileInfo. With `keep_in` (the archive's incoming folder, and
        what fits there) the file is copied there as it is read, and the copy is what
        is measured: it then waits there under its hash (agentbox.archive.blobs).

        A render cut short that was modified less than TRUNCATED_RETRY_SECONDS ago
        may be a renderer that stalled: the attempt waits for the rest and measures
        again, costing no retry, until the file has stayed as it is that long
        (failed for good). Waiting, it holds no analysis slot."""
        while True:
            await _settle(path)
            _check_settled(path)
            before = _stat(path)
            outcome = await self.run((str(path), keep_in),
                                     None if ctx is None else ctx.cancelled)
            if outcome[0] != "error" or outcome[1] != "mix_truncated":
                break
            message = f"{url}: {outcome[2]}"
            if ctx is not None and _recently_changed(path, TRUNCATED_RETRY_SECONDS):
                ctx.log.info("the render was cut short; waiting for the rest of it")
            if not await _written_on(path, before, ctx, message):
                raise PermanentAgentError(message, "mix_truncated")
        if outcome[0] == "error":
            _, code, message = outcome
            if code == "mix_changed" or (code == "mix_unreadable" and _recently_changed(path)):
                raise RetryableAgentError(f"{url} is still being written", "mix_incomplete")
            raise PermanentAgentError(message, code)
        if _stat(path) != before:  # rewritten while we listened
            raise RetryableAgentError(f"{url} changed during the analysis", "mix_incomplete")
        raw: dict[str, Any] = outcome[1]
        return raw, _file_info(path, raw, outcome[2])

    async def run(self, path: str | tuple[str, Keep | None],
                  cancelled: asyncio.Event | None = None) -> tuple[Any, ...]:
        """One analysis in a process (of a path, or of a path and the folder to copy it
        into): ("ok", measurements, identity) or ("error", code, message)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.processes)
        slots = self._slots
        loop = asyncio.get_running_loop()
        await _take_slot(slots, cancelled)
        try:
            worker = await self._warm_worker(loop)
            worker.process.name = BUSY_NAME
            self._busy.add(worker)
            answered = False
            try:
                worker.conn.send(path)
                result: tuple[Any, ...] = await loop.run_in_executor(None, worker.conn.recv)
                answered = True
                return result
            except (EOFError, OSError):  # the process died without an answer
                raise RetryableAgentError("the analysis process died",
                                          "analysis_crashed") from None
            finally:
                self._busy.discard(worker)
                if answered and worker.process.is_alive():
                    self._rest(worker)
                else:  # cancelled or timed out (stop listening), or dead
                    await loop.run_in_executor(None, worker.stop)
        finally:
            slots.release()

    def shutdown(self) -> None:
        """Stop every analysis process, busy or idle."""
        workers = [*self._busy, *self._idle]
        self._idle.clear()
        for worker in workers:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in workers:
            worker.process.join(5)
        self._starters.shutdown(wait=False, cancel_futures=True)

    async def _warm_worker(self, loop: asyncio.AbstractEventLoop) -> _Worker:
        """An idle process that has loaded its libraries, started if there is none. A
        run cancelled while it starts leaves it starting, for the next run."""
        worker = None
        while self._idle and worker is None:
            candidate = self._idle.pop()
            if candidate.fresh():
                worker = candidate
            else:
                await loop.run_in_executor(None, candidate.stop)
        worker = worker or _Worker(self._starters)
        starting = asyncio.wrap_future(worker.ready, loop=loop)
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Its outcome is the next run's; taken here all the same, so that a process
            # stopped meanwhile (the server stopping) is not an error nobody read.
            starting.add_done_callback(_outcome_read)
            self._rest(worker)
            raise
        except (EOFError, OSError):
            await loop.run_in_executor(None, worker.stop)
            raise RetryableAgentError("the analysis process died while starting",
                                      "analysis_crashed") from None
        return worker

    def _rest(self, worker: _Worker) -> None:
        worker.process.name = IDLE_NAME
        worker.idle_since = time.monotonic()
        self._idle.append(worker)


def _outcome_read(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _Worker:
    """One analysis process and the parent's end of its pipe. `ready` resolves when
    its imports are done (a thread waits for it, so that a run cancelled meanwhile
    leaves a process that is only starting to the next run)."""

    def __init__(self, starters: concurrent.futures.ThreadPoolExecutor) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe(duplex=True)
        self.process = context.Process(target=serve_analyses, args=(child_end,),
                                       daemon=True, name=IDLE_NAME)
        self.process.start()
        child_end.close()
        self.idle_since = time.monotonic()
        self.ready: concurrent.futures.Future[Any] = starters.submit(self.conn.recv)

    def fresh(self) -> bool:
        return self.process.is_alive() and (
            time.monotonic() - self.idle_since < WARM_SECONDS - REUSE_MARGIN_SECONDS)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(10)
        self.conn.close()


async def _take_slot(slots: asyncio.Semaphore, cancelled: asyncio.Event | None) -> None:
    """A slot, or AttemptGivenBack when the server stops first: a run that only
    waited has not started, and costs no retry."""
    if cancelled is None:
        await slots.acquire()
        return
    acquire = asyncio.ensure_future(slots.acquire())
    stopping = asyncio.ensure_future(cancelled.wait())
    try:
        await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not acquire.done():
            acquire.cancel()
    if acquire.cancelled() or not acquire.done():
        raise AttemptGivenBack("the server is stopping; the review had not started")
    if cancelled.is_set():
        slots.release()
        raise AttemptGivenBack("the server is stopping; the review had not started")


# -- in the analysis process -------------------------------------------------------------------


def serve_analyses(conn: Any) -> None:
    """The analysis process: low priority, deaf to Ctrl-C, single-threaded and
    reusing the memory it frees before numpy loads; then one review per path sent,
    until the parent goes away or nothing comes for WARM_SECONDS."""
    from agentbox.portable import ignore_interrupts, lower_priority, reuse_freed_memory

    ignore_interrupts()
    lower_priority()
    reuse_freed_memory()
    for name in SINGLE_THREAD_VARIABLES:
        os.environ[name] = "1"
    import agentbox.review.meter  # noqa: F401 - loaded now, while no review waits
    try:
        conn.send(("ready",))
        while conn.poll(WARM_SECONDS):
            conn.send(analyse(conn.recv()))
    except (EOFError, OSError):
        pass  # the server went away
    finally:
        conn.close()


def analyse(request: str | tuple[str, Keep | None]) -> tuple[Any, ...]:
    """Runs in an analysis process: ("ok", metrics, identity) or ("error", code,
    message). The file is read once to hash it (and, given a folder to keep it in,
    to copy it there: then the copy is measured)."""
    from agentbox.archive import blobs
    from agentbox.review.meter import AudioError, measure

    path, keep_in = (request, None) if isinstance(request, str) else request
    try:
        if keep_in is None:
            identity, copy = blobs.fingerprint(Path(path)), None
        else:
            identity, copy = blobs.copy_in(Path(path), keep_in)
    except FileNotFoundError:
        return ("error", "mix_not_found", f"no file at {path}")
    except blobs.SourceChanged as exc:
        return ("error", "mix_changed", str(exc))
    except OSError as exc:
        return ("error", "mix_unreadable", f"the file cannot be read: {exc.strerror or exc}")
    try:
        measured = measure(str(copy or path)).as_dict()
    except AudioError as exc:
        if copy is None:
            return ("error", exc.code, exc.message)
        copy.unlink(missing_ok=True)  # the user knows their file, not the archive's copy
        return ("error", exc.code, exc.message.replace(str(copy), path))
    if copy is not None:
        blobs.ready(copy, identity.sha256)
    return ("ok", measured, dataclasses.asdict(identity))


# -- the file ----------------------------------------------------------------------------------


def local_path(mix_url: str) -> Path:
    """A local path or file:// URL as a path; anything else is refused."""
    parts = urlsplit(mix_url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise PermanentAgentError("file:// URLs must name a local file "
                                      "(file:///path)", "unsupported_mix_url")
        try:
            return Path(portable.path_from_url(parts.path))
        except OSError:  # Windows: a path no drive or share can name
            raise PermanentAgentError(f"{mix_url} names no local file",
                                      "unsupported_mix_url") from None
    if parts.scheme and len(parts.scheme) > 1:  # one letter is a Windows drive
        raise PermanentAgentError(f"mix_url must be a local path or file:// URL, not "
                                  f"{parts.scheme}:", "unsupported_mix_url")
    return Path(mix_url).expanduser()


def _file_info(path: Path, raw: dict[str, Any], identity: dict[str, Any]) -> FileInfo:
    return FileInfo(name=path.name, format=raw["file_format"], sample_rate=raw["sample_rate"],
                    bit_depth=raw["bit_depth"], channels=raw["channels"],
                    duration_seconds=raw["duration_seconds"],
                    frames_declared=raw.get("frames_declared"),
                    frames_read=raw.get("frames_read", 0), size_bytes=identity["size"],
                    sha256=identity["sha256"], modified_ns=identity["modified_ns"])


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_size, found.st_mtime_ns


def _recently_changed(path: Path, seconds: float = SETTLE_SECONDS) -> bool:
    found = _stat(path)
    return found is not None and time.time() - found[1] / 1e9 < seconds


async def _written_on(path: Path, measured: tuple[int, int] | None,
                      ctx: AgentContext | None, message: str) -> bool:
    """Wait for a file measured cut short (as `measured`: size, mtime) to be written
    on: True once it was and has settled again (or is gone), False once it has been
    left as it is for TRUNCATED_RETRY_SECONDS. A server stopping gives the attempt
    back; a run whose time runs short hands the wait to its retry."""
    cancelled = None if ctx is None else ctx.cancelled
    while True:
        found = _stat(path)
        if found is None:
            return True  # measured again: it says the file is gone
        age = time.time() - found[1] / 1e9
        if found != measured and age >= SETTLE_SECONDS:
            return True
        if found == measured and age >= TRUNCATED_RETRY_SECONDS:
            return False
        left = None if ctx is None else ctx.time_left()
        if left is not None and left < TRUNCATED_RESERVE_SECONDS:
            raise RetryableAgentError(message, "mix_truncated")
        if cancelled is None:
            await asyncio.sleep(TRUNCATED_POLL_SECONDS)
            continue
        try:
            await asyncio.wait_for(cancelled.wait(), TRUNCATED_POLL_SECONDS)
        except TimeoutError:
            continue
        raise AttemptGivenBack("the server is stopping; the review waited for the rest "
                               "of a render cut short")



async def _settle(path: Path) -> None:
    """A file written a moment ago (an export script sends as soon as the render ends)
    is given the rest of its settle time in this attempt, rather than costing one."""
    found = _stat(path)
    if found is not None:
        age = time.time() - found[1] / 1e9
        if 0 <= age < SETTLE_SECONDS:
            # A little past it: the loop's timer may fire a hair before the wall clock
            # reaches the settle time, and the check after this must find it passed.
            await asyncio.sleep(SETTLE_SECONDS - age + SETTLE_MARGIN_SECONDS)


def _check_settled(path: Path) -> None:
    if not path.exists():
        raise PermanentAgentError(f"no file at {path}", "mix_not_found")
    if not path.is_file() or not os.access(path, os.R_OK):
        raise PermanentAgentError(f"{path} is not a readable file", "mix_unreadable")
    if _recently_changed(path):
        raise RetryableAgentError(f"{path} was modified less than {SETTLE_SECONDS:g} s ago; "
                                  "it may still be being written", "mix_incomplete")
