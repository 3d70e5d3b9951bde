"""scripts/studio_bench.py builds its stores through the code that writes them, so a
change of the schema the script does not follow fails here: the script run whole, on
stores a few runs large (real reviews by a real server included), answers a median
for every page on both stores (each page answered 200, or the script fails), and says
how many runs and projects each store holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "scripts" / "studio_bench.py"
TINY = ["--projects", "3", "--exports", "2", "--reviewed", "1", "--reviews", "2",
        "--small-projects", "2", "--small-exports", "1", "--small-reviewed", "1",
        "--small-reviews", "1", "--seconds-of-audio", "2", "--requests", "1"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_studio_bench_builds_both_stores_and_times_every_page(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), *TINY, "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    medians = json.loads(done.stdout.strip().splitlines()[-1])["medians_ms"]
    pages = {"home page", "GET /exports", "GET /exports?project=", "runs: q=an event id",
             "runs: q=a project", "runs: q=a project of 2", "runs: a page of 50",
             "a review's page"}
    assert set(medians) == {"small", "large"}
    assert all(set(found) == pages for found in medians.values())
    assert all(value > 0 for found in medians.values() for value in found.values())
    stores = json.loads((tmp_path / "stores.json").read_text())
    assert (stores["small"]["runs"], stores["small"]["projects"]) == (1 * 2 + 1 * 1, 3)
    # and "Demo", a project of as many exports as the small store's have (--small-exports)
    assert (stores["large"]["runs"], stores["large"]["projects"]) == (3 * 2 + 1 * 2 + 1, 5)
