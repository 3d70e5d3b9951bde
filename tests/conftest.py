"""Shared fixtures: a real `agentbox serve` subprocess on 127.0.0.1 and a signing client,
a real, disposable PostgreSQL server (`postgres_admin_url`, `postgres_url`), and the
real app in the test's own process over httpx's ASGI transport (`box`).

Two tiers. A test that starts a server subprocess, Chromium, PostgreSQL, the soak
or a kill -9 is marked `slow`: by the fixtures it uses (SLOW_FIXTURES), else by
an explicit mark. `scripts/test -m "not slow"` runs the rest, the fast core, in
well under a minute; `scripts/test` runs everything. A test of the fast tier that
starts such a process anyway fails and says to mark it (`_slow_processes_refused`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

import agentbox.review.contract  # noqa: F401 - the review's event types, as its app registers them
from agentbox.config import Settings, load_settings, page_name
from agentbox.http.app import AgentboxServer, create_app
from agentbox.signing import sign_headers
from tests import postgres

ROOT = Path(__file__).resolve().parents[1]
SECRET = "integration-test-secret"
TEST_AGENT = "tests.support.agents:scripted"
STARTUP_SECONDS = 20.0
ADMIN_TOKEN = "in-process-admin-token"
SERVER_ADMIN_TOKEN = "server-admin-token-of-the-tests"  # a Server's user's (see its start)
TERMINAL = ("succeeded", "failed_permanent", "dead_lettered")

# -- the two tiers ------------------------------------------------------------------------

# A test that uses one of these (directly or through another fixture) is slow: each
# starts a server subprocess, Chromium or PostgreSQL.
SLOW_FIXTURES = frozenset({"server", "server_factory", "postgres_url", "postgres_admin_url",
                           "browser", "page", "studio"})
# A parameter value that means "on PostgreSQL" (the store suite picks its engine by one).
POSTGRES_PARAMS = frozenset({"postgresql", "postgres"})
# What the fast tier must not start: found in a subprocess's command line.
SLOW_PROGRAMS = frozenset({"chromium", "chromium-browser", "chrome", "initdb", "pg_ctl",
                           "postgres", "pg_ctlcluster"})


# Test modules whose module-scoped fixture is costly to make: the one-file build
# (`executable`), Chromium (`browser`), a server with reviewed exports (`studio`).
# With the tests in several processes (scripts/test: pytest-xdist, -n 2), each of
# these modules runs whole in one process, so each fixture is made once, as in a
# run in one process; every other test goes to whichever process is free.
SHARED_MODULES = frozenset({"tests/test_build.py", "tests/test_page.py",
                            "tests/test_page_reviews.py", "tests/test_real_music.py",
                            "tests/test_stage_question.py"})


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: only when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Test by test to the first free worker, but SHARED_MODULES whole to one.
    (xdist's own `--dist loadgroup` would do it by mark, but under pytest 9 it can no
    longer rename the test ids it groups by.) Other --dist modes are left to xdist."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedModulesTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_MODULES else nodeid

    return SharedModulesTogether(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """A pytest started with SIGINT ignored (in the background of a shell script, as
    `cmd &` does) passes that on to the programs its tests run: a child would survive
    the Ctrl-C a test sends it (test_portable). Give this process (and each xdist
    worker) Python's own handler, so children start with the default again."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None)
        on_postgres = params is not None and any(
            isinstance(value, str) and value in POSTGRES_PARAMS
            for value in params.params.values())
        if (SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or on_postgres
                or item.get_closest_marker("postgres") is not None):
            item.add_marker(pytest.mark.slow)
    if config.getoption("core"):  # the core tier is part of the fast one
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]


