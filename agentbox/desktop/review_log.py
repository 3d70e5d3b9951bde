"""A log line for each mix review that finishes: what `agentbox serve`'s window says
of it (`night-drive.wav: pass · -14.2 LUFS · true peak -1.1 dBTP · …`, or
`empty.wav: couldn't review: the file is empty — export it again`).

A dispatcher listener, as the desktop notification is: the run is read after its
state is stored, in a task of its own, and whatever goes wrong is only logged;
nothing here is part of a run.
"""

from __future__ import annotations

import asyncio

from agentbox.logs import get_logger
from agentbox.review.present import mix_name
from agentbox.runs import TERMINAL
from agentbox.store import Store, Transition
from agentbox.terminal import mix_review_agents, summary_line, verdict_word

log = get_logger("reviews")



class ReviewLog:
    """Logs `review finished` (run_id, project, file, verdict, told) per mix review."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tasks: set[asyncio.Task[None]] = set()

    def on_transition(self, transition: Transition) -> None:
        if transition.status not in TERMINAL or transition.agent not in mix_review_agents():
            return
        task = asyncio.get_running_loop().create_task(self._log(transition.run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _log(self, run_id: str) -> None:
        try:
            found = await self.store.get_run(run_id)
            if found is None:
                return
            run = found
            if run.file is None:  # (the store's view names no file: the event does)
                event = await self.store.event_of(run_id)
                payload = event.get("payload") if isinstance(event, dict) else None
                url = payload.get("mix_url") if isinstance(payload, dict) else None
                run = run.model_copy(update={"file": mix_name(url)
                                             if isinstance(url, str) else None})
            log.info("review finished", extra={
                "run_id": run_id, "project": run.get("project"), "file": run.file,
                "verdict": verdict_word(run), "told": summary_line(run)})
        except asyncio.CancelledError:
            raise
        except Exception:  # never the run's: said, and the reviews go on
            log.warning("a finished review could not be read for the log",
                        exc_info=True, extra={"run_id": run_id})

    async def close(self) -> None:
        """Cancel the lines still on their way (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
