"""The manual's examples are code: every Python example of docs/apps.md and
docs/agents.md, taken from the Markdown (tests/support/manual.py), read in order,
defines or imports each name it uses and imports as the files of a package; the
plugin docs/agents.md registers under the documented entry-point group loads (and
one under the former group too). The backup app docs/apps.md builds runs in a
real server in tests/test_apps.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import manual

TOPICS = ("apps", "agents")


@pytest.mark.parametrize("topic", TOPICS)
def test_every_example_names_its_file_and_uses_only_what_it_defines_or_imports(
        topic: str) -> None:
    made = manual.files(topic)
    python = {name: text for name, text in made.items() if name.endswith(".py")}
    assert python, f"{topic}.md has no Python example"
    assert sum(kind == "python" for kind, _ in manual.blocks(topic)) >= len(python)
    missing = {name: sorted(manual.undefined(text, name)) for name, text in python.items()}
    assert not any(missing.values()), missing


def test_the_checker_finds_what_an_example_leaves_undefined() -> None:
    source = textwrap.dedent("""\
        import shutil

        async def copy(event, ctx):
            await asyncio.to_thread(shutil.copyfile, event, ctx)
            return Copied(saved_to="x")

        copies = host.tables(SCHEMA)
        """)
    assert manual.undefined(source) == {"asyncio", "Copied", "host", "SCHEMA"}


def test_a_block_that_names_no_file_goes_on_with_the_one_before() -> None:
    assert "async def publish" in manual.files("agents")["mypackage/agents.py"]
    assert "def check_stem" in manual.files("agents")["stemcheck/__init__.py"]


def run_python(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTBOX_")}
    env["PYTHONPATH"] = f"{root}{os.pathsep}{ROOT}"
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("topic", TOPICS)
def test_the_examples_import_as_the_files_of_a_package(topic: str, tmp_path: Path) -> None:
    """Each module the examples make imports (its definitions run) in a fresh process."""
    written = manual.write(topic, tmp_path)
    modules = [".".join(path.relative_to(tmp_path).with_suffix("").parts)
               .removesuffix(".__init__") for path in written if path.suffix == ".py"]
    done = run_python(tmp_path, "import importlib, sys\n"
                                f"for name in {modules!r}: importlib.import_module(name)\n"
                                "print('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def install(root: Path, name: str, group: str, entry: str) -> None:
    """A package's metadata as pip leaves it (a dist-info with its entry points)."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")


def documented_entry_point() -> tuple[str, str]:
    """The group and the entry point of docs/agents.md's pyproject.toml example."""
    [block] = [text for kind, text in manual.FENCE.findall(manual.manual.text("agents"))
               if kind == "toml" and "entry-points" in text]
    [(group, entries)] = tomllib.loads(block)["project"]["entry-points"].items()
    [(name, target)] = entries.items()
    return group, f"{name} = {target}"


LOADS = textwrap.dedent("""\
    import json
    from agentbox.engine.agents import AgentRegistry, discover_plugins
    found = discover_plugins()
    registry = AgentRegistry.from_bindings([], plugins=found)
    print(json.dumps({"plugins": [name for name, _ in found],
                      "agents": [s.name for s in registry.for_event_type("stem.bounced")]}))
    """)


def test_a_plugin_registered_under_the_documented_group_loads(tmp_path: Path) -> None:
    group, entry = documented_entry_point()
    assert group == "agentbox.agents"
    manual.write("agents", tmp_path)
    install(tmp_path, "stemcheck", group, entry)
    done = run_python(tmp_path, LOADS)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"plugins": ["stems"], "agents": ["stemcheck:check_stem"]}


def test_a_plugin_under_the_former_group_still_loads_and_once_under_both(
        tmp_path: Path) -> None:
    manual.write("agents", tmp_path)
    install(tmp_path, "stemcheck", "agentbox.engine.agents", "stems = stemcheck:plugin")
    done = run_python(tmp_path, LOADS)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["plugins"] == ["stems"]
    (tmp_path / "stemcheck-1.0.dist-info" / "entry_points.txt").write_text(
        "[agentbox.agents]\nstems = stemcheck:plugin\n"
        "[agentbox.engine.agents]\nstems = stemcheck:plugin\n")
    done = run_python(tmp_path, LOADS)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"plugins": ["stems"], "agents": ["stemcheck:check_stem"]}


def test_every_hook_of_app_and_every_door_of_host_is_in_the_manual() -> None:
    """As Datasette's tests keep its plugin hooks documented: what an app may override
    and what the Host lends it, each named in docs/apps.md."""
    import re

    from agentbox.apps import App, Host

    text = manual.manual.text("apps")
    hooks = [name for name in vars(App) if not name.startswith("_")]
    doors = [name for name in vars(Host) if not name.startswith("_")]
    doors += ["settings", "store", "registry", "dispatcher", "clock", "pages", "admin_token"]
    assert [name for name in hooks if not re.search(rf"`{name}\b", text)] == []
    assert [name for name in doors if not re.search(rf"host\.{name}\b", text)] == []
