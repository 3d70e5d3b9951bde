"""The manual kept honest (as Datasette's tests/test_docs.py keeps its settings and
hooks documented): every setting, CLI command and option, and HTTP path is in
agentbox/docs/ in its recognisable form, and everything documented in that form
exists; every link of the README and the manual leads somewhere; the README stays
short. Then the manual itself: served at /docs behind the page's rules, printed by
`agentbox docs`.

The documented forms (internals.md, "This manual", says how to extend them):
- configuration.md: the settings tables, the engine's and one per app's section, a
  row per `AGENTBOX_*` variable with its file key (or "environment only");
- cli.md: the commands table, a row per command with its options as code spans;
- api.md: the paths table, a row per method and path.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agentbox import config, manual
from agentbox.apps import api_document, load_apps
from agentbox.cli import main
from agentbox.config import Settings
from agentbox.http.app import create_app
from tests.conftest import (
    ADMIN_TOKEN,
    ROOT,
    InProcess,
    Server,
    in_process,
    in_process_settings,
)

DOCS = ROOT / "agentbox" / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250
# Settings fields that are worked out, not set: where the secrets were read from, and
# what was said beyond the engine's settings (the apps', read through Settings.of).
DERIVED_SETTINGS = {"webhook_secret_file", "given"}
ENV_VARIABLE = re.compile(r"AGENTBOX_[A-Z0-9_]*[A-Z0-9]")
CODE_SPAN = re.compile(r"`([^`]+)`")
METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}


def table_rows(topic: str, header: str) -> list[list[str]]:
    """The rows of the table in `topic` whose header row starts with `header`."""
    lines = (DOCS / f"{topic}.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def the_code(cell: str) -> str:
    """A cell that is one code span: its text."""
    found = CODE_SPAN.fullmatch(cell)
    assert found, f"expected one `code span`, found {cell!r}"
    return found[1]


# -- settings ----------------------------------------------------------------------------


def documented_settings() -> dict[str, str]:
    """configuration.md's settings tables: variable -> file key ("" if environment only),
    an app's as `section.key` (its table's header says `key in [section]`)."""
    found = {}
    for section in ("", *app_sections()):
        header = f"variable | key in [{section}]" if section else "variable | file key"
        for row in table_rows("configuration", header):
            key = "" if row[1] == "environment only" else the_code(row[1])
            found[the_code(row[0])] = f"{section}.{key}" if section and key else key
    return found


def app_sections() -> dict[str, set[str]]:
    """The default apps' settings, by section (importing the apps registers them; an
    app a test imported in this process, such as the manual's, is not agentbox's)."""
    config.import_apps(config.DEFAULT_APPS)
    found: dict[str, set[str]] = {}
    for kind in config.registered_settings():
        if kind.__module__.split(".")[0] != "agentbox":
            continue
        found.setdefault(config.section_of(kind), set()).update(
            field.name for field in dataclasses.fields(kind))
    return found


def settable() -> dict[str, str]:
    """Every setting load_settings reads from the file and the environment: its name ->
    its file key (the engine's at the top, an app's in its section)."""
    found = {name: name for name in config._SETTABLE}
    for section, names in app_sections().items():
        found.update({name: f"{section}.{name}" for name in names})
    return found


def environment_only() -> set[str]:
    """Variables the package reads by name beside its settings (AGENTBOX_URL, ...):
    every `AGENTBOX_*` string in its source that is no setting's variable."""
    named: set[str] = set()
    for path in (ROOT / "agentbox").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named.update(ENV_VARIABLE.findall(node.value))
    return named - {config.env_name(name) for name in settable()}


def test_every_settings_field_is_settable_or_known_to_be_derived() -> None:
    fields = {field.name for field in dataclasses.fields(config.Settings)}
    assert fields - set(config._SETTABLE) == DERIVED_SETTINGS, (
        "a new Settings field: make it settable (config.py) or name it in DERIVED_SETTINGS")
    assert set(config._SETTABLE) <= fields | {"agents"}


