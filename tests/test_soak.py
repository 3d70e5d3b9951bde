"""The short variant of scripts/soak: a few kill -9s of a loaded server, then
the promise's figures must all be 0."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT


def load_soak() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import soak  # scripts/soak.py
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return soak


@pytest.mark.slow  # servers killed with kill -9 under load
def test_a_short_soak_loses_nothing(tmp_path: Path) -> None:
    soak = load_soak()
    report = soak.soak(kills=4, seed=20261203, home=tmp_path, quiet=True,
                       least_per_round=15)
    assert report["events_acknowledged"] > 50, report
    for name in soak.MUST_BE_ZERO:
        assert report[name] == 0, report


@pytest.mark.postgres
def test_a_short_soak_on_postgresql_loses_nothing(tmp_path: Path, postgres_url: str) -> None:
    soak = load_soak()
    report = soak.soak(kills=3, seed=20261204, home=tmp_path, quiet=True,
                       database_url=postgres_url, least_per_round=20)
    assert report["events_acknowledged"] > 50, report
    for name in soak.MUST_BE_ZERO:
        assert report[name] == 0, report
