"""scripts/serve_cost.py counts a real server's instructions per event; here its work
runs whole without valgrind (a real `agentbox serve` on 127.0.0.1 in the bench's
configuration, signed events over HTTP, every run waited for), so a change of the
server's configuration or answers the script does not follow fails here. No count or
time is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "serve_cost.py"


@pytest.mark.slow
def test_the_measured_work_serves_every_event_to_its_end() -> None:
    # measured() exits non-zero unless every event is answered 202 and every run ends.
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; sys.path.insert(0, "
         "sys.argv[1]); import serve_cost; print(serve_cost.measured(Path(sys.argv[2]), 12, "
         "4, counting=False))", str(SCRIPT.parent), str(ROOT)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0"]


def test_a_folder_that_is_no_checkout_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--against", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "is no checkout of agentbox" in done.stderr