def test_every_setting_is_in_the_settings_table_with_its_file_key() -> None:
    documented = documented_settings()
    for name, key in sorted(settable().items()):
        variable = config.env_name(name)
        assert variable in documented, f"{variable} is not in configuration.md's table"
        assert documented[variable] == key, (
            f"{variable}'s file key should be `{key}`, not {documented[variable]!r}")


def test_every_variable_the_package_reads_is_documented_as_environment_only() -> None:
    documented = documented_settings()
    for variable in sorted(environment_only()):
        assert variable in documented, f"{variable} is read by agentbox but not documented"
        assert documented[variable] == "", f"{variable} is environment only"


def test_every_documented_variable_exists() -> None:
    known = {config.env_name(name) for name in settable()} | environment_only()
    unknown = set(documented_settings()) - known
    assert not unknown, f"configuration.md documents variables agentbox does not read: {unknown}"


# -- the command line --------------------------------------------------------------------


def commands(command: click.Command = main, path: str = "agentbox"
             ) -> Iterator[tuple[str, click.Command]]:
    if not command.hidden:
        yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, f"{path} {name}")


def options(command: click.Command) -> set[str]:
    """A command's options by their longest name (`--header`, not `-H`); --help aside."""
    found = {max(param.opts, key=len) for param in command.params
             if isinstance(param, click.Option) and not param.hidden}
    return found | ({"--help"} if command is main else set())


def documented_commands() -> dict[str, set[str]]:
    """cli.md's commands table: command -> the options its row names."""
    rows = table_rows("cli", "command | arguments and options")
    return {the_code(row[0]): {span.split()[0] for span in CODE_SPAN.findall(row[1])
                               if span.startswith("-")}
            for row in rows}


def test_every_command_is_in_the_commands_table_with_every_option() -> None:
    documented = documented_commands()
    for path, command in commands():
        assert path in documented, f"`{path}` is not in cli.md's commands table"
        missing = options(command) - documented[path]
        assert not missing, f"`{path}`: options not in cli.md: {sorted(missing)}"


def test_every_documented_command_and_option_exists() -> None:
    real = dict(commands())
    for path, documented in documented_commands().items():
        assert path in real, f"cli.md documents `{path}`, which agentbox does not have"
        every_name = {name for param in real[path].params
                      for name in (*param.opts, *param.secondary_opts)  # --no-wait too
                      if isinstance(param, click.Option)} | {"--help", "-h"}
        assert documented <= every_name, (
            f"cli.md documents options of `{path}` it does not take: "
            f"{sorted(documented - every_name)}")


# -- the HTTP API ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    """Every (method, path) of the real app (built, not started)."""
    settings = in_process_settings(tmp_path_factory.mktemp("routes"))
    app = create_app(settings, admin_token=ADMIN_TOKEN)
    return {(method, re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path))  # {project:path}
            for route in app.routes
            for method in getattr(route, "methods", None) or () if method in METHODS}


def documented_paths() -> set[tuple[str, str]]:
    return {(the_code(row[0]), the_code(row[1]))
            for row in table_rows("api", "method | path")}


def test_every_route_is_in_the_paths_table(routes: set[tuple[str, str]]) -> None:
    missing = routes - documented_paths()
    assert not missing, f"routes not in api.md's paths table: {sorted(missing)}"


def test_every_documented_path_is_served(routes: set[tuple[str, str]]) -> None:
    unknown = documented_paths() - routes
    assert not unknown, f"api.md documents paths agentbox does not serve: {sorted(unknown)}"


def test_every_path_of_the_openapi_document_is_documented() -> None:
    documented = {path for _, path in documented_paths()}
    missing = set(api_document(load_apps(Settings()))["paths"]) - documented
    assert not missing, f"OpenAPI paths not in api.md: {sorted(missing)}"


