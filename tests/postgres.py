"""A disposable, real PostgreSQL server for the tests (no tests in here).

`start_server()` runs `initdb` into a fresh temporary directory and starts `postgres`
on 127.0.0.1 with a free TCP port; `stop()` throws the whole cluster away. Running as
root (initdb refuses root), the server runs as the `postgres` user (else `nobody`).
`fresh_database()` / `drop_database()` give each test its own database on it.

Environment:
  AGENTBOX_TEST_DATABASE_URL   use this server instead of starting one; its user must be
                               allowed to CREATE DATABASE
  AGENTBOX_TEST_PG_BINDIR      where initdb, pg_ctl and postgres are (only there); else
                               `pg_config --bindir`, the newest /usr/lib/postgresql/*/bin,
                               or `initdb` on PATH
  AGENTBOX_TEST_REQUIRE_POSTGRES=1   fail instead of skipping when no PostgreSQL is
                               available (see skip_or_fail)
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

DATABASE_URL_ENV = "AGENTBOX_TEST_DATABASE_URL"
BINDIR_ENV = "AGENTBOX_TEST_PG_BINDIR"
REQUIRE_ENV = "AGENTBOX_TEST_REQUIRE_POSTGRES"

POSTGRES_SKIP_REASON = (
    "no PostgreSQL server for the tests: install Debian's `postgresql` package "
    "(scripts/test does it) or set "
    f"{DATABASE_URL_ENV}=postgresql://user@127.0.0.1:5432/postgres "
    "(a server whose user may CREATE DATABASE)"
)

SUPERUSER = "agentbox"
DATABASE_PREFIX = "agentbox_t_"
START_SECONDS = 60.0
STOP_SECONDS = 30.0
PORT_ATTEMPTS = 5
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "on",
    "synchronous_commit": "on",
    "max_connections": "200",
    "shared_buffers": "128MB",
    "logging_collector": "off",
}
_BINARIES = ("initdb", "pg_ctl", "postgres")
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux, 104 on the BSDs


class PostgresUnavailable(Exception):
    """No PostgreSQL binaries were found (and no AGENTBOX_TEST_DATABASE_URL is set)."""


class PostgresStartError(RuntimeError):
    """initdb or postgres failed; the message carries their output or the log's tail."""


missing: list[str] = []  # why, each time a required PostgreSQL was unavailable


def skip_or_fail(reason: str = POSTGRES_SKIP_REASON) -> NoReturn:
    """Skip the test for want of PostgreSQL, or fail it when AGENTBOX_TEST_REQUIRE_POSTGRES=1
    (conftest's terminal summary then says why the run failed). Any test that finds
    PostgreSQL unavailable should call this rather than pytest.skip."""
    import pytest  # here: scripts/capacity.py starts its server with this module, no pytest

    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        missing.append(reason)
        pytest.fail(f"{REQUIRE_ENV}=1 makes a missing PostgreSQL a failure, not a skip: "
                    f"{reason}", pytrace=False)
    pytest.skip(reason)


# -- finding the binaries -----------------------------------------------------------------


def _has_binaries(bindir: Path) -> bool:
    return all((bindir / name).is_file() for name in _BINARIES)


