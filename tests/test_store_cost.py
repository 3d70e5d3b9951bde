"""scripts/store_cost.py measures the store through the code that writes it, so a change
of the store's interface the script does not follow fails here: its measured work run
whole, on this checkout, a few events (no timing is asserted; valgrind is not needed)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "store_cost.py"


def test_the_measured_work_stores_and_finishes_its_events() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--work", str(ROOT), "--batch", "4",
                           "--events", "10"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    word, value = done.stdout.split()
    assert word == "cpu_us_per_event" and float(value) > 0


def test_a_folder_that_is_no_checkout_is_refused(tmp_path: object) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--against", str(tmp_path), "--time"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "is no checkout of agentbox" in done.stderr
