"""The analysis beside a DAW: its process runs at low priority on one thread,
ignores the terminal's Ctrl-C, one analysis at a time by default, and a run that
only waited for the analysis slot when the server stops costs no retry."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile

from agentbox.review.analysis import BUSY_NAME, Analysis, analysis_processes
from tests.conftest import ROOT, Server, make_event, wait_until

OLD = time.time() - 3600
LINUX = sys.platform.startswith("linux")


@pytest.fixture
def analysis() -> Iterator[Analysis]:
    pool = Analysis()
    yield pool
    pool.shutdown()


def long_mix(path: Path, minutes: float, rate: int = 48_000) -> Path:
    """A long stereo 16-bit mix, written a minute at a time (never whole in memory)."""
    rng = np.random.default_rng(11)
    with soundfile.SoundFile(path, "w", rate, 2, "PCM_16") as out:
        for _ in range(int(minutes)):
            out.write(rng.normal(0, 0.1, size=(rate * 60, 2)).astype(np.float32))
    os.utime(path, (OLD, OLD))
    return path


def busy_analysis() -> multiprocessing.process.BaseProcess | None:
    found = [p for p in multiprocessing.active_children() if p.name == BUSY_NAME]
    return found[0] if found else None


def test_one_analysis_at_a_time_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_ANALYSIS_PROCESSES", raising=False)
    assert analysis_processes() == 1 and Analysis.configured().processes == 1
    monkeypatch.setenv("AGENTBOX_ANALYSIS_PROCESSES", "3")
    assert analysis_processes() == 3 and Analysis.configured().processes == 3


@pytest.mark.skipif(not LINUX, reason="reads the process's priority from /proc (Linux)")
def test_the_analysis_runs_at_low_priority_on_one_thread(tmp_path: Path,
                                                         analysis: Analysis) -> None:
    path = long_mix(tmp_path / "long.wav", 6)
    seen: dict[str, object] = {}

    async def watch() -> None:
        task = asyncio.create_task(analysis.run(str(path)))
        # the numerical libraries are loaded once the process has opened the file
        process = await asyncio.to_thread(wait_until, busy_analysis, 120, "an analysis")
        assert process.pid is not None
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        seen["nice"] = int(stat.rsplit(")", 1)[1].split()[16])  # field 19: nice
        seen["getpriority"] = os.getpriority(os.PRIO_PROCESS, process.pid)
        status = Path(f"/proc/{process.pid}/status").read_text()
        seen["threads"] = int(status.split("Threads:")[1].split()[0])
        environ = Path(f"/proc/{process.pid}/environ").read_bytes()
        seen["environ"] = environ
        outcome = await task
        assert outcome[0] == "ok", outcome

    asyncio.run(watch())
    assert seen["nice"] == 10 and seen["getpriority"] == 10, seen
    assert seen["threads"] == 1, seen  # no OpenBLAS/OpenMP worker threads spinning


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT are POSIX")
def test_ctrl_c_in_the_terminal_does_not_reach_the_analysis(tmp_path: Path) -> None:
    """Ctrl-C sends SIGINT to the terminal's whole foreground process group: here a
    parent in its own session, whose analysis child must carry on (the parent
    decides when it stops)."""
    # Long enough that the analysis is still measuring when the signal comes: a
    # 4-minute mix was done in about a second here, and the signal then found the
    # parent already exiting (it died of it: -2).
    path = long_mix(tmp_path / "long.wav", 12)
    ready = tmp_path / "analysing"
    script = textwrap.dedent(f"""
        import asyncio, multiprocessing, signal, sys, time
        from agentbox.review.analysis import BUSY_NAME, Analysis

        interrupted = []
        async def main():
            signal.signal(signal.SIGINT, lambda *a: interrupted.append(1))
            task = asyncio.create_task(analysis.run({str(path)!r}))
            while not [p for p in multiprocessing.active_children() if p.name == BUSY_NAME]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the child has loaded numpy and is measuring
            open({str(ready)!r}, "w").close()
            outcome = await task
            print(outcome[0], len(interrupted))

        if __name__ == "__main__":
            analysis = Analysis()
            asyncio.run(main())
            analysis.shutdown()
    """)
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")],
                              cwd=tmp_path, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(ready.exists, 120, "the analysis to be under way")
        os.killpg(parent.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = parent.communicate(timeout=300)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 0, err
    assert out.split() == ["ok", "1"], (out, err)  # the parent saw it; the child did not
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_stopping_costs_no_retry_to_a_run_waiting_for_the_analysis(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    first = long_mix(tmp_path / "first.wav", 10)
    second = long_mix(tmp_path / "second.wav", 1)
    env = {"AGENTBOX_AGENTS": "", "AGENTBOX_ANALYSIS_PROCESSES": "1",
           "AGENTBOX_SHUTDOWN_GRACE_SECONDS": "1"}
    server = server_factory(env).start()
    busy = server.post(make_event(payload={"project_id": "a", "mix_url": str(first)}))
    waiting = server.post(make_event(payload={"project_id": "b", "mix_url": str(second)}))
    busy_id, waiting_id = busy.json()["run_id"], waiting.json()["run_id"]
    wait_until(lambda: server.run(busy_id)["status"] == "processing"
               and server.run(waiting_id)["status"] == "processing", 60,
               "both runs to be claimed (one analysing, one waiting for the slot)")
    assert server.stop() in (0, -signal.SIGTERM)  # uvicorn ends by re-raising it
    server.start()
    run = server.wait_terminal(waiting_id, timeout=180)
    assert run["status"] == "succeeded", run
    assert (run["attempt"], run["retry_count"]) == (1, 0), run