def _version_key(bindir: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in bindir.parent.name.split("."))
    except ValueError:
        return (-1,)


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None.

    AGENTBOX_TEST_PG_BINDIR, when set, is the only place looked at (so setting it to a
    missing directory simulates a machine without PostgreSQL).
    """
    forced = os.environ.get(BINDIR_ENV)
    if forced:
        bindir = Path(forced)
        return bindir if _has_binaries(bindir) else None
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.strip()
            if out:
                candidates.append(Path(out))
    debian = sorted((p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")),
                    key=_version_key, reverse=True)
    candidates.extend(debian[:1])
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)  # Debian symlinks into .../bin
    return next((c for c in candidates if _has_binaries(c)), None)


# -- the server ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_as_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run PostgreSQL as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresStartError("running as root, and there is neither a `postgres` nor a "
                             "`nobody` user to run PostgreSQL as (initdb refuses root)")


def _check_reachable(path: Path, user: pwd.struct_passwd) -> None:
    """Fail clearly if `user` cannot reach `path` (e.g. a 0700 root-owned parent)."""
    for directory in [path, *path.parents]:
        st = directory.stat()
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid == user.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            raise PostgresStartError(
                f"PostgreSQL runs as {user.pw_name!r}, which cannot enter {directory} "
                f"(mode {stat.filemode(st.st_mode)}); pick a base directory it can reach")


def _connect(url: str, timeout: float = 5.0) -> Any:
    import psycopg  # imported late: the rest of the suite must load without it

    return psycopg.connect(url, autocommit=True, connect_timeout=max(2, round(timeout)))


def _url_with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {url!r}")
    return parts._replace(path=f"/{name}").geturl()


def _redacted(url: str) -> str:
    """The URL without its password, as agentbox shows it (psycopg is there whenever
    a URL is used)."""
    from agentbox.store.postgres import redact

    return redact(url)


def database_name(url: str) -> str:
    return unquote(urlsplit(url).path.lstrip("/"))


class PostgresServer:
    """A throwaway cluster in its own temporary directory (data, socket and log)."""

    def __init__(self, bindir: Path, base_dir: Path | None = None) -> None:
        self.bindir = bindir
        self.base_dir = base_dir
        self.user = _run_as_user()
        self.directory: Path | None = None
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0

    # paths inside the temporary directory
    @property
    def data_dir(self) -> Path:
        return self._dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self._dir / "socket"

    @property
    def log_path(self) -> Path:
        return self._dir / "postgres.log"

    @property
    def _dir(self) -> Path:
        if self.directory is None:
            raise RuntimeError("the server has not been started")
        return self.directory

    @property
    def admin_url(self) -> str:
        """A superuser URL on the `postgres` database."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def _subprocess_args(self) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        args: dict[str, Any] = {"cwd": self._dir, "env": env}
        if self.user is not None:
            env.update(HOME=self.user.pw_dir, USER=self.user.pw_name, LOGNAME=self.user.pw_name)
            args.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        return args

    def _run(self, command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False, **self._subprocess_args())

    def start(self) -> PostgresServer:
        began = time.monotonic()
        self.directory = Path(tempfile.mkdtemp(prefix="agentbox-pg-", dir=self.base_dir))
        try:
            if self.user is not None:
                os.chown(self.directory, self.user.pw_uid, self.user.pw_gid)
                _check_reachable(self.directory, self.user)
            self.socket_dir.mkdir(mode=0o700)
            if self.user is not None:
                os.chown(self.socket_dir, self.user.pw_uid, self.user.pw_gid)
            self._initdb()
            for attempt in range(PORT_ATTEMPTS):
                self.port = free_port()
                if self._launch(last_try=attempt == PORT_ATTEMPTS - 1):
                    break
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _initdb(self) -> None:
        command = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-A", "trust",
                   "-U", SUPERUSER, "--encoding", "UTF8", "--no-locale", "--no-sync"]
        result = self._run(command, timeout=120)
        if result.returncode != 0:
            raise PostgresStartError(
                f"initdb failed with exit status {result.returncode}"
                f"{f' (as user {self.user.pw_name})' if self.user else ''}:\n"
                f"$ {' '.join(command)}\n{result.stdout}{result.stderr}")

    def _launch(self, last_try: bool) -> bool:
        """Start postgres on self.port and wait until it takes connections.

        False when the port was taken meanwhile (the caller tries another one)."""
        settings = {**SERVER_SETTINGS, "port": str(self.port),
                    "unix_socket_directories": str(self.socket_dir)}
        socket_path = self.socket_dir / f".s.PGSQL.{self.port}"
        if len(os.fsencode(socket_path)) > _SOCKET_PATH_MAX:
            raise PostgresStartError(f"socket path too long for the OS: {socket_path}")
        command = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            command += ["-c", f"{key}={value}"]
        import psycopg

        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, **self._subprocess_args())
        deadline = time.monotonic() + START_SECONDS
        while True:
            status = self.process.poll()
            if status is not None:
                self.process = None
                with open(self.log_path, "rb") as log:
                    log.seek(offset)
                    new = log.read().decode(errors="replace")
                if "Address already in use" in new and not last_try:
                    return False
                raise PostgresStartError(
                    f"postgres exited with status {status} while starting on port "
                    f"{self.port}; the end of its log:\n{self.log_tail()}")
            try:
                with _connect(self.admin_url, timeout=2) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError as exc:  # refused, or "starting up"
                if time.monotonic() > deadline:
                    raise PostgresStartError(
                        f"postgres did not accept connections on 127.0.0.1:{self.port} "
                        f"within {START_SECONDS:.0f} s (last error: {exc}); "
                        f"the end of its log:\n{self.log_tail()}") from exc
            time.sleep(0.02)

    def crash(self) -> None:
        """Stop the server as a crash would (`pg_ctl stop -m immediate`: no shutdown
        checkpoint, the next start recovers from the WAL), keeping its data."""
        process, self.process = self.process, None
        assert process is not None, "the server is not running"
        self._run([str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data_dir),
                   "-m", "immediate", "-w", "-t", str(int(STOP_SECONDS))],
                  timeout=STOP_SECONDS + 5)
        process.wait(STOP_SECONDS)

    def relaunch(self) -> None:
        """Start the crashed server again, on its port, with its data."""
        self._launch(last_try=True)

    def stop(self) -> None:
        """Stop the server (immediate: the data is thrown away) and remove its directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._run([str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data_dir),
                           "-m", "immediate", "-w", "-t", str(int(STOP_SECONDS))],
                          timeout=STOP_SECONDS + 5)
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_SECONDS)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_server(base_dir: Path | None = None, bindir: Path | None = None) -> PostgresServer:
    """Initialise and start a throwaway server in a new temporary directory under
    `base_dir` (default: the system's temporary directory). Raises PostgresUnavailable
    when no binaries are found, PostgresStartError when they fail."""
    bindir = bindir or find_bindir()
    if bindir is None:
        raise PostgresUnavailable(POSTGRES_SKIP_REASON)
    return PostgresServer(bindir, base_dir).start()


@contextlib.contextmanager
def open_admin_url() -> Iterator[str]:
    """The admin URL of AGENTBOX_TEST_DATABASE_URL's server, else of a server started
    here (and stopped on exit)."""
    external = os.environ.get(DATABASE_URL_ENV)
    if external:
        try:
            with _connect(external) as conn:
                conn.execute("SELECT 1")
        except Exception as exc:
            raise PostgresStartError(
                f"cannot connect to {DATABASE_URL_ENV}={_redacted(external)}: {exc}") from exc
        yield external
        return
    with start_server() as server:
        yield server.admin_url


# -- databases ----------------------------------------------------------------------------


def fresh_database(admin_url: str) -> str:
    """Create an empty database `agentbox_t_<hex>` and return its URL."""
    from psycopg import sql

    name = f"{DATABASE_PREFIX}{uuid.uuid4().hex}"
    with _connect(admin_url) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except Exception as exc:
            raise RuntimeError(f"CREATE DATABASE failed on {_redacted(admin_url)} (the tests "
                               f"need a user that may create databases): {exc}") from exc
    return _url_with_database(admin_url, name)


def drop_database(admin_url: str, url: str) -> None:
    """Drop the database `url` names, first ending every session connected to it."""
    from psycopg import sql

    name = database_name(url)
    if not name.startswith(DATABASE_PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not made by fresh_database()")
    with _connect(admin_url) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        # DROP DATABASE itself waits (up to 5 s) for the terminated sessions to go
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
