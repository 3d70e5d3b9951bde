"""An idle agentbox costs next to nothing beside a DAW: no timer wakes it while
nothing is due, no thread polls. A real server process, measured from outside.

Linux only: wakeups are read from /proc/<pid>/task/*/status (each thread's
voluntary and involuntary context switches), CPU time from /proc/<pid>/stat.
Other systems have no such counters under one portable name; the code measured
is the same on all of them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server, make_event

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads Linux's /proc counters")

# Longer for the figure in the performance topic: AGENTBOX_TEST_IDLE_SECONDS=120 ... -s prints it.
WINDOW_SECONDS = float(os.environ.get("AGENTBOX_TEST_IDLE_SECONDS", "10"))
SETTLE_SECONDS = 2.5  # a second's checkpoint after the last write, the last tick of a connection
MAX_WAKEUPS_PER_SECOND = 5.0  # measured: 0 (17.6 before the timers went)
MAX_CPU_SHARE = 0.01  # of one core; measured: 0 (0.3 % before)
MAX_WAKEUPS_AFTER_A_PAGE = 1.0  # measured: 0 (2.2 with sse-starlette's watcher)
PROMPT_STOP_SECONDS = 5.0  # SIGTERM with a page open (the grace alone would be 15 s)


def context_switches(pid: int) -> int:
    """Every thread's voluntary + involuntary context switches so far: each time a
    thread was woken and went back to sleep, or was preempted while running."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except FileNotFoundError:  # a thread that just ended
            continue
        total += sum(int(line.split()[1]) for line in lines
                     if line.startswith(("voluntary_ctxt_switches",
                                         "nonvoluntary_ctxt_switches")))
    return total


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def idle_cost(server: Server) -> tuple[float, float]:
    """Wakeups per second and share of a core over WINDOW_SECONDS, no request in flight
    and no connection open."""
    server.client.close()  # its kept-alive connection would tick the Date header
    assert server.process is not None
    pid = server.process.pid
    time.sleep(SETTLE_SECONDS)
    switches, cpu, started = context_switches(pid), cpu_seconds(pid), time.monotonic()
    time.sleep(WINDOW_SECONDS)
    elapsed = time.monotonic() - started
    wakeups = (context_switches(pid) - switches) / elapsed
    share = (cpu_seconds(pid) - cpu) / elapsed
    print(f"idle: {wakeups:.2f} wakeups/s, {share:.3%} of a core over {elapsed:.0f} s")
    return wakeups, share


def test_an_idle_server_sleeps(server: Server) -> None:
    wakeups, cpu = idle_cost(server)
    assert wakeups <= MAX_WAKEUPS_PER_SECOND, f"{wakeups:.1f} wakeups/s while idle"
    assert cpu <= MAX_CPU_SHARE, f"{cpu:.2%} of a core while idle"


def test_a_server_goes_back_to_sleep_after_work(server: Server) -> None:
    """Retries, callbacks and leases leave no timer running once their runs are done."""
    ok = server.post(make_event(project_id="ok")).json()["run_id"]
    retried = server.post(make_event(project_id="fail-1")).json()["run_id"]
    assert server.wait_terminal(ok)["status"] == "succeeded"
    assert server.wait_terminal(retried)["status"] == "succeeded"
    wakeups, cpu = idle_cost(server)
    assert wakeups <= MAX_WAKEUPS_PER_SECOND, f"{wakeups:.1f} wakeups/s once idle again"
    assert cpu <= MAX_CPU_SHARE, f"{cpu:.2%} of a core once idle again"



@contextlib.contextmanager
def page_stream(server: Server) -> Iterator[httpx.Response]:
    """The status page's live stream, open, once its first event (statistics) arrived."""
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {server.admin_token()}"}) as client, \
            client.stream("GET", "/ui/stream") as stream:
        assert any(line.startswith("data:") for line in stream.iter_lines())
        yield stream


def test_a_closed_page_leaves_nothing_running(server: Server) -> None:
    """A page's live updates tick while it is open, and not a moment longer (the
    stream library's own shutdown watcher, 2 wakeups/s for the rest of the
    process's life once a page had opened, is not used)."""
    with page_stream(server):
        pass
    wakeups, cpu = idle_cost(server)
    assert wakeups <= MAX_WAKEUPS_AFTER_A_PAGE, f"{wakeups:.1f} wakeups/s after a page closed"
    assert cpu <= MAX_CPU_SHARE, f"{cpu:.2%} of a core after a page closed"


def test_an_open_page_does_not_hold_up_a_stop(server: Server) -> None:
    """The page's stream ends when SIGTERM asks the server to stop, without a poll."""
    with page_stream(server):
        started = time.monotonic()
        assert server.stop() == -15  # uvicorn exits by the signal it stopped for
        assert time.monotonic() - started < PROMPT_STOP_SECONDS
