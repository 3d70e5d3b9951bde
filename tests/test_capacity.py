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
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT


def load_capacity() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))  # capacity imports bench, bench_pg beside it
    spec = spec_from_file_location("capacity", ROOT / "scripts" / "capacity.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


capacity = load_capacity()


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


def test_the_steady_window_is_the_difference_of_two_readings() -> None:
    steady = capacity.Steady.__new__(capacity.Steady)
    steady.cpus = {1}
    steady.readings = [(10.0, 1000, [2.0, 3.0], 5.0, 100.0),
                       (15.0, 6000, [3.25, 4.25], 5.75, 100.5)]
    assert steady.figures() == {"seconds": 5.0, "completed_per_s": 1000, "a_us": 500,
                                "d_us": 150, "instance_cpu": [0.25, 0.25],
                                "app_cpu_idle": 0.1}
    steady.readings = steady.readings[:1]
    with pytest.raises(SystemExit, match="steady part was not measured"):
        steady.figures()


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