# The core tier (`--core`): the fast tier's tests of the receiver, the API and the page
# in process, the store on SQLite, signatures, the event contract, run states,
# configuration and the tiers' own guard. Only these files are even imported, so
# it runs in seconds; the fast tier (-m "not slow") adds the dispatcher, the clock,
# callbacks' rules, the mix review's measurements, the portable layer and the rest.
CORE_TESTS = ("store/", "test_signing.py", "test_events.py", "test_runs.py",
              "test_config.py", "test_receiver_inprocess.py", "test_api_inprocess.py",
              "test_page_inprocess.py", "test_tiers.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--core", action="store_true", default=False,
                     help="run only the core tier: the fast tier's tests of the receiver, "
                          "API and page in process, the store on SQLite, signatures, events "
                          "(tests/conftest.py CORE_TESTS)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --core, test files outside CORE_TESTS are not collected (nor imported)."""
    if not config.getoption("core") or not collection_path.name.startswith("test_"):
        return None
    try:
        relative = collection_path.relative_to(Path(__file__).parent).as_posix()
    except ValueError:
        return None
    if collection_path.is_dir():
        return None
    return not relative.startswith(CORE_TESTS)


def slow_command(args: Any) -> str | None:
    """What a command line starts that the fast tier must not, or None."""
    argv = [str(arg) for arg in args] if isinstance(args, Sequence) and not isinstance(
        args, str | bytes) else str(args).split()
    if not argv:
        return None
    for arg in argv:  # the program, or one a wrapper runs (runuser -u postgres -- pg_ctl)
        if Path(arg).name in SLOW_PROGRAMS:
            return Path(arg).name
    for i in range(len(argv) - 2):
        if argv[i:i + 2] == ["-m", "agentbox"] and argv[i + 2] == "serve":
            return "agentbox serve"
    if any("playwright" in arg for arg in argv[:3]):
        return "the Playwright driver (Chromium)"
    return None


@pytest.fixture(autouse=True)
def _slow_processes_refused(request: pytest.FixtureRequest,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """In a test not marked slow, starting a server, Chromium or PostgreSQL fails the
    test: so that `-m "not slow"` stays fast, and a new test gets its mark."""
    if request.node.get_closest_marker("slow") is not None:
        return
    real = subprocess.Popen

    class Refusing(real):  # type: ignore[valid-type,misc]
        def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
            started = slow_command(args)
            if started is not None:
                pytest.fail(f"{request.node.nodeid} starts {started}: mark it "
                            "@pytest.mark.slow (or use a fixture in SLOW_FIXTURES)",
                            pytrace=False)
            super().__init__(args, *rest, **options)

    monkeypatch.setattr(subprocess, "Popen", Refusing)



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(condition: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.02) -> Any:
    """Poll `condition` until it returns something truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(condition: Callable[[], Any], timeout: float, what: str,
                           interval: float = 0.01) -> Any:
    """`wait_until` for a test on the event loop, which goes on serving the app while
    it waits; `condition` may answer an awaitable (interval 0: every loop turn)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def make_event(event_id: str | None = None, project_id: str = "ok", source: str = "studio",
               event_type: str = "session.exported", **extra: Any) -> dict[str, Any]:
    event_id = event_id or uuid.uuid4().hex
    event = {
        "schema_version": "v1",
        "event_id": event_id,
        "idempotency_key": f"{source}:{event_type}:{event_id}",
        "event_type": event_type,
        "source": source,
        "timestamp": "2026-07-27T15:42:00Z",
        "payload": {"project_id": project_id, "mix_url": "/tmp/mix.wav"},
    }
    event.update(extra)
    return event


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


class AdminToken(httpx.Auth):
    """The admin token of a server's user as a Bearer token, on each request that names
    none of its own: read when asked (the server makes its file at its first start)."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self.token = token

    def auth_flow(self, request: httpx.Request) -> Iterator[httpx.Request]:
        token = None if "authorization" in request.headers else self.token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


class Server:
    """A real agentbox process. Data and config live in `home`, which survives restarts.
    Its `client` is the user's own: it sends the admin token (the page and API need it
    on loopback too); `anonymous` is another program, or another account, without it."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.journal = home / "journal.jsonl"
        self.log_path = home / "server.log"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")},
            "PYTHONPATH": str(ROOT),
            "XDG_CONFIG_HOME": str(home / "config"),
            "AGENTBOX_DATA_DIR": str(home / "data"),
            "AGENTBOX_WEBHOOK_SECRET": SECRET,
            "AGENTBOX_AGENTS": f"session.exported={TEST_AGENT}",
            "AGENTBOX_RETRY_BASE_SECONDS": "0.05",
            "AGENTBOX_RETRY_MAX_SECONDS": "0.2",
            "AGENTBOX_TEST_JOURNAL": str(self.journal),
            "AGENTBOX_NOTIFY": "0",  # no desktop notifications from tests (but their own)
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url, timeout=30,
                                   auth=AdminToken(self.admin_token))
        self.anonymous = httpx.Client(base_url=self.url, timeout=30)

    def admin_token(self) -> str | None:
        """The token the server's user holds (AGENTBOX_ADMIN_TOKEN, else its file)."""
        given = self.env.get("AGENTBOX_ADMIN_TOKEN")
        path = Path(self.env["XDG_CONFIG_HOME"]) / "agentbox" / "admin_token"
        return given or (path.read_text().strip() if path.exists() else None)

    def page_name(self) -> str:
        """The page's private host name, kept by the server (made at its first start)."""
        path = Path(self.env["XDG_CONFIG_HOME"]) / "agentbox" / "page_name"
        return path.read_text().strip()

    def browser(self) -> httpx.Client:
        """A browser without the admin token at the page's private name: httpx resolves
        no name under .localhost (Chromium does), so it goes to 127.0.0.1 and names the
        page in its Host header. Give it `on_page(link)` for a link of that name."""
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Host": f"{self.page_name()}:{self.port}"})

    def on_page(self, link: str) -> str:
        """The path and query of a link on the page's private name (for `browser`)."""
        prefix = f"http://{self.page_name()}:{self.port}/"
        assert link.startswith(prefix), link
        return "/" + link.removeprefix(prefix)

    def login_link(self) -> str:
        """A one-time login link to the page (as `agentbox open` asks for one)."""
        answer = self.client.post("/login-links")
        assert answer.status_code == 201, answer.text
        link: str = answer.json()["url"]
        return link

    def start(self, ready_path: str = "/healthz") -> Server:
        """Start the server; ready once `ready_path` answers 200. Its user's admin
        token is SERVER_ADMIN_TOKEN unless one is kept already (as `agentbox token`
        would print it), so that browsers can send it (tests.support.browser)."""
        token_file = Path(self.env["XDG_CONFIG_HOME"]) / "agentbox" / "admin_token"
        if not token_file.exists():
            token_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            token_file.write_text(SERVER_ADMIN_TOKEN + "\n")
            token_file.chmod(0o600)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agentbox", "serve", "--port", str(self.port)],
                env=self.env, stdout=log, stderr=log, cwd=self.home,
            )
        wait_until(lambda: self._ready(ready_path), STARTUP_SECONDS,
                   f"agentbox on {self.url} to start")
        return self

    def _ready(self, path: str) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"agentbox exited with {self.process.returncode}:\n"
                                 + self.log_path.read_text())
        try:
            return self.client.get(path).status_code == 200
        except httpx.TransportError:
            return False

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def post(self, event: dict[str, Any] | bytes, secret: str = SECRET,
             timestamp: int | None = None, headers: dict[str, str] | None = None
             ) -> httpx.Response:
        body = event if isinstance(event, bytes) else encode(event)
        signed = sign_headers(secret, body, int(time.time()) if timestamp is None else timestamp)
        return self.client.post("/webhooks/events", content=body, headers={
            "Content-Type": "application/json", **signed, **(headers or {})})

    def csrf(self) -> str:
        """The CSRF token the status page's forms carry."""
        page = self.client.get("/ui/dead-letters").text
        return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.client.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_terminal(self, run_id: str, timeout: float = 20) -> dict[str, Any]:
        def terminal() -> dict[str, Any] | None:
            run = self.run(run_id)
            return run if run["status"] in ("succeeded", "failed_permanent",
                                            "dead_lettered") else None
        result: dict[str, Any] = wait_until(terminal, timeout, f"run {run_id} to finish")
        return result

    def journal_lines(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        lines = self.journal.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.client.close()
        self.anonymous.close()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(env: dict[str, str] | None = None, home: Path | None = None) -> Server:
        server = Server(home or tmp_path, env)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def server(server_factory: Callable[..., Server]) -> Server:
    return server_factory().start()


# -- PostgreSQL ---------------------------------------------------------------------------


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note a required PostgreSQL that was missing from the test's own failure, so
    that the summary below says it also when the test ran in another process (xdist),
    whose `postgres.missing` this process never sees."""
    prefix = f"{postgres.REQUIRE_ENV}=1 makes a missing PostgreSQL a failure, not a skip: "
    if report.failed and not postgres.missing and prefix in report.longreprtext:
        postgres.missing.append(report.longreprtext.split(prefix, 1)[1].strip())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if postgres.missing:
        terminalreporter.write_sep("=", "PostgreSQL required but unavailable", red=True)
        terminalreporter.write_line(
            f"{postgres.REQUIRE_ENV}=1, so the tests that need PostgreSQL failed instead of "
            f"being skipped: {postgres.missing[0]}", red=True, bold=True)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """A superuser URL on a PostgreSQL server: AGENTBOX_TEST_DATABASE_URL's, else one
    started for this session (on first use) and stopped at its end."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        postgres.skip_or_fail("the PostgreSQL tests need psycopg: pip install 'psycopg[binary]'")
    if not os.environ.get(postgres.DATABASE_URL_ENV) and postgres.find_bindir() is None:
        postgres.skip_or_fail()
    with postgres.open_admin_url() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """The URL of a new, empty database, dropped after the test."""
    url = postgres.fresh_database(postgres_admin_url)
    yield url
    postgres.drop_database(postgres_admin_url, url)


def in_process_settings(tmp_path: Path, **environ: str) -> Settings:
    """Settings for an app run in the test's own process: one agent slot, the
    test agents. (For what a real server cannot show: a request cancelled at a
    chosen moment, an injected clock, a bug.)"""
    return load_settings(environ={"AGENTBOX_DATA_DIR": str(tmp_path / "data"),
                                  "AGENTBOX_WEBHOOK_SECRET": SECRET,
                                  "AGENTBOX_AGENTS": "session.exported=" + TEST_AGENT,
                                  "AGENTBOX_CALLBACK_SECRET": "callback-secret",
                                  "AGENTBOX_WORKER_CONCURRENCY": "1",
                                  "AGENTBOX_NOTIFY": "0", **environ},
                         overrides={"config_dir": tmp_path / "config"})


# -- the app in process -------------------------------------------------------------------


class InProcess:
    """The real app (`create_app`, its lifespan run: store, dispatcher, deliverer) in
    the test's own process on a temporary SQLite file, reached over
    `httpx.ASGITransport` at http://localhost: no socket, no subprocess.
    For the fast tier; what needs a real socket or a real process stays with `Server`."""

    def __init__(self, app: AgentboxServer, client: httpx.AsyncClient, settings: Settings) -> None:
        self.app, self.client, self.settings = app, client, settings
        self.token = ADMIN_TOKEN

    def anonymous(self, address: str = "127.0.0.1") -> httpx.AsyncClient:
        """A client without the admin token (another account, another program), from
        `address`, at the same app; the caller closes it."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app,
                                                               client=(address, 5000)),
                                 base_url="http://localhost", timeout=30)

    def browser(self) -> httpx.AsyncClient:
        """A browser without the admin token at the page's private name (where a session
        is made and taken on loopback); the caller closes it."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app,
                                                               client=("127.0.0.1", 5000)),
                                 base_url=f"http://{page_name(self.settings)}", timeout=30)

    async def post(self, event: dict[str, Any] | bytes, secret: str = SECRET,
                   timestamp: int | None = None, headers: dict[str, str] | None = None
                   ) -> httpx.Response:
        body = event if isinstance(event, bytes) else encode(event)
        signed = sign_headers(secret, body, int(time.time()) if timestamp is None else timestamp)
        return await self.client.post("/webhooks/events", content=body, headers={
            "Content-Type": "application/json", **signed, **(headers or {})})

    async def run(self, run_id: str, history: bool = False) -> dict[str, Any]:
        response = await self.client.get(f"/runs/{run_id}" + ("?history=1" if history else ""))
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def wait_status(self, run_id: str, *statuses: str, timeout: float = 20
                          ) -> dict[str, Any]:
        """The run once its status is one of `statuses` (default: any terminal one)."""
        wanted = statuses or TERMINAL

        async def reached() -> dict[str, Any] | None:
            run = await self.run(run_id)
            return run if run["status"] in wanted else None

        found: dict[str, Any] = await wait_until_async(
            reached, timeout, f"run {run_id} to be {' or '.join(wanted)}")
        return found

    async def csrf(self) -> str:
        """The CSRF token the status page's forms carry."""
        page = (await self.client.get("/ui/dead-letters")).text
        return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


@contextlib.asynccontextmanager
async def in_process(tmp_path: Path, **environ: str) -> AsyncIterator[InProcess]:
    """Start the app in this process with `in_process_settings` (plus quick retries)
    and `environ`; stop it (its real shutdown) when the block ends."""
    settings = in_process_settings(tmp_path, **{"AGENTBOX_RETRY_BASE_SECONDS": "0.05",
                                                "AGENTBOX_RETRY_MAX_SECONDS": "0.2",
                                                "AGENTBOX_SHUTDOWN_GRACE_SECONDS": "1",
                                                **environ})
    app = create_app(settings, admin_token=ADMIN_TOKEN)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost",
            timeout=30, auth=AdminToken(lambda: ADMIN_TOKEN)) as client:
        yield InProcess(app, client, settings)


@pytest.fixture
def anyio_backend() -> str:
    """`@pytest.mark.anyio` tests run on asyncio, as agentbox does."""
    return "asyncio"


@pytest.fixture
async def box(tmp_path: Path, anyio_backend: str) -> AsyncIterator[InProcess]:
    """The app in process with the default test settings (see `InProcess`)."""
    async with in_process(tmp_path) as app:
        yield app
