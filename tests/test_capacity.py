"""scripts/capacity.py's model: the per-event demands taken from the calibration runs,
the bottleneck law's prediction and the first bottleneck it names, and the steady
window's figures from two readings. The measured runs themselves need root, cgroups
and minutes (the command in agentbox/docs/scaling.md#capacity); this checks the
arithmetic they feed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.support.scripts import load_script

capacity = load_script("capacity")


def run(a_us: int, d_us: int = 150, cpu: float = 0.25, idle: float = 0.0) -> dict[str, object]:
    return {"a_us": a_us, "d_us": d_us, "w_cores": 0.1, "instance_cpu": [cpu],
            "app_cpu_idle": idle, "commits_per_event": 0.16, "wal_bytes_per_event": 3500,
            "wal_syncs_per_event": 0.05, "wal_sync_ms": 0.5}


def test_the_model_takes_a_from_one_instance_and_p_from_two() -> None:
    m = capacity.model(run(300), run(320), run(250, cpu=0.8, idle=0.2))
    assert (m["a_us"], m["p_us"], m["d_us"], m["g_cores"]) == (300, 20, 150, 0.8)
    # two instances cheaper per event than one is noise, not a negative cost
    assert capacity.model(run(300), run(280), run(250, cpu=0.8, idle=0.2))["p_us"] == 0
    # a core that had no time to spare says nothing of what one instance could use
    assert capacity.model(run(300), run(320), run(250, cpu=0.8, idle=0.0))["g_cores"] == 1.0


def test_the_prediction_is_the_smaller_of_the_instances_and_the_database() -> None:
    m = capacity.model(run(300), run(320), run(250, cpu=0.8, idle=0.2))
    # one machine of one core: two instances (g = 0.8), one core between them
    one = capacity.predict(m, 1, 1, 16)
    assert one["bottleneck"] == "agentbox instances"
    assert one["events_per_s"] == round(1.0 / (300 + 20) * 1e6)
    # many machines against a small database: the database's CPU runs out first
    many = capacity.predict(m, 16, 4, 2)
    assert many["bottleneck"] == "database CPU"
    assert many["events_per_s"] == round(2 / 150 * 1e6)
    # the WAL's share of the time at that rate
    assert many["wal_flush_use"] == round(many["events_per_s"] * 0.05 * 0.5 / 1e3, 2)
    # the check's shared core: what wrk leaves of it
    shared = capacity.predict(m, 4, 0.25, 1, shared_core=True)
    assert shared["limits"]["the instances' core (with wrk)"] == round(0.9 / (300 + 3 * 20) * 1e6)


@pytest.mark.parametrize(("cores", "instances"), [(1, 2), (2, 3), (4, 5)])
def test_a_machine_runs_enough_instances_to_use_its_cores(cores: int, instances: int) -> None:
    assert capacity.per_machine({"g_cores": 0.9}, cores) == instances


def steady_with(readings: list[tuple[float, int, int, list[float], float, float]]) -> Any:
    steady = capacity.Steady.__new__(capacity.Steady)
    steady.cpus = {1}
    steady.readings = readings
    return steady


def test_the_steady_window_is_the_difference_of_two_readings() -> None:
    steady = steady_with([(10.0, 1100, 1000, [2.0, 3.0], 5.0, 100.0),
                          (15.0, 6150, 6000, [3.25, 4.25], 5.75, 100.5)])
    assert steady.figures(load_ended=16.0) == {
        "seconds": 5.0, "completed_per_s": 1000, "taken_per_s": 1010, "a_us": 500,
        "d_us": 150, "instance_cpu": [0.25, 0.25], "app_cpu_idle": 0.1}


@pytest.mark.parametrize(("readings", "load_ended", "said"), [
    ([(10.0, 10, 10, [1.0], 1.0, 1.0)], 20.0, "steady part was not measured"),
    ([(10.0, 10, 10, [1.0], 1.0, 1.0), (15.0, 90, 90, [2.0], 2.0, 1.0)], 14.0,
     "ended after the load"),
    ([(10.0, 10, 10, [1.0], 1.0, 1.0), (15.0, 10, 10, [2.0], 2.0, 1.0)], 16.0,
     "no run was done"),
])
def test_a_window_that_measured_nothing_steady_is_refused(
        readings: list[tuple[float, int, int, list[float], float, float]], load_ended: float,
        said: str) -> None:
    with pytest.raises(SystemExit, match=said):
        steady_with(readings).figures(load_ended=load_ended)


class NoConnection:
    def close(self) -> None:
        pass


def test_a_load_that_never_gets_going_takes_no_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capacity, "STEADY_START_DEADLINE_S", 0.2)
    steady = steady_with([])
    steady.conn, steady.stopping = NoConnection(), capacity.threading.Event()
    steady._count = lambda sql: 0
    started = time.monotonic()
    steady.run()
    assert steady.readings == [] and time.monotonic() - started < 5


def test_a_stopped_window_ends_at_once() -> None:
    steady = steady_with([])
    steady.conn, steady.stopping = NoConnection(), capacity.threading.Event()
    steady._count = lambda sql: 0
    steady.stopping.set()
    started = time.monotonic()
    steady.run()
    assert steady.readings == [] and time.monotonic() - started < 1


def test_a_load_too_short_for_a_steady_part_is_refused_before_anything_starts() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "capacity.py"),
                           "--duration", "3"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--duration 3 leaves no steady part to measure; give at least 4.5" in done.stderr
    assert "work directory" not in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="capacity.py is Linux only")
def test_the_busy_loop_ends_with_the_process_that_started_it() -> None:
    """The busy loop keeping the instances' core busy must not outlive a check that
    was killed: it would spin for ever."""
    started = subprocess.run(
        [sys.executable, "-c", "import os, sys; sys.path.insert(0, sys.argv[1]); "
         "import capacity; print(capacity.busy_filler({min(os.sched_getaffinity(0))}).pid)",
         str(ROOT / "scripts")], capture_output=True, text=True, timeout=60, check=True)
    filler = int(started.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{filler}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{filler}/stat").read_text(errors="replace")
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # ended, not yet reaped
            break
        time.sleep(0.05)
    else:
        if Path(f"/proc/{filler}").exists():
            os.kill(filler, signal.SIGKILL)
            pytest.fail("the busy loop outlived the process that started it")
