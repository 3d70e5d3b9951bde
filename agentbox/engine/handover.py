"""The hand-over of a new event's runs from the receiver to the dispatcher.

When the dispatcher has slots free and knows of nothing older waiting, a new
event's runs are stored already claimed, under a lease it hands out
(`Dispatcher.lease_for`), and start as the 202 goes out (`Dispatcher.started`).
The contract between the two: every lease asked for is settled by exactly one
`started`, whatever becomes of the write — committed, refused, failed, or its
request cancelled while the write goes on (a dropped connection, the server's
shutdown: a write already queued still commits, and its runs must start then,
not wait leased until the lease runs out). `Handover.store` is that contract,
kept in one place; nothing else calls `lease_for` or `started`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agentbox.engine.dispatcher import Dispatcher
from agentbox.events import Event
from agentbox.logs import get_logger
from agentbox.store import IngestResult, Lease

log = get_logger("receiver")  # its lines are the receiver's, as when it kept the contract

Write = Callable[[Lease | None], Awaitable[IngestResult]]  # the ingest, under the lease
Stored = Callable[[Event, IngestResult], None]  # told of each committed write, first


class Handover:
    """Stores new events' runs through the dispatcher's lease and hands them over,
    each exactly once."""

    def __init__(self, dispatcher: Dispatcher, stored: Stored | None = None) -> None:
        self.dispatcher = dispatcher
        self.stored = stored
        self._writing: set[asyncio.Future[IngestResult]] = set()  # not yet settled

    @property
    def writing(self) -> int:
        """Writes begun and not yet settled (their requests may be gone)."""
        return len(self._writing)

    async def store(self, event: Event, runs: int, write: Write) -> IngestResult:
        """Write `event`'s `runs` runs by `write` (under a lease when they can start
        here at once) and hand what it stored to the dispatcher. The write goes on
        if this call is cancelled; the hand-over then happens when it ends."""
        lease = self.dispatcher.lease_for(runs)
        ingest = asyncio.ensure_future(write(lease))
        self._writing.add(ingest)
        try:
            result = await asyncio.shield(ingest)
        except asyncio.CancelledError:
            if not ingest.done():
                ingest.add_done_callback(lambda done: self._settle(event, lease, runs, done))
            else:  # this call was cancelled as the write ended
                self._settle(event, lease, runs, ingest)
            raise
        except BaseException:
            self._settle(event, lease, runs, ingest)
            raise
        # Here, not in a callback: the agents start once the caller has sent its answer.
        self._settle(event, lease, runs, ingest)
        return result

    async def settle(self, timeout: float) -> None:
        """Wait for writes still going on (their requests cancelled by the server's
        shutdown): at shutdown, before the dispatcher stops, so that the runs they
        commit start or are given back, not left leased."""
        if self._writing:
            await asyncio.wait(self._writing, timeout=timeout)

    def _settle(self, event: Event, lease: Lease | None, runs: int,
                ingest: asyncio.Future[IngestResult]) -> None:
        if ingest not in self._writing:
            return  # settled already: one write, one hand-over
        self._writing.discard(ingest)
        result = None
        try:
            if ingest.cancelled() or ingest.exception() is not None:
                return  # nothing stored: the request answers why (if it is still there)
            result = ingest.result()
            if self.stored is not None:
                self.stored(event, result)
        except Exception:  # a bug: in a callback, nobody else would say so
            log.exception("settling an ingest failed")
        finally:  # whatever happens, the lease is settled and the runs it claimed start
            try:
                self.dispatcher.started(event, lease, runs, result)
            except Exception:
                log.exception("starting an event's runs failed; they run once their "
                              "lease ends", extra={"event_id": event.envelope.event_id})
