"""scripts/bench --peers: the Redis reference design and huey measured end to end
beside agentbox, with real redis-server, huey_consumer, uvicorn and wrk processes
on 127.0.0.1 (scripts/test installs wrk and redis-server; a missing one fails the
peers' test, it is not skipped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.scripts import load_script

BENCH = ROOT / "scripts" / "bench.py"
SHORT = ["--duration", "1", "--concurrency", "4", "--seed-runs", "0", "--backlog", "0",
         "--mix-minutes", "0"]
PEERS = {("reference", "aof"): "reference design, Redis AOF always + worker",
         ("reference", "memory"): "reference design, Redis in memory + worker",
         ("huey", "sqlite"): "Starlette + huey SqliteHuey + consumer"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_peer_runs_every_event_it_accepted_and_gets_a_row(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(BENCH), "--peers", *SHORT,
                           "--json", str(report_file)],
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(report_file.read_text())
    rows = {(r["target"], r["store"]): r for r in report["load"] if (r["target"], r.get(
        "store")) in PEERS}
    assert set(rows) == set(PEERS)
    for key, row in rows.items():
        assert row["connections"] == 4
        assert set(row["statuses"]) == {"202"} and not any(row["errors"].values()), key
        assert row["accepted_per_s"] > 0 and row["completed_per_s"] > 0, key
        assert row["cpu_us_per_request"] > 0, key
        check = row["store_check"]
        # the worker ran every event the receiver took, counted 202s included
        assert check["ok"] and check["completed"] >= check["enqueued"] >= check["accepted"] > 0
        assert check["accepted"] == row["statuses"]["202"]
        assert set(row["processes"]) == ({"redis-server", "worker", "receiver"}
                                         if key[0] == "reference" else {"consumer", "receiver"})
    summary = {(r["system"], r["connections"]): r for r in report["peers"]}
    for name in [*PEERS.values(), "agentbox (no-op agent)",
                 "ceiling (HMAC + pydantic, stores nothing)"]:
        assert (name, 4) in summary, name
        assert summary[name, 4]["accepted_per_s"] > 0
        assert name in done.stdout  # the printed table has its row
    for key, name in PEERS.items():
        assert summary[name, 4]["completed_per_s"] == rows[key]["completed_per_s"]


def test_peers_name_what_to_install_and_measure_nothing(tmp_path: Path) -> None:
    """No redis-server on PATH: exit 2 before the work directory or a table."""
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run([sys.executable, str(BENCH), "--peers", *SHORT],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": str(empty), "HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "scripts/bench --peers needs:" in done.stderr
    assert "redis-server (Debian: apt-get install redis-server" in done.stderr
    assert "nothing was measured" in done.stderr
    assert "work directory" not in done.stderr and done.stdout == ""


def test_a_missing_python_package_is_named_with_the_extra_to_install() -> None:
    peers = load_script("bench_peers")
    need = peers.missing(which=lambda name: f"/usr/bin/{name}",
                         find_spec=lambda name: None if name == "huey" else object())
    assert need == ["the Python package huey (into agentbox's venv: "
                    ".venv/bin/pip install -e '.[bench]')"]
    assert peers.missing(which=lambda name: f"/usr/bin/{name}",
                         find_spec=lambda name: object()) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_against_runs_another_checkout_alternated_with_this_one(tmp_path: Path) -> None:
    """--against DIR: DIR's agentbox (here this checkout again, through its own venv and
    scripts) and this one, in turned order each round, each with its ratios to the
    peers of the same round."""
    report_file = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(BENCH), "--peers", "--against", str(ROOT),
                           "--duration", "2", "--concurrency", "4", "--rounds", "2",
                           "--json", str(report_file)],
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(report_file.read_text())
    order = [(r["round"], r["target"]) for r in report["load"]]
    assert order == [(1, "agentbox"), (1, "against"), (1, "huey"), (1, "reference"),
                     (2, "against"), (2, "huey"), (2, "reference"), (2, "agentbox")]
    for row in report["load"]:
        assert row["completed_per_s"] > 0 and row["store_check"]["ok"], row["target"]
        assert row["load_average"] >= 0
    ab = {entry["target"]: entry for entry in report["ab"]}
    assert set(ab) == {"agentbox", "against", "huey", "reference"}
    for target in ("agentbox", "against"):
        for peer in ("huey", "reference"):
            assert len(ab[target][f"x_{peer}"]) == 2 and all(ab[target][f"x_{peer}"])
    assert len(ab["agentbox"]["x_against"]) == 2 and "x_against" not in ab["against"]
    assert "agentbox (--against)" in done.stdout and "x --against" in done.stdout


def test_against_a_directory_that_is_no_checkout_measures_nothing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--peers", "--against", str(tmp_path),
                           *SHORT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path} has no scripts/_setup" in done.stderr
    assert "nothing was measured" in done.stderr and done.stdout == ""
