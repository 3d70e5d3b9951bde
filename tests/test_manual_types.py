"""The manual's Python examples of a program that talks to agentbox (events.md) type-
check as a user's script is checked: `mypy --strict` and pyright's strict mode, both
from PyPI (the test extra). And the types bite: a run's result is None until it
succeeded, read as the agent's model when asked, and a run's status is one of its
states, so the example's old `review["verdict"]` on a failed review, which passed both
and crashed with TypeError, is an error to both."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # two type checkers, each a process of its own
PAGES = ("events.md",)  # the pages whose examples are a program's, not an agent's
BIN = Path(sys.executable).parent
# What the examples' types must refuse: a failed review's result read as if it were
# there, another agent's result read as a review, a state that does not exist.
WRONG = '''
from agentbox.client import Client
from agentbox.review.model import MixReview

with Client() as box:
    run = box.follow("run_x", result=MixReview)
    print(run.result.verdict)
    print(box.run("run_x").result["verdict"])
    if run.status == "done":
        pass
'''


def examples() -> list[str]:
    found = []
    for page in PAGES:
        text = (ROOT / "agentbox" / "docs" / page).read_text(encoding="utf-8")
        found += re.findall(r"```python\n(.*?)```", text, re.S)
    return found


def checked(folder: Path) -> tuple[subprocess.CompletedProcess[str],
                                   subprocess.CompletedProcess[str]]:
    (folder / "pyrightconfig.json").write_text(json.dumps({
        "typeCheckingMode": "strict", "extraPaths": [str(ROOT)], "pythonVersion": "3.11"}))
    mypy = subprocess.run(
        [str(BIN / "mypy"), "--strict", "--no-incremental", "--python-executable",
         sys.executable, "."], cwd=folder, capture_output=True, text=True, timeout=600,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "MYPYPATH": str(ROOT), "HOME": str(folder)})
    pyright = subprocess.run(
        [str(BIN / "pyright"), "--pythonpath", sys.executable, "."], cwd=folder,
        capture_output=True, text=True, timeout=600,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(folder)})
    return mypy, pyright


def test_the_manuals_examples_pass_mypy_strict_and_pyright_strict(tmp_path: Path) -> None:
    found = examples()
    assert any("result=MixReview" in example for example in found)  # the typed one
    for number, example in enumerate(found):
        (tmp_path / f"example_{number}.py").write_text(example, encoding="utf-8")
    mypy, pyright = checked(tmp_path)
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
    assert f"no issues found in {len(found)} source files" in mypy.stdout
    assert pyright.returncode == 0, pyright.stdout + pyright.stderr
    assert "0 errors" in pyright.stdout


def test_both_refuse_a_failed_reviews_result_read_as_if_it_were_there(
        tmp_path: Path) -> None:
    (tmp_path / "wrong.py").write_text(WRONG, encoding="utf-8")
    mypy, pyright = checked(tmp_path)
    assert mypy.returncode == 1
    assert 'Item "None" of "MixReview | None" has no attribute "verdict"' in mypy.stdout
    assert 'Value of type "dict[str, Any] | None" is not indexable' in mypy.stdout
    assert "Non-overlapping equality check" in mypy.stdout  # "done" is no run state
    assert pyright.returncode == 1
    assert "Literal['done']\" have no overlap" in pyright.stdout
    assert '"verdict" is not a known attribute of "None"' in pyright.stdout
    assert "Object of type \"None\" is not subscriptable" in pyright.stdout