# -- links and the README -----------------------------------------------------------------


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def links(path: Path) -> Iterator[str]:
    """Every link and image target of a Markdown file."""
    for token in manual.markdown().parse(path.read_text(encoding="utf-8")):
        for child in token.children or []:
            if child.type == "link_open":
                yield str(child.attrGet("href"))
            elif child.type == "image":
                yield str(child.attrGet("src"))


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: path.name)
def test_every_link_leads_to_a_file_and_heading_that_exist(path: Path) -> None:
    for href in links(path):
        if re.match(r"[a-z]+:", href):
            continue  # http(s)://, mailto: (not fetched: the tests stay on this machine)
        target, _, anchor = href.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.is_file(), f"{path.name}: {href} leads to no file"
        if path.parent == DOCS:  # the manual is served alone: no links out of it
            assert file.parent == DOCS, f"{path.name}: {href} leaves agentbox/docs/"
        if anchor:
            assert file.suffix == ".md", f"{path.name}: {href}: an anchor in a non-Markdown file"
            assert anchor in manual.anchors(file.read_text(encoding="utf-8")), (
                f"{path.name}: {href}: no such heading in {file.name}")


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    opening = "\n".join(lines[:30])
    assert "\nscripts/run " in opening and "\nscripts/test " in opening


def test_the_index_lists_every_topic_file_once() -> None:
    listed = [topic.name for topic in manual.topics()]
    files = sorted(path.stem for path in DOCS.glob("*.md") if path.stem != manual.INDEX)
    assert sorted(listed) == files and len(set(listed)) == len(listed)


# -- the manual, rendered and printed ------------------------------------------------------


def test_headings_get_the_ids_a_repository_view_gives_them() -> None:
    seen: dict[str, int] = {}
    assert manual.slug("Against the peers (`--peers`)", seen) == "against-the-peers---peers"
    assert manual.slug("`POST /webhooks/events`", seen) == "post-webhooksevents"
    assert manual.slug("The review's speed", seen) == "the-reviews-speed"
    assert [manual.slug("Runs", seen), manual.slug("Runs", seen)] == ["runs", "runs-1"]
    assert manual.heading_texts("## The `agentbox watch DIR` *loop*") == [
        (2, "The agentbox watch DIR loop")]


def test_raw_html_in_the_markdown_is_shown_as_text() -> None:
    html = manual.markdown().render('<script>alert(1)</script>\n\n[x](javascript:alert(1))\n')
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'href="javascript:' not in html


@pytest.mark.anyio
async def test_the_contents_list_every_topic_with_its_line(box: InProcess) -> None:
    page = await box.client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for topic in manual.topics():
        assert f'href="/docs/{topic.name}"' in page.text
        assert str(manual.markdown().renderInline(topic.summary)) in page.text


@pytest.mark.anyio
async def test_a_topic_is_rendered_with_its_sections_and_working_links(box: InProcess) -> None:
    page = await box.client.get("/docs/events")
    assert page.status_code == 200
    assert "<h1>Events and callbacks</h1>" in page.text
    assert 'aria-label="On this page"' in page.text
    assert '<h2 id="run-states">Run states</h2>' in page.text
    assert 'href="#run-states"' in page.text  # the table of contents
    assert 'href="/docs/api"' in page.text  # a link to another topic, rewritten
    assert 'href="/docs/getting-started#install-hook-up-your-daw-see-the-review"' in page.text
    assert ".md" not in "".join(re.findall(r'href="([^"]*)"', page.text))
    assert "<pre tabindex=\"0\"><code" in page.text and "<table>" in page.text
    # nothing from elsewhere: the page's own script and style only, no CDN
    sources = re.findall(r'<(?:script src|link rel="stylesheet" href)="([^"]*)"', page.text)
    assert sources and all(src.startswith("/ui/static/") for src in sources), sources
    assert "https://" not in page.text.split("<article")[0] and "<style" not in page.text


@pytest.mark.anyio
async def test_an_unknown_topic_is_a_404_with_the_list(box: InProcess) -> None:
    for name in ("nope", "cli.py", "index2", "Review"):
        page = await box.client.get(f"/docs/{name}")
        assert page.status_code == 404, name
        assert 'id="missing"' in page.text and 'href="/docs/review"' in page.text
    moved = await box.client.get("/docs/review.md", follow_redirects=False)
    assert moved.status_code == 301 and moved.headers["location"] == "/docs/review"
    contents = await box.client.get("/docs/index", follow_redirects=False)
    assert contents.status_code == 301 and contents.headers["location"] == "/docs"


