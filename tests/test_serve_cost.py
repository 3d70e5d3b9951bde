"""scripts/serve_cost.py counts a real server's instructions per event; here its work
runs whole without valgrind (a real `agentbox serve` on 127.0.0.1 in the bench's
configuration, signed events over HTTP, every run waited for), so a change of the
server's configuration or answers the script does not follow fails here. No count or
time is asserted."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "serve_cost.py"


def serve_cost() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serve_cost", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_measured_work_serves_every_event_to_its_end() -> None:
    # measured() raises SystemExit unless every event is answered 202 and every run ends.
    assert serve_cost().measured(ROOT, 12, 4, counting=False) == 0


def test_a_folder_that_is_no_checkout_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--against", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "is no checkout of agentbox" in done.stderr
