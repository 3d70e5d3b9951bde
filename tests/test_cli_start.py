"""`agentbox --version`, `runs` and `show` start at once: each imports what it uses
(issue 54). What a command imported is read in its own process, at its end; no
time is measured here (scripts/bench and docs/performance.md do that)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentbox import cli, client, config
from agentbox.engine.agents import RENAMED_AGENTS
from agentbox.review import stage, words
from agentbox.review.contract import AGENTS
from agentbox.terminal import mix_review_agents
from tests.conftest import ROOT, Server, make_event
from tests.test_client import tone

# The command's main, then the modules it had imported, as JSON in the file named first.
PROBE = """
import json, sys
from agentbox.cli import main
try:
    main(sys.argv[2:], prog_name="agentbox")
finally:
    with open(sys.argv[1], "w") as out:
        json.dump(sorted(sys.modules), out)
"""
# What no client command of these needs: the review's numerics, the server, the MCP
# SDK, the store, the engine, the archive.
NEVER = ("numpy", "scipy", "soundfile", "starlette", "uvicorn", "mcp", "agentbox.store",
         "agentbox.engine", "agentbox.http", "agentbox.archive", "agentbox.review.contract")


def environment(home: Path, **more: str) -> dict[str, str]:
    """This machine's environment without agentbox's settings, its folders in `home`
    (as the server fixture's)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")},
            "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(home / "config"),
            "AGENTBOX_DATA_DIR": str(home / "data"), **more}


def imported(env: dict[str, str], cwd: Path, *args: str) -> tuple[set[str], str]:
    """The modules `agentbox ARGS` imported, and what it printed."""
    listing = cwd / "modules.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(listing), *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=60)
    return set(json.loads(listing.read_text())), done.stdout + done.stderr


def under(modules: set[str], *names: str) -> set[str]:
    """The modules that are one of `names` or inside one of them."""
    return {m for m in modules if any(m == n or m.startswith(n + ".") for n in names)}


def test_version_imports_click_and_no_pydantic(tmp_path: Path) -> None:
    modules, said = imported(environment(tmp_path), tmp_path, "--version")
    assert said.startswith("agentbox, version "), said
    assert "click" in modules
    assert not under(modules, *NEVER, "pydantic", "httpx", "agentbox.config",
                     "agentbox.client", "agentbox.models", "agentbox.terminal")


def test_runs_without_a_server_imports_the_client_alone(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        env = environment(tmp_path,
                          AGENTBOX_URL=f"http://127.0.0.1:{closed.getsockname()[1]}")
        modules, said = imported(env, tmp_path, "runs")
    assert "cannot reach agentbox" in said, said
    assert "agentbox.client" in modules and "httpx" in modules
    assert not under(modules, *NEVER, "agentbox.events", "agentbox.terminal",
                     "agentbox.review.present")


def test_runs_and_show_import_what_they_print(server: Server) -> None:
    run_id = server.post(make_event(project_id="quick")).json()["run_id"]
    server.wait_terminal(run_id)
    modules, said = imported(server.env, server.home, "runs", "--url", server.url)
    assert "quick" in said and run_id[4:14] in said, said
    assert "agentbox.terminal" in modules  # the table was told
    # The runs read as sent: pydantic's import alone was half of what `runs` took.
    assert not under(modules, *NEVER, "pydantic", "agentbox.models")
    modules, said = imported(server.env, server.home, "show", run_id, "--url", server.url)
    assert f"run {run_id}  succeeded" in said, said
    assert not under(modules, *NEVER)


# What a stored review that tells its verdict is printed without: the review's model
# (pydantic's MixReview) and its stages, the judge and the modules it judges by, the
# apps' answers `runs` does not read, wcwidth for a table of ASCII names.
MODEL = ("agentbox.review.model", "agentbox.review.stage")
JUDGING = ("agentbox.review.judge", "agentbox.review.tonal", "agentbox.review.genres",
           "agentbox.review.profiles", "agentbox.review.delivery")


def test_runs_and_show_of_real_reviews_build_no_review_model(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    mix = tone(tmp_path / "night-drive.wav")
    event = make_event(payload={"project_id": "night drive", "mix_url": str(mix)})
    run_id = server.post(event).json()["run_id"]
    assert server.wait_terminal(run_id, timeout=90)["status"] == "succeeded"
    assert server.run(run_id)["result"]["verdict"] in ("pass", "warn", "fail")
    modules, said = imported(server.env, server.home, "runs", "--url", server.url)
    row = next(line for line in said.splitlines() if run_id[4:14] in line)
    assert "night-drive.wav" in row and "LUFS" in said, said
    assert not under(modules, *NEVER, *MODEL, *JUDGING, "wcwidth", "agentbox.desktop.answers",
                     "agentbox.review.answers", "pydantic", "agentbox.models")
    modules, said = imported(server.env, server.home, "show", "night drive", "--url",
                             server.url)
    assert f"run {run_id}  succeeded" in said and "night-drive.wav: " in said, said
    assert not under(modules, *NEVER, *JUDGING, "agentbox.desktop.answers")
    assert "agentbox.review.answers" in modules  # a project's name: its latest export read


def test_the_names_the_cli_and_the_terminal_keep_are_the_ones_they_stand_for() -> None:
    """What the commands name without importing its home: the help's defaults, the
    mix review's agent names, the review's stages."""
    assert (cli.DEFAULT_HOST, cli.DEFAULT_PORT) == (config.DEFAULT_HOST, config.DEFAULT_PORT)
    assert (cli.DEFAULT_URL, cli.URL_ENV) == (client.DEFAULT_URL, client.URL_ENV)
    assert cli.FOLLOW_FIRST_SECONDS == client.FOLLOW_FIRST_SECONDS
    assert words.STAGES == stage.STAGES == tuple(stage.StageName)
    names = frozenset(AGENTS["session.exported"])
    assert mix_review_agents() == names | {old for old, new in RENAMED_AGENTS.items()
                                           if new in names}
