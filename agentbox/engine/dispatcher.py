"""The dispatcher: claims due runs with a lease, runs their agents, records outcomes.

It is woken in-process when a run is committed (no polling delay when idle)
and otherwise sleeps until the next retry time or lease end. Retries are
scheduled in the store (a next-attempt time), never by sleeping in a worker.

Every running agent is fenced by its lease. When the lease's deadline passes
without a renewal (read on `portable.since_boot`, which a pause or a sleep of
the machine does not stop), the agent's next step waits while the lease is
renewed with one conditional write (`Store.renew_lease`: still this attempt,
nobody claimed the run since); renewed, the agent goes on untouched. A lease
another claim took, or one the storage cannot renew, cancels the agent (an
asyncio.CancelledError inside it, `ctx.lease_lost` set) and its outcome is
refused, because another instance may be running the same attempt's successor.
An instance never takes a lease from itself: before it claims, it renews its own
attempts whose lease ran out, so its claim never reclaims one of them.

When it has slots free and knows of nothing older waiting, the receiver stores
a new event's runs already claimed (`lease_for`, then `started`, both called
through `agentbox.engine.handover.Handover`, which keeps their contract): the
agent starts as the 202 goes out, and the run costs no claim of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbox import logs, portable
from agentbox.config import Settings
from agentbox.engine.agents import (
    AgentContext,
    AgentRegistry,
    AttemptGivenBack,
    InvalidAgentOutput,
    PermanentAgentError,
    RetryableAgentError,
)
from agentbox.engine.gate import Hold
from agentbox.engine.loop import AGAIN, IDLE, Loop
from agentbox.engine.metrics import Metrics
from agentbox.engine.timeouts import within
from agentbox.events import Event, InvalidEvent, parse_event
from agentbox.logs import get_logger
from agentbox.runs import RunStatus, backoff_seconds
from agentbox.store import (
    ClaimedRun,
    Emitted,
    IngestResult,
    Lease,
    Outcome,
    StorageUnavailable,
    Store,
    Transition,
)

log = get_logger("runs")
agent_log = get_logger("agent")  # what agents log through their context
# Idle, the claim loop sleeps until the next retry or lease end it knows of, or until
# woken (a commit, a finishing run, another instance's notice). The longest sleep is a
# net for what no wake-up reports: on a shared database, another instance's runs (a
# dropped connection loses its notices); on a local store, which has no other writer,
# only a bug. Long idle sleeps keep a quiet process asleep beside a DAW.
MAX_IDLE_WAIT_SECONDS = 5.0  # a shared database
MAX_LOCAL_IDLE_WAIT_SECONDS = 60.0  # a local store (SQLite)
MAX_ERROR_MESSAGE_CHARS = 500
PRUNE_BATCH = 1000
EVENT_CACHE_SIZE = 10_000  # beyond it (a backlog), claimed runs parse their stored body
# An instance holds up to this many times AGENTBOX_WORKER_CONCURRENCY runs claimed:
# the next ones are claimed while agents run, and start, in claim order, as slots free.
PREFETCH = 4
# While agents run, their lease deadlines are checked at least this often. A timer due
# at the deadline alone would be enough through a SIGSTOP, but the event loop's clock
# (CLOCK_MONOTONIC) stops while the machine sleeps: after waking, a lease lost over the
# night is found within this long.
FENCE_CHECK_SECONDS = 1.0
# An outcome (or a renewal) the storage refused is tried again after a backoff from
# RECORD_RETRY_SECONDS up to RECORD_RETRY_MAX_SECONDS, but never later than a quarter
# of what is left of the attempt's lease (at least RECORD_RETRY_MIN_SECONDS): the
# tries get denser as the lease's end nears, so a storage back before it hears of
# the outcome before another claim can take the finished run and run it again.
# Past the end the run is claimable; the outcome is tried every
# RECORD_RETRY_LATE_SECONDS at most, the first to land keeps the run.
RECORD_RETRY_SECONDS = 0.1
RECORD_RETRY_MAX_SECONDS = 5.0
RECORD_RETRY_MIN_SECONDS = 0.05
RECORD_RETRY_LATE_SECONDS = 0.25

Listener = Callable[[Transition], None]


@dataclass
class InFlight:
    """An attempt claimed here, until its outcome is stored."""

    task: asyncio.Task[None]
    ctx: AgentContext
    leased_until: float  # as far as this instance knows: its claim, or the last renewal
    # The same end on `portable.since_boot`, counted from before the claim or renewal
    # was sent (so never later than the end the database holds): the agent's fence.
    fence: float = math.inf
    running: bool = False  # the agent is running (a lost lease cancels it)
    # Set while the lease is renewed past its fence: the agent's next step waits for it.
    renewing: asyncio.Future[None] | None = None


class Dispatcher:
    def __init__(
        self,
        store: Store,
        registry: AgentRegistry,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        owner: str | None = None,
        services: Mapping[type, object] | None = None,
    ) -> None:
        self.store = store
        self.services = dict(services or {})  # lent to every agent (AgentContext.service)
        self.metrics = metrics
        self.registry = registry
        self.settings = settings
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.listeners: list[Listener] = []
        self._stop = asyncio.Event()
        # Attempts claimed here, by run_id (their leases are renewed).
        self._inflight: dict[str, InFlight] = {}
        # Agents running at once: at most AGENTBOX_WORKER_CONCURRENCY. A slot frees
        # when its agent returns, not when the outcome's write commits.
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self._held = 0  # claimed runs whose agent has not returned (waiting or running)
        self._unstarted: list[tuple[str, int]] = []  # claimed, never started (at shutdown)
        self._events: dict[str, Event] = {}  # run_id -> event, for runs not yet claimed
        self._reserved = 0  # slots promised to leases handed out by `lease_for`
        self._claiming = False
        # The store may hold runs due that this dispatcher has not claimed: new events
        # then wait their turn as accepted rather than being claimed as they arrive.
        self._backlog = True
        self._next_due: float | None = None  # when the next retry or lease end falls due
        self._fence_timer: asyncio.TimerHandle | None = None  # while agents run
        self._fence_by = -math.inf  # when that timer fires, on since_boot
        self._renewals: set[asyncio.Task[None]] = set()  # leases renewed past their fence
        # No lease held here ends before this (on `clock`): a bound, made exact by each
        # look for overdue ones (`_renew_own`), which it spares every other claim round.
        self._soonest_end = math.inf
        # The claims' due times are read on `clock` (the store's); the renewals' and the
        # upkeep's are intervals, read on the monotonic clock.
        self.claims = Loop("agentbox-claim", self._claim_round, clock=clock,
                           max_wait=MAX_IDLE_WAIT_SECONDS if store.shared
                           else MAX_LOCAL_IDLE_WAIT_SECONDS, failure="claiming runs failed")
        # No net: while nothing runs, nothing is renewed and no timer is set.
        self.heartbeat = Loop("agentbox-heartbeat", self._heartbeat_round, max_wait=None)
        self.maintenance = Loop("agentbox-maintenance", self._maintenance_round,
                                max_wait=None, failure="maintenance failed",
                                retry=settings.maintenance_interval_seconds)

    # -- life cycle -----------------------------------------------------------------

    async def start(self, recover_all_leases: bool = True) -> None:
        if recover_all_leases and not self.store.shared:
            # Runs this store's previous life left processing are claimable now,
            # not after their lease would have run out. (A shared database's other
            # instances may be alive: their runs wait for their leases to expire.)
            released = await self.store.release_leases("*", self.clock())
            if released:
                log.info("recovering runs left processing by a previous process",
                         extra={"runs": released})
        for loop in (self.claims, self.heartbeat, self.maintenance):
            loop.start()

    async def stop(self) -> None:
        """Stop taking work, let running agents finish within the grace period,
        and leave the rest to lease recovery."""
        self._stop.set()
        self.claims.wake()
        for attempt in self._inflight.values():
            attempt.ctx.cancelled.set()  # agents that watch it can wrap up within the grace
        running = [attempt.task for attempt in self._inflight.values()]
        if running:
            log.info("waiting for running agents", extra={"runs": len(running)})
            _, pending = await asyncio.wait(running, timeout=self.settings.shutdown_grace_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for loop in (self.claims, self.heartbeat, self.maintenance):
            await loop.stop()
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        if self._renewals:  # else one could land after the leases are given back
            await asyncio.wait(self._renewals)
        with contextlib.suppress(StorageUnavailable):  # else the leases run out by themselves
            given_back = await self.store.release_leases(self.owner, self.clock(),
                                                         self._unstarted)
            if given_back:  # their last line said processing: say where they are now
                log.info("runs claimed here and not finished are given back, to be "
                         "claimed again (at the next start, or by another instance)",
                         extra={"runs": given_back})

    def wake(self) -> None:
        self._backlog = True
        self.claims.wake()

    async def replay(self, run_id: str) -> None:
        """Send a dead-lettered or failed run back to accepted (the API and the page)."""
        self._announce(await self.store.replay(run_id, self.clock()))
        self.wake()

    def accepted(self, event: Event, run_ids: Sequence[str]) -> None:
        """Runs for `event` were committed as accepted: keep the validated event for
        them (so the common case parses each body once) and claim at once."""
        self._keep(event, run_ids)
        self.wake()

    def _keep(self, event: Event, run_ids: Sequence[str]) -> None:
        if len(self._events) >= EVENT_CACHE_SIZE:
            # A backlog, or runs another instance claimed (PostgreSQL): start over;
            # runs whose event is not kept parse their stored body.
            self._events.clear()
        for run_id in run_ids:
            self._events[run_id] = event

    def lease_for(self, runs: int) -> Lease | None:
        """A lease under which a new event's `runs` runs are stored already claimed,
        if they can start here at once: slots free, and nothing older known to be
        waiting (that goes first). Else None: they are stored accepted and claimed
        in turn. Every lease asked for is settled by one `started` call (`Handover`)."""
        if self._stop.is_set() or self._claiming or self._waiting() or self._free() < runs:
            return None
        self._reserved += runs
        return Lease(self.owner, self.clock() + self.settings.lease_seconds)

    def started(self, event: Event, lease: Lease | None, runs: int,
                result: IngestResult | None) -> None:
        """The receiver's ingest with `lease_for(runs)`'s answer ended (`result` None:
        it failed): start what it claimed, claim what it left accepted."""
        if lease is not None:
            self._reserved -= runs
        if result is None or result.duplicate:
            return
        for transition in result.transitions:
            self._announce(transition)
        claimed = {run.run_id for run in result.claimed}
        if self._stop.is_set():  # committed as the instance stopped: given back at exit
            self._unstarted += [(run.run_id, run.attempt) for run in result.claimed]
        elif claimed and lease is not None:
            self._keep(event, list(claimed))
            # The lease's end, on since_boot: both clocks read now (lease_for read the store's)
            fence = portable.since_boot() + lease.until - self.clock()
            for run in result.claimed:
                self._spawn(run, lease.until, fence)
        waiting = [ref.run_id for ref in result.runs
                   if ref.status == RunStatus.ACCEPTED and ref.run_id not in claimed]
        if waiting:
            self.accepted(event, waiting)

    def _waiting(self) -> bool:
        """Runs may be due in the store: a backlog, or a retry or lease end passed."""
        return self._backlog or (self._next_due is not None and self._next_due <= self.clock())

    def _free(self) -> int:
        return self.settings.worker_concurrency * PREFETCH - self._held - self._reserved

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # -- claiming -------------------------------------------------------------------

    async def _claim_round(self) -> float | None:
        """Claim what is due, as many as slots are free; when the next round is due."""
        s = self.settings
        free = self._free()
        if free <= 0 or self._stop.is_set():
            return IDLE  # a finishing run wakes us (stopping: nothing more is claimed)
        self._claiming = True
        now, steady = self.clock(), portable.since_boot()
        try:
            await self._renew_own(now)
            result = await self.store.claim(
                self.owner, free, now, s.lease_seconds, s.max_retries + 1
            )
        finally:
            self._claiming = False
        for transition in result.transitions:
            self._announce(transition)
        for claimed in result.claimed:
            self._spawn(claimed, now + s.lease_seconds, steady + s.lease_seconds)
        # All slots filled: more may be due (claim again once slots free up).
        self._backlog = len(result.claimed) == free or self.claims.woken
        self._next_due = result.next_due_at
        return AGAIN if self._backlog else result.next_due_at

    async def _renew_own(self, now: float) -> None:
        """Renew this instance's attempts whose lease ended by `now` (a pause, a sleep)
        before a claim at `now`: else the claim would take them from their own agents.
        Those it cannot renew are lost (their agents cancelled), and claimable."""
        if now < self._soonest_end:
            return  # the usual case: renewed by the heartbeat, no lease has ended
        overdue = [self._renewal(attempt) for attempt in self._inflight.values()
                   if attempt.leased_until <= now and not attempt.ctx.lease_lost]
        if overdue:
            await asyncio.wait(overdue)  # not gather: a cancellation must not reach them
        self._soonest_end = min((a.leased_until for a in self._inflight.values()
                                 if not a.ctx.lease_lost), default=math.inf)

    def _spawn(self, claimed: ClaimedRun, leased_until: float, fence: float) -> None:
        ctx = AgentContext(
            run_id=claimed.run_id,
            attempt=claimed.attempt,
            agent=claimed.agent,
            log=logging.LoggerAdapter(agent_log, {
                "run_id": claimed.run_id, "agent": claimed.agent,
                "event_id": claimed.event_id, "attempt": claimed.attempt}),
            settings=self.settings,
            services=self.services,
        )
        task = asyncio.create_task(self._execute(claimed, ctx), name=f"run-{claimed.run_id}")
        self._inflight[claimed.run_id] = InFlight(task, ctx, leased_until, fence)
        self._soonest_end = min(self._soonest_end, leased_until)
        self.heartbeat.due(time.monotonic() + self.settings.lease_seconds / 3)
        self._held += 1
        task.add_done_callback(lambda done: self._finished(claimed.run_id, done))

    def _finished(self, run_id: str, task: asyncio.Task[None]) -> None:
        # Only its own entry: after a lost lease the run may be claimed here again.
        if run_id in self._inflight and self._inflight[run_id].task is task:
            del self._inflight[run_id]

    # -- running one attempt ----------------------------------------------------------

    async def _execute(self, claimed: ClaimedRun, ctx: AgentContext) -> None:
        logs.CURRENT_RUN.set(claimed.run_id)  # (this task's own context) for its prints
        ran = lost = False
        try:
            async with self._slots:
                if not self._stop.is_set() and not await self._still_held(claimed, ctx):
                    lost = not self._stop.is_set()  # else given back, if still held here
                    return
                if self._stop.is_set():
                    return  # not started: given back with this instance's leases
                ran = True
                started = time.monotonic()
                try:
                    fenced = await self._fenced(claimed, ctx)
                except AttemptGivenBack:
                    ran = False  # waited for a resource until the stop: not started
                    return
                duration_ms = (time.monotonic() - started) * 1000
        finally:
            self._held -= 1
            if not ran and not lost:  # shutting down (or cancelled) before a slot came
                self._unstarted.append((claimed.run_id, claimed.attempt))
            if self._waiting():  # room to claim what waits
                self.claims.wake()
        if fenced is None:  # the lease was lost: the run is another attempt's now
            self.claims.wake()
            return
        outcome = fenced
        try:
            transition = await self._record(claimed, outcome)
        except Exception:  # a bug; the lease runs out and the run is attempted again
            log.exception("recording an outcome failed", extra={"run_id": claimed.run_id})
            return
        if self.metrics is not None:
            self.metrics.attempt(claimed.agent, duration_ms / 1000,
                                 None if transition is None else transition.status,
                                 claimed.accepted_at)
        if outcome.next_attempt_at is not None and transition is not None:  # a retry
            due = outcome.next_attempt_at
            self._next_due = due if self._next_due is None else min(self._next_due, due)
        if transition is None or not RunStatus(transition.status).terminal:
            self.claims.wake()  # lost, or a retry: when it falls due, the claim loop knows
        if transition is not None:
            self._announce(transition, duration_ms=round(duration_ms, 3))
            for spawned in transition.spawned:
                self._announce(spawned)
            for event, run_ids in transition.emitted:
                if run_ids:
                    self.accepted(event, run_ids)

    async def _still_held(self, claimed: ClaimedRun, ctx: AgentContext) -> bool:
        """Whether a run that waited for a slot may start: its lease may have run out
        meanwhile (renewals failing in a storage outage) and the run been claimed
        again, by another instance or by this one as a later attempt. Starting it
        then would run its agent twice (only one outcome would land)."""
        run_id, delay = claimed.run_id, 0.1
        while (attempt := self._inflight.get(run_id)) is not None and attempt.ctx is ctx:
            if ctx.lease_lost:
                break  # a renewal found it taken (`_renew_late`)
            now = self.clock()
            known_until = attempt.leased_until
            if now < known_until - self.settings.lease_seconds / 3:
                return True  # renewed on time: no renewal missed
            try:
                held = run_id in await self._renew({run_id: attempt})
            except StorageUnavailable:
                if now < known_until:
                    return True  # still leased here: as safe as an agent already running
                if self._stop.is_set():
                    return False  # given back at shutdown, if the storage lets it
                await asyncio.sleep(delay)  # wait for the storage to tell
                delay = min(delay * 2, 5.0)
                continue
            if not held or self._inflight.get(run_id) is not attempt:
                break  # taken by another, or claimed here again meanwhile
            return True
        log.warning("a claimed run's lease ran out while it waited for a slot; not "
                    "starting it here", extra={"run_id": run_id, "attempt": claimed.attempt})
        return False

    async def _fenced(self, claimed: ClaimedRun, ctx: AgentContext) -> Outcome | None:
        """The attempt, under its lease's fence: None when the lease was lost while
        the agent ran (it was cancelled, or it returned anyway: its outcome is stale)."""
        attempt = self._inflight[claimed.run_id]  # held: `_still_held` said so
        attempt.running = True
        self._arm_fence(attempt.fence)
        try:
            outcome: Outcome | None = await self._attempt(claimed, ctx, self._hold(attempt))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not ctx.lease_lost or task is None:
                raise  # the shutdown's (or the caller's) cancellation
            task.uncancel()
            return None  # `_lose` said so as it cancelled
        finally:
            attempt.running = False
        if ctx.lease_lost:  # it went on after its cancellation, and returned
            _stale(claimed.run_id, claimed.attempt, "the attempt's outcome is refused: "
                   "its lease was lost while the agent ran")
            return None
        return outcome

    def _arm_fence(self, fence: float) -> None:
        """Check the running agents' fences by `fence` (since_boot) at the latest, and
        every FENCE_CHECK_SECONDS while any runs."""
        if self._fence_timer is not None and fence >= self._fence_by:
            return  # the usual case, as an agent starts: no clock read
        now = portable.since_boot()
        wait = min(FENCE_CHECK_SECONDS, max(0.0, fence - now))
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        loop = asyncio.get_running_loop()
        self._fence_timer = loop.call_at(loop.time() + wait, self._check_fences)
        self._fence_by = now + wait

    def _check_fences(self) -> None:
        """Renew the lease of every running agent whose deadline passed without a
        renewal, for an agent that waits long (on a thread, a slow call): its next
        step, whenever it comes, waits for the answer (`_hold`)."""
        self._fence_timer = None
        now = portable.since_boot()
        running = [a for a in self._inflight.values() if a.running and not a.ctx.lease_lost]
        for attempt in running:
            if attempt.fence <= now:
                self._renewal(attempt)
        fences = [a.fence for a in running if a.renewing is None and not a.ctx.lease_lost]
        if fences:
            self._arm_fence(min(fences))

    def _hold(self, attempt: InFlight) -> Hold:
        """The gate before each step of `attempt`'s agent: past its fence, the step
        waits for the lease's renewal (which cancels the agent if the lease is lost)."""
        def hold() -> asyncio.Future[None] | None:
            if attempt.renewing is None and (
                    attempt.ctx.lease_lost or portable.since_boot() < attempt.fence):
                return None  # the usual case: one clock read
            # Shielded: cancelling the agent (a timeout) leaves the renewal to others.
            return asyncio.shield(self._renewal(attempt))
        return hold

    def _renewal(self, attempt: InFlight) -> asyncio.Future[None]:
        """The renewal of `attempt`'s lease past its fence, started if none is under way;
        done once it is renewed, or lost."""
        if attempt.renewing is None:
            attempt.renewing = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._renew_late(attempt))
            self._renewals.add(task)
            task.add_done_callback(self._renewals.discard)
        return attempt.renewing

    async def _renew_late(self, attempt: InFlight) -> None:
        ctx, lease = attempt.ctx, self.settings.lease_seconds
        held: bool | None = None  # None: the storage did not answer
        try:
            until, fence = self.clock() + lease, portable.since_boot() + lease
            with contextlib.suppress(StorageUnavailable):
                held = await self.store.renew_lease(self.owner, ctx.run_id, ctx.attempt, until)
            if held:
                attempt.leased_until = max(attempt.leased_until, until)
                attempt.fence = max(attempt.fence, fence)
                if attempt.running:
                    self._arm_fence(attempt.fence)
            elif attempt.running and not ctx.lease_lost and (
                    self._inflight.get(ctx.run_id) is attempt):
                self._lose(attempt, "a running attempt's lease, past its deadline, was taken "
                           "by another claim; its agent is cancelled" if held is False else
                           "a running attempt's lease could not be renewed past its deadline "
                           "(the storage did not answer); its agent is cancelled")
            elif held is False and not attempt.running:  # waiting for a slot: another's
                ctx.lease_lost = True  # never renewed again; `_still_held` says so at its slot
        finally:
            done, attempt.renewing = attempt.renewing, None
            if done is not None and not done.done():
                done.set_result(None)

    def _lose(self, attempt: InFlight, why: str) -> None:
        attempt.ctx.lease_lost = True
        attempt.ctx.cancelled.set()  # for work in threads, which no cancellation reaches
        attempt.task.cancel()
        _stale(attempt.ctx.run_id, attempt.ctx.attempt, why)

    async def _attempt(self, claimed: ClaimedRun, ctx: AgentContext, hold: Hold) -> Outcome:
        spec = self.registry.get(claimed.agent)
        if spec is None:
            return Outcome(RunStatus.FAILED_PERMANENT, error_code="agent_not_configured",
                           error_message=f"no agent {claimed.agent} is configured; "
                                         "configure it and replay the run")
        try:
            event = self._events.pop(claimed.run_id, None) or parse_event(claimed.event_body)
        except InvalidEvent as exc:
            return Outcome(RunStatus.FAILED_PERMANENT, error_code="invalid_event",
                           error_message=_clip(str(exc)))
        ctx.event = event
        ctx.deadline = time.monotonic() + self.settings.run_timeout_seconds
        try:
            value = await within(self.settings.run_timeout_seconds, spec.function(event, ctx),
                                 hold)
            return Outcome(RunStatus.SUCCEEDED, result=spec.to_json(value),
                           emitted=await self._emitted(ctx), subscriptions=tuple(ctx.subscriptions))
        except AttemptGivenBack as exc:
            if self._stop.is_set():
                raise
            return self._retry(claimed, exc.code, str(exc))
        except PermanentAgentError as exc:
            return Outcome(RunStatus.FAILED_PERMANENT, error_code=exc.code,
                           error_message=_clip(str(exc)))
        except InvalidAgentOutput as exc:
            return Outcome(RunStatus.FAILED_PERMANENT, error_code="invalid_agent_output",
                           error_message=_clip(str(exc)))
        except TimeoutError:
            return self._retry(claimed, "timeout", f"the agent ran longer than "
                               f"{self.settings.run_timeout_seconds:g} s")
        except RetryableAgentError as exc:
            return self._retry(claimed, exc.code, str(exc))
        except Exception as exc:  # an agent's bug or a dependency's failure: retry
            ctx.log.warning("agent raised", exc_info=True)
            return self._retry(claimed, "agent_exception", f"{type(exc).__name__}: {exc}")

    async def _emitted(self, ctx: AgentContext) -> tuple[Emitted, ...]:
        """The run's emitted events, each with the agents configured for its type. A
        type no configured agent handles is still routed (by the store, in the
        success's transaction) when an agent subscribed to it, this run's own
        `ctx.subscribe` included (it lands first); one nobody receives fails the
        run (emit_unhandled)."""
        s = self.settings
        found = []
        subscribed: dict[tuple[str, str], bool] | None = None  # (agent, type): read once
        for event, body in ctx.emitted:
            event_type = event.envelope.event_type
            agents = tuple(spec.name for spec in self.registry.for_event_type(event_type))
            if not agents and subscribed is None:
                try:
                    changes = await self.store.agent_subscriptions()
                except StorageUnavailable:
                    raise RetryableAgentError("the store could not be read to route an "
                                              "emitted event", "storage_unavailable") from None
                subscribed = {(c.agent, c.event_type): c.subscribed for c in changes}
                subscribed.update(((ctx.agent, kind), on) for kind, on in ctx.subscriptions)
            if not agents and not any(on for (_, kind), on in (subscribed or {}).items()
                                      if kind == event_type):
                raise PermanentAgentError(
                    f"emitted {event_type}, which no agent handles or subscribed to; "
                    "configure one in AGENTBOX_AGENTS", "emit_unhandled")
            found.append(Emitted(event, body, agents, self.clock() + s.idempotency_ttl_seconds,
                                 s.max_hops))
        return tuple(found)

    def _retry(self, claimed: ClaimedRun, code: str, message: str) -> Outcome:
        s = self.settings
        if claimed.round_attempt > s.max_retries:
            return Outcome(RunStatus.DEAD_LETTERED, error_code=code, error_message=_clip(message))
        delay = backoff_seconds(claimed.round_attempt, s.retry_base_seconds, s.retry_max_seconds)
        return Outcome(RunStatus.FAILED_RETRYABLE, error_code=code, error_message=_clip(message),
                       next_attempt_at=self.clock() + delay)

    async def _record(self, claimed: ClaimedRun, outcome: Outcome) -> Transition | None:
        """Write the outcome, retrying while the storage is unavailable: the outcome
        only exists in memory until then."""
        backoff = RECORD_RETRY_SECONDS
        while True:
            try:
                transition = await self.store.finish(
                    claimed.run_id, self.owner, claimed.attempt, outcome, self.clock())
            except StorageUnavailable:
                if self._stop.is_set():
                    return None  # lease recovery will run the attempt again
                attempt = self._inflight.get(claimed.run_id)
                await asyncio.sleep(_within_lease(backoff, attempt))
                backoff = min(backoff * 2, RECORD_RETRY_MAX_SECONDS)
                continue
            if transition is None:
                _stale(claimed.run_id, claimed.attempt, "the attempt's outcome is refused: "
                       "its lease was taken by another claim")
            return transition

    def _announce(self, transition: Transition, **timings: Any) -> None:
        if log.isEnabledFor(logging.INFO):  # else not even the fields are gathered
            logs.info(log, "run state changed", {
                "event_id": transition.event_id, "run_id": transition.run_id,
                "event_type": transition.event_type, "source": transition.source,
                "agent": transition.agent, "status": transition.status,
                "attempt": transition.attempt, "error_code": transition.error_code,
                **({"note": transition.note} if transition.note else {}), **timings,
            })
        if transition.status == RunStatus.DEAD_LETTERED:  # an operator alert
            log.warning("ALERT: a run was dead-lettered; inspect it with `agentbox "
                        "dead-letters` and replay it with `agentbox replay`", extra={
                            "run_id": transition.run_id, "event_id": transition.event_id,
                            "agent": transition.agent, "error_code": transition.error_code})
        for listener in self.listeners:
            listener(transition)

    # -- background upkeep ------------------------------------------------------------

    async def _heartbeat_round(self) -> float | None:
        """Renew the leases of the attempts in flight, every third of a lease."""
        if not self._inflight:
            return IDLE  # nothing to renew while nothing runs: no timer either
        # On failure, try again next beat; a lease lost meanwhile makes finish a no-op
        # (and keeps a run still waiting for a slot from starting: `_still_held`), and
        # a running agent's fence cancels it at the deadline.
        attempts = {k: a for k, a in self._inflight.items() if not a.ctx.lease_lost}
        beat = self.settings.lease_seconds / 3
        if not attempts:  # every one lost: their tasks are ending
            return time.monotonic() + beat
        try:
            held = set(await self._renew(attempts))
        except StorageUnavailable:  # tried again sooner as the leases' ends near
            soonest = min(attempts.values(), key=lambda a: a.fence, default=None)
            return time.monotonic() + _within_lease(beat, soonest)
        for run_id, attempt in attempts.items():
            if (run_id not in held and attempt.running and not attempt.ctx.lease_lost
                    and self._inflight.get(run_id) is attempt):
                self._lose(attempt, "a running attempt's lease was taken by another "
                           "claim; its agent is cancelled")
        return time.monotonic() + beat

    async def _renew(self, attempts: dict[str, InFlight]) -> list[str]:
        """Extend these attempts' leases and note the new end on each still held (on
        one that finished or was replaced meanwhile: harmless). The run_ids held."""
        until = self.clock() + self.settings.lease_seconds
        fence = portable.since_boot() + self.settings.lease_seconds
        held = await self.store.extend_leases(
            self.owner, [(run_id, a.ctx.attempt) for run_id, a in attempts.items()], until)
        for run_id in held:
            attempts[run_id].leased_until = until
            attempts[run_id].fence = fence
        return held

    async def _maintenance_round(self) -> float | None:
        try:
            pruned = await self.prune()
        except StorageUnavailable:  # tried again next round, not sooner
            pruned = 0
        if pruned:
            log.info("pruned expired idempotency keys", extra={"keys": pruned})
        return time.monotonic() + self.settings.maintenance_interval_seconds

    async def prune(self) -> int:
        total = 0
        while True:
            pruned = await self.store.prune_idempotency_keys(self.clock(), PRUNE_BATCH)
            total += pruned
            if pruned < PRUNE_BATCH:
                return total


def _within_lease(delay: float, attempt: InFlight | None) -> float:
    """`delay`, shortened to a quarter of what is left of `attempt`'s lease (the
    RECORD_RETRY_* rule)."""
    if attempt is None:
        return delay
    left = attempt.fence - portable.since_boot()
    if left <= 0:
        return min(delay, RECORD_RETRY_LATE_SECONDS)
    return min(delay, max(RECORD_RETRY_MIN_SECONDS, left / 4))


def _stale(run_id: str, attempt: int, message: str) -> None:
    log.warning(message, extra={"run_id": run_id, "attempt": attempt, "reason": "lease_lost"})


def _clip(message: str) -> str:
    return message if len(message) <= MAX_ERROR_MESSAGE_CHARS else (
        message[: MAX_ERROR_MESSAGE_CHARS - 1] + "…")
