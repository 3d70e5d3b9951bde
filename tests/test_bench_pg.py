"""scripts/bench --peers --database-url: agentbox on PostgreSQL, procrastinate and pgqueuer
measured end to end on the test set-up's real PostgreSQL, each peer in the environment
the bench makes for it (the first run installs them from the package index), with real
uvicorn, workers and wrk on 127.0.0.1. A peer that cannot be installed or dies fails the
bench, it is never left out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.scripts import load_script

BENCH = ROOT / "scripts" / "bench.py"
TARGETS = {"agentbox x1", "procrastinate", "pgqueuer"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_postgres_peer_runs_every_event_it_took_and_reports_its_cpu(
        tmp_path: Path, postgres_admin_url: str) -> None:
    report_file = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(BENCH), "--peers", "--database-url",
                           postgres_admin_url, "--duration", "1", "--concurrency", "4",
                           "--rounds", "1", "--instances", "1", "--json", str(report_file)],
                          capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(report_file.read_text())
    rows = {r["target"]: r for r in report["load"]}
    assert TARGETS | {"ceiling"} == set(rows)
    for target in TARGETS:
        row = rows[target]
        assert set(row["statuses"]) == {"202"} and not any(row["errors"].values()), target
        assert row["accepted_per_s"] > 0 and row["completed_per_s"] > 0, target
        check = row["store_check"]
        # the worker (or agentbox) ran every event taken, wrk's counted 202s included
        assert check["ok"] and check["completed"] >= check["taken"] >= check["accepted"] > 0
        cpu = row["cpu_us_per_event"]
        assert cpu["servers"] > 0 and cpu["postgres"] > 0, target
        assert cpu["total"] >= cpu["servers"] + cpu["postgres"] + cpu["worker"] - 3
        assert (cpu["worker"] > 0) == (target != "agentbox x1"), target
        assert row["commits_per_event"] > 0 and row["wal_bytes_per_event"] > 0, target
        assert row["postgres"]["samples"] > 0, target
    summary = {(r["system"], r["connections"]): r for r in report["pg_peers"]}
    for target in TARGETS:
        assert summary[target, 4]["completed_per_s"] == rows[target]["completed_per_s"]
        assert target in done.stdout  # the printed table has its row
    assert len(summary["agentbox x1", 4]["x_pgqueuer"]) == 1


@pytest.mark.slow  # making a virtual environment: seconds
def test_a_peer_that_cannot_be_installed_ends_the_bench(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """No silent skip: pip's failure stops the bench, naming the peer and pip's output."""
    bench_pg = load_script("bench_pg")
    monkeypatch.setattr(bench_pg, "ENVS", tmp_path / "envs")
    monkeypatch.setitem(bench_pg.PEER_PACKAGES, "pgqueuer",
                        [str(tmp_path / "no-such-package")])
    with pytest.raises(SystemExit, match="making pgqueuer's environment failed") as failed:
        bench_pg.environment("pgqueuer")
    assert "no-such-package" in str(failed.value)
    assert not list((tmp_path / "envs").glob("*/complete"))  # tried again next time
