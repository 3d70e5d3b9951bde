"""Apps on the engine (agentbox.apps, docs/apps.md): the manual's backup app, built
from the manual's own text, and an export log written from the manual alone run
beside the review in a real server on both engines (their agents, tables, pages and
files); an app without the app it requires is refused in words that name it; a
database made before the review had tables of its own opens with everything in
place; and the engine runs with no app and no numpy."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path

import pytest

from agentbox.archive.history import SCHEMA
from agentbox.config import ConfigError
from agentbox.store.sqlite import SqliteStore
from tests.conftest import ROOT, Server, in_process_settings, make_event
from tests.support import manual
from tests.test_page_reviews import song, write

APPS = "agentbox.review.app:app,agentbox.desktop.app:app,mybackup.app:app"
COPY = "mybackup.agent:copy"
EXPORT_LOG = "tests.support.export_log.app"  # written from docs/apps.md alone

# Every version of the review's line, in order (one per file of its tables folder).
REVIEW_VERSIONS = [("review", n) for n in range(1, 1 + sum(
    1 for f in files("agentbox.archive").joinpath("tables", "sqlite").iterdir()
    if f.name[:3].isdigit()))]


@pytest.fixture(scope="module")
def backup_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """docs/apps.md's backup app, its files as the manual gives them (`mybackup`), in a
    folder on sys.path (and on the servers' PYTHONPATH)."""
    root = tmp_path_factory.mktemp("manual")
    manual.write("apps", root)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [name for name in sys.modules if name.split(".")[0] == "mybackup"]:
        del sys.modules[name]


def with_app(root: Path, env: dict[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_the_manuals_app_runs_beside_the_review(
        engine: str, server_factory: Callable[..., Server], request: pytest.FixtureRequest,
        tmp_path: Path, backup_app: Path) -> None:
    """The backup app of docs/apps.md, built from its text: each export has two runs
    (the review and the copy), the copy's bytes are the mix's, its table lists it, its
    page shows it and every page's menu links it."""
    env = {"AGENTBOX_APPS": APPS, "AGENTBOX_AGENTS": ""}  # the apps' own agents
    if engine == "postgres":
        env["AGENTBOX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    server = server_factory(with_app(backup_app, env)).start()
    mix = write(tmp_path, "take 1.wav", song(4, 0.4, 1))
    answer = server.post(make_event(project_id="Backed up", payload={
        "project_id": "Backed up", "mix_url": str(mix)})).json()
    runs = {run["agent"]: run["run_id"] for run in answer["runs"]}
    assert set(runs) == {"agentbox.review.agent:mix_review", COPY}
    copied = server.wait_terminal(runs[COPY], timeout=60)
    assert copied["status"] == "succeeded", (copied["error_code"], copied["error_message"])
    copy = Path(copied["result"]["saved_to"])
    assert copy.parent == server.home / "data" / "backup" and copy.read_bytes() == mix.read_bytes()
    reviewed = server.wait_terminal(runs["agentbox.review.agent:mix_review"], timeout=120)
    assert reviewed["status"] == "succeeded" and reviewed["result"]["verdict"]
    page = server.client.get("/backup")
    assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"
    assert f'data-run-id="{runs[COPY]}"' in page.text
    assert str(mix) in page.text and "succeeded" in page.text
    assert f'<td class="mono">{copy}</td>' in page.text  # the Copy column: the copy's path
    assert '<a href="/backup" id="nav-backup" aria-current="page">Backup</a>' in page.text
    # the review's pages are as they were beside it, the backup one click away
    # The same bytes again: the review knows them, and the answer is the event's runs,
    # the copy's too, as an idempotency key it knows is answered.
    again = server.post(make_event(project_id="Backed up", payload={
        "project_id": "Backed up", "mix_url": str(mix)}))
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert {run["agent"]: run["run_id"] for run in again.json()["runs"]} == runs
    home = server.client.get("/").text
    assert 'data-project="Backed up"' in home and 'id="nav-backup"' in home
    assert '<a href="/" id="nav-projects" aria-current="page">Projects</a>' in home


def test_the_manuals_app_settings_are_listed_and_checked(backup_app: Path,
                                                         tmp_path: Path) -> None:
    """Its settings module, which its app module imports, registers its section:
    `agentbox config` lists it, where each was set, and refuses what does not fit."""
    from click.testing import CliRunner

    from agentbox.cli import main

    path = tmp_path / "agentbox.toml"
    path.write_text("[backup]\nbackup_listed = 5\n", encoding="utf-8")
    shown = CliRunner().invoke(main, ["config", "--config", str(path)],
                               env={"AGENTBOX_APPS": APPS, "AGENTBOX_BACKUP_LISTED": None})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    backup = lines.index("[backup]")
    assert f"backup_listed = 5  # backup.backup_listed in {path}" in lines[backup:]
    assert 'backup_folder = "backup"  # default' in lines[backup:]
    refused = CliRunner().invoke(main, ["config", "--config", str(path)],
                                 env={"AGENTBOX_APPS": APPS, "AGENTBOX_BACKUP_LISTED": "0"})
    assert refused.exit_code == 2
    assert "AGENTBOX_BACKUP_LISTED must be a positive number (got 0)" in refused.output


def test_an_apps_package_without_its_init_file_still_gives_its_tables(
        tmp_path: Path) -> None:
    """A package with no __init__.py (a namespace package: a reader left it out) still
    gives its migrations and its statements, where its path took one name a step."""
    from agentbox.store import Schema

    folder = tmp_path / "nsbackup" / "tables" / "sqlite"
    folder.mkdir(parents=True)
    (folder / "001_one.sql").write_text("CREATE TABLE one (x);\n", encoding="utf-8")
    (folder / "queries.sql").write_text("-- name: ones\nSELECT x FROM one\n",
                                        encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        schema = Schema(line="nsbackup", package="nsbackup")
        assert schema.migrations("sqlite") == ["CREATE TABLE one (x);"]
        assert schema.statements("sqlite")["ones"].strip() == "SELECT x FROM one"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nsbackup", None)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_an_app_written_from_the_manual_alone_starts_beside_the_review(
        engine: str, server_factory: Callable[..., Server], request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    """The export log (tests/support/export_log: a CSV log of exports with a page):
    each export is a line of its log, its page and its CSV show it, and its files,
    named as the engine's and the review's are, are its own under its name."""
    env = {"AGENTBOX_APPS": f"agentbox.review.app:app,{EXPORT_LOG}:app",
           "AGENTBOX_AGENTS": ""}
    if engine == "postgres":
        env["AGENTBOX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    server = server_factory(env).start()
    mix = write(tmp_path, "take 2.wav", song(3, 0.4, 2))
    answer = server.post(make_event(project_id="Logged", payload={
        "project_id": "Logged", "mix_url": str(mix)})).json()
    runs = {run["agent"]: run["run_id"] for run in answer["runs"]}
    assert set(runs) == {"agentbox.review.agent:mix_review", f"{EXPORT_LOG}:log_export"}
    logged = server.wait_terminal(runs[f"{EXPORT_LOG}:log_export"], timeout=60)
    assert logged["status"] == "succeeded", (logged["error_code"], logged["error_message"])
    assert logged["result"] == {"log": str(server.home / "data" / "exports.csv")}
    page = server.client.get("/exportlog")
    assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"
    assert f'data-run-id="{runs[f"{EXPORT_LOG}:log_export"]}"' in page.text
    assert ">Logged<" in page.text and "take 2.wav" in page.text
    log = server.client.get("/exportlog.csv")
    assert log.headers["content-type"].startswith("text/csv")
    [line] = log.text.splitlines()[1:]
    assert line.startswith(f'{runs[f"{EXPORT_LOG}:log_export"]},Logged,take 2.wav,')
    # its page.css and home.html beside the engine's and the review's
    theirs = server.client.get("/static/exportlog/page.css")
    assert theirs.status_code == 200 and b"export-log" in theirs.content
    assert theirs.content != server.client.get("/ui/static/page.css").content
    assert "/static/exportlog/page.css?v=" in page.text
    home = server.client.get("/").text
    assert "Your projects" in home and "Export log" not in home.split("<main>")[1]
    assert '<a href="/exportlog" id="nav-exportlog">Export log</a>' in home
    for missing in ("/static/exportlog/home.html", "/static/exportlog/..%2Fapp.py",
                    "/static/nobody/page.css", "/static/review/page.css"):
        assert server.client.get(missing).status_code == 404, missing


def test_an_app_without_the_app_it_requires_is_refused_in_words_that_name_it(
        tmp_path: Path) -> None:
    """Not `AGENTBOX_AGENTS: unknown event type`, which the user never set: the app
    that is missing, or listed after the app that needs it."""
    from agentbox.apps import load_apps

    alone = in_process_settings(tmp_path, AGENTBOX_APPS=f"{EXPORT_LOG}:app")
    with pytest.raises(ConfigError) as refused:
        load_apps(alone)
    said = str(refused.value)
    assert "the app 'exportlog' requires the app 'review'" in said
    assert "AGENTBOX_AGENTS" not in said and "unknown event type" not in said
    late = in_process_settings(tmp_path, AGENTBOX_APPS=f"{EXPORT_LOG}:app,"
                                                      "agentbox.review.app:app")
    with pytest.raises(ConfigError, match="AGENTBOX_APPS lists after it: list the app "
                                          "'review' before 'exportlog'"):
        load_apps(late)
    assert [app.name for app in load_apps(in_process_settings(
        tmp_path, AGENTBOX_APPS=f"agentbox.review.app:app,{EXPORT_LOG}:app"))] == [
        "review", "exportlog"]


def test_an_app_whose_event_type_nobody_registers_is_named_in_the_error() -> None:
    from agentbox.apps import App, default_agents

    class Careless(App):
        name = "careless"

        def agents(self) -> dict[str, tuple[str, ...]]:
            return {"take.comped": ("careless.agent:comp",)}

    with pytest.raises(ConfigError) as refused:
        default_agents([Careless()])
    said = str(refused.value)
    assert "the app 'careless' runs agents for the event type 'take.comped'" in said
    assert "Careless.requires" in said and "AGENTBOX_AGENTS" not in said


def test_an_app_that_cannot_be_imported_stops_the_start(server_factory: Callable[..., Server]
                                                        ) -> None:
    server = server_factory({"AGENTBOX_APPS": "agentbox.review.app:app,no.such.module:app"})
    done = subprocess.run([sys.executable, "-m", "agentbox", "serve", "--port", "1"],
                          env=server.env, cwd=server.home, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "AGENTBOX_APPS: cannot import 'no.such.module'" in done.stderr


# -- a database of the release before apps -------------------------------------------------


def test_a_database_of_the_previous_layout_opens_with_everything_in_place(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    """A real server reviews two exports and keeps a reference track; then the database
    is made the previous release's (no line of the review's: it had these tables as the
    store's own); a server of this code opens it with every export, the reference and
    the archived audio in place, and its line recorded at version 1."""
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    project = "Night Drive"
    runs = []
    for take in (1, 2):
        mix = write(tmp_path, f"take {take}.wav", song(3, 0.3 * take, 1))
        runs.append(server.post(make_event(payload={"project_id": project,
                                                    "mix_url": str(mix)})).json()["run_id"])
        assert server.wait_terminal(runs[-1], timeout=120)["status"] == "succeeded"
    reference = write(tmp_path, "reference.wav", song(3, 0.5, 2))
    put = server.client.put(f"/projects/{project}/reference", params={"name": "reference.wav"},
                            content=reference.read_bytes(),
                            headers={"Authorization": f"Bearer {server_token(server)}"})
    assert put.status_code in (200, 201), put.text
    before = exports_of(server, project)
    audio = server.client.get(f"/runs/{runs[0]}/audio").content
    server.stop()
    database = server.home / "data" / "agentbox.sqlite3"
    with sqlite3.connect(database) as conn:  # the previous release's layout
        lines = conn.execute("SELECT line, version FROM agentbox_lines").fetchall()
        assert lines == REVIEW_VERSIONS
        conn.execute("DROP TABLE agentbox_lines")
    (server.home / "data" / "archive" / "incoming").mkdir(exist_ok=True)

    again = server_factory({"AGENTBOX_AGENTS": ""}, home=server.home).start()
    assert exports_of(again, project) == before
    assert again.client.get(f"/runs/{runs[0]}/audio").content == audio
    assert again.client.get(f"/projects/{project}/reference/audio").content == \
        reference.read_bytes()
    assert again.client.get(f"/projects/{project}/reference").json()["name"] == \
        "reference.wav"
    again.stop()
    with sqlite3.connect(database) as conn:
        lines = conn.execute("SELECT line, version FROM agentbox_lines").fetchall()
        assert lines == REVIEW_VERSIONS


def server_token(server: Server) -> str:
    return (server.home / "config" / "agentbox" / "admin_token").read_text().strip()


def exports_of(server: Server, project: str) -> list[dict[str, object]]:
    found = server.client.get("/exports", params={"project": project})
    assert found.status_code == 200, found.text
    exports: list[dict[str, object]] = found.json()["exports"]
    return exports


# -- the engine alone --------------------------------------------------------------------------

NO_NUMPY = textwrap.dedent('''
    import asyncio, importlib.abc, json, sys, time
    from pathlib import Path

    BLOCKED = {"numpy", "scipy", "soundfile", "pyebur128", "matplotlib"}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed here")
            return None

    sys.meta_path.insert(0, Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]

    import httpx
    from pydantic import BaseModel, ConfigDict
    from agentbox import register_event_type
    from agentbox.config import AgentBinding, Settings
    from agentbox.http.app import create_app
    from agentbox.signing import sign_headers

    class Ping(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int

    register_event_type("demo.ping", Ping)

    async def pong(event, ctx):
        return {"n": event.payload.n + 1}

    async def main(home):
        settings = Settings(data_dir=home, config_dir=home, apps=(),
                            agents=(AgentBinding("demo.ping", "__main__:pong"),),
                            webhook_secret=("s" * 32,), callback_secret=("c" * 32,))
        app = create_app(settings, admin_token="t" * 32)
        body = json.dumps({"schema_version": "v1", "event_id": "p1",
                           "idempotency_key": "cli:demo.ping:p1", "event_type": "demo.ping",
                           "source": "cli", "timestamp": "2026-12-06T10:00:00Z",
                           "payload": {"n": 41}}).encode()
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost",
                headers={"Authorization": "Bearer " + "t" * 32}) as client:
            answer = await client.post("/webhooks/events", content=body, headers={
                "Content-Type": "application/json",
                **sign_headers("s" * 32, body, int(time.time()))})
            assert answer.status_code == 202, answer.text
            run_id = answer.json()["run_id"]
            for _ in range(400):
                run = (await client.get(f"/runs/{run_id}")).json()
                if run["status"] == "succeeded":
                    break
                await asyncio.sleep(0.05)
            home_page = await client.get("/", follow_redirects=True)
        print(json.dumps({"run": run, "home": home_page.status_code,
                          "numpy": "numpy" in sys.modules,
                          "apps": sorted(n for n in sys.modules
                                         if n.startswith(("agentbox.review",
                                                          "agentbox.archive",
                                                          "agentbox.desktop")))}))

    asyncio.run(main(Path(sys.argv[1])))
''')


def test_the_engine_runs_with_no_app_and_no_numpy(tmp_path: Path) -> None:
    """With `apps` empty and numpy (and the audio libraries) unimportable, the engine
    takes an event of a type registered beside it, runs its agent and serves its pages:
    nothing of the review, its archive or the desktop side is imported."""
    script = tmp_path / "engine_alone.py"
    script.write_text(NO_NUMPY)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["run"]["status"] == "succeeded" and said["run"]["result"] == {"n": 42}
    assert said["home"] == 200  # the engine's own page: the runs
    assert said["numpy"] is False and said["apps"] == []


@pytest.mark.anyio
async def test_two_apps_share_the_store_and_keep_their_own_lines(tmp_path: Path,
                                                                backup_app: Path) -> None:
    """Each app's line is migrated and recorded on its own; the same line twice with
    another schema is refused."""
    from mybackup.copies import SCHEMA as BACKUP

    from agentbox.store import Schema

    store = SqliteStore(tmp_path / "agentbox.sqlite3")
    store.add_tables(SCHEMA)
    backup = store.add_tables(BACKUP)
    with pytest.raises(ValueError, match="two apps' tables on the line 'backup'"):
        store.add_tables(Schema(line="backup", package="agentbox.archive"))
    await store.open()
    try:
        await backup.write(lambda db: db.run("add_copy", {
            "run_id": "r1", "source": "/a.wav", "copy": "/b.wav", "copied_at": 1.0}))
        [row] = await backup.rows("copies", limit=5)
        assert (row["run_id"], row["copy"], row["status"]) == ("r1", "/b.wav", None)
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "agentbox.sqlite3") as conn:
        lines = sorted(conn.execute("SELECT line, version FROM agentbox_lines"))
        assert lines == [("backup", 1), *REVIEW_VERSIONS]


def test_a_schema_line_is_a_word() -> None:
    from agentbox.store import Schema

    for bad in ("", "Review", "agentbox", "two words", "x" * 41):
        with pytest.raises(ValueError, match="lowercase word"):
            Schema(line=bad, package="agentbox.archive")



def test_one_class_is_named_app_and_its_former_home_still_imports_it() -> None:
    """agentbox.apps.App is the hook (the server is AgentboxServer); agentbox.http.apps
    names the same objects for a release."""
    import ast

    import agentbox.apps
    import agentbox.http.apps

    named = [str(path.relative_to(ROOT)) for path in (ROOT / "agentbox").rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.ClassDef) and node.name == "App"]
    assert named == ["agentbox/apps.py"]
    assert agentbox.http.apps.App is agentbox.apps.App
    assert agentbox.http.apps.Host is agentbox.apps.Host


def test_no_app_reads_starlettes_app_state() -> None:
    """Apps reach the engine through their Host, never `request.app.state`."""
    readers = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "agentbox").rglob("*.py")
                     if "app.state" in path.read_text(encoding="utf-8")
                     and path.parent.name != "http")
    assert readers == []


def test_an_app_gets_the_tables_it_declares_once(tmp_path: Path) -> None:
    """`host.tables()` hands the handle of the app's `schemas` (given once, there);
    asking for another line, or for none when it has no tables, says what to do."""
    from agentbox.apps import App, Host
    from agentbox.store import Schema

    class Keeper(App):
        name = "keeper"
        schemas = (SCHEMA,)

    other = Schema(line="other", package="agentbox.archive")
    store = SqliteStore(tmp_path / "agentbox.sqlite3")
    tables = {SCHEMA.line: store.add_tables(SCHEMA)}

    def host(app: App) -> Host:
        return Host(app, settings=in_process_settings(tmp_path), store=store,
                    registry=None, dispatcher=None, clock=time.time, pages=None,  # type: ignore[arg-type]
                    api=None, receiver=None, admin_token="the-admin-token", tables=tables)  # type: ignore[arg-type]

    assert host(Keeper()).tables() is tables[SCHEMA.line]
    assert host(Keeper()).tables(SCHEMA) is tables[SCHEMA.line]
    with pytest.raises(ConfigError, match=r"line 'other', which is not in its App\.schemas"):
        host(Keeper()).tables(other)
    with pytest.raises(ConfigError, match="the app 'app' has no tables"):
        host(App()).tables()
    assert repr(host(Keeper())) == "Host('keeper')"  # the admin token stays out of logs