@pytest.mark.anyio
async def test_the_manual_is_behind_the_pages_rules(box: InProcess, tmp_path: Path) -> None:
    rebound = await box.client.get("/docs/review", headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and rebound.json()["error_code"] == "host_not_allowed"
    async with in_process(tmp_path / "beyond", AGENTBOX_HOST="0.0.0.0") as beyond, \
            beyond.anonymous() as anonymous:
        for path in ("/docs", "/docs/review"):
            login = await anonymous.get(path, headers={"Accept": "text/html"})
            assert login.status_code == 401 and "Admin token needed" in login.text
        bearer = await anonymous.get(
            "/docs/review", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert bearer.status_code == 200 and "<h1>The review</h1>" in bearer.text


def test_agentbox_docs_lists_the_topics_and_prints_one() -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["docs"])
    assert listed.exit_code == 0
    for topic in manual.topics():
        assert topic.name in listed.output and topic.summary in listed.output
    shown = runner.invoke(main, ["docs", "configuration"])
    assert shown.exit_code == 0
    assert shown.output == (DOCS / "configuration.md").read_text(encoding="utf-8") + "\n"


def test_agentbox_docs_of_an_unknown_topic_says_so_and_exits_2() -> None:
    result = CliRunner().invoke(main, ["docs", "reveiw"])
    assert result.exit_code == 2
    assert "no topic named 'reveiw'" in result.output and "review" in result.output


@pytest.mark.slow
def test_the_manual_in_chromium(server: Server) -> None:
    """A reader in a real browser: from the contents to a topic, down to a section by
    its table of contents, and on to another topic by a link in the text."""
    from playwright.sync_api import expect

    from tests.support.browser import as_the_user, chromium

    with chromium() as browser:
        page = browser.new_page(**as_the_user())
        outside: list[str] = []
        page.on("request", lambda request: outside.append(request.url)
                if not request.url.startswith(server.url) else None)
        page.goto(server.url + "/")
        page.click("header >> text=Manual")
        expect(page.locator("article h1")).to_have_text("The agentbox manual")
        page.click("article >> text=Events and callbacks")
        expect(page).to_have_url(server.url + "/docs/events")
        page.click('nav.toc >> text="Run states"')
        expect(page).to_have_url(server.url + "/docs/events#run-states")
        assert page.locator("#run-states").is_visible()
        whitespace = page.locator("article pre").first.evaluate(
            "e => getComputedStyle(e).whiteSpace")
        assert whitespace == "pre"  # code blocks keep their lines
        page.click('article >> a[href="/docs/api"]')
        expect(page.locator("article h1")).to_have_text("HTTP API")
        expect(page.locator('nav.topics a[aria-current="page"]')).to_have_text("HTTP API")
        assert outside == [], f"the manual fetched from elsewhere: {outside}"


@pytest.mark.slow
def test_the_readme_s_review_is_what_agentbox_prints(server_factory: Any,
                                                     tmp_path: Path) -> None:
    """The README's test mix, made by its own command and sent as it says, prints
    the review the README shows, line for line."""
    text = README.read_text(encoding="utf-8")
    making = re.search(r'^\.venv/bin/python -c "(.+)"$', text, re.M)
    sending = re.search(r"^\.venv/bin/agentbox (send .+)$", text, re.M)
    shown = re.search(r"```text\n(mix\.wav: .+?)```", text, re.S)
    assert making and sending and shown, "the README's review example"
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    subprocess.run([sys.executable, "-c", making.group(1)], cwd=tmp_path, check=True,
                   timeout=120)
    sent = subprocess.run([sys.executable, "-m", "agentbox", *shlex.split(sending.group(1)),
                           "--url", server.url], cwd=tmp_path, env=server.env,
                          capture_output=True, text=True, timeout=180)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == shown.group(1)
