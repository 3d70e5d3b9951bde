"""The benchmark scripts as modules, for tests of their pieces: scripts/NAME.py loaded
with scripts/ on the import path (they import each other, bench.py beside them)."""

from __future__ import annotations

import sys
from importlib.util import module_from_spec, spec_from_file_location
from types import ModuleType

from tests.conftest import ROOT

SCRIPTS = ROOT / "scripts"


def load_script(name: str) -> ModuleType:
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
