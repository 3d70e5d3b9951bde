"""`agentbox`: click commands over `agentbox.client` (what talks to a running
agentbox), the store's commands (verify, migrate, prune) and `serve`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from agentbox.signing import RECEIVER_PATH

if TYPE_CHECKING:
    from agentbox import config as cfg
    from agentbox.client import AgentboxError, Client, Refused
    from agentbox.models import Accepted, Answer, RunDetail
    from agentbox.review.answers import ReferenceOut

# The commands import what they use when they run (the client, the settings, the
# terminal's review), so that `agentbox --version` and `--help` pay for click alone
# and `agentbox runs` for the client. The defaults the help names are written here
# for that reason; tests/test_cli_start.py holds them to agentbox.config's and the client's.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
URL_ENV = "AGENTBOX_URL"

# send --wait's pace, named here as before (the client's, read when asked for).
_FROM_CLIENT = ("FOLLOW_FIRST_SECONDS", "FOLLOW_MAX_SECONDS", "FOLLOW_UNREACHABLE_SECONDS")


class _Named(click.Choice):  # type: ignore[type-arg]
    """A click.Choice of names read from the review when an option is first read or
    shown (the genres, the stages), not when the commands are defined."""

    def __init__(self, names: Callable[[], list[str]]) -> None:
        self._names = names
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._names())

    @choices.setter
    def choices(self, given: Any) -> None:
        """click.Choice's own __init__ sets them: the review's are the ones."""


def _genres() -> list[str]:
    from agentbox.review.genres import GENRES

    return list(GENRES)


def _stages(*more: str) -> Callable[[], list[str]]:
    def stages() -> list[str]:
        from agentbox.review.stage import STAGES

        return [*STAGES, *more]

    return stages


def __getattr__(name: str) -> Any:
    if name not in _FROM_CLIENT:
        raise AttributeError(f"module 'agentbox.cli' has no attribute {name!r}")
    from agentbox import client

    return getattr(client, name)


def _settings(config_file: Path | None = None, **overrides: Any) -> cfg.Settings:
    """The configuration; what another account can change refused (exit status 2)."""
    from agentbox import config as cfg
    from agentbox import ownership

    try:
        settings = cfg.load_settings(config_file, overrides=overrides)
        ownership.check(settings, config_file)
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except ownership.Untrusted as exc:
        raise Unsafe(str(exc)) from None
    return settings


DATABASE_URL_OPTION = click.option(
    "--database-url", default=None, metavar="URL",
    help="postgresql://... to share one PostgreSQL database between instances; without "
         "it, SQLite in the data dir. Prefer AGENTBOX_DATABASE_URL: a flag, password and "
         "all, shows in the process list.")


class _Commands(click.Group):
    """The commands; wherever a client meets a listener that is not the user's
    agentbox (client.NotProven), one sentence and exit status 3, as for no server."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            client = sys.modules.get("agentbox.client")  # not imported: not its error
            if client is None:
                raise
            if isinstance(exc, client.NotProven):
                raise GaveUp(str(exc)) from None
            if isinstance(exc, client.NotTrusted):
                raise Unsafe(str(exc)) from None
            raise


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agentbox")
def main() -> None:
    """agentbox: each mix you render, reviewed: is it ready, and what to fix first.

    \b
    Start it:        agentbox serve          (then http://127.0.0.1:8000/)
    Review a file:   agentbox send mix.wav --wait
    Watch a folder:  agentbox watch ~/Music/Exports
    The manual:      agentbox docs

    Underneath, a local appliance for event-driven agents: signed webhooks in,
    durable runs out (agentbox docs events)."""


@main.command()
@click.option("--host", default=None, help=f"Address to bind (default {DEFAULT_HOST}).")
@click.option("--port", type=int, default=None, help=f"Port (default {DEFAULT_PORT}).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Where the database lives (AGENTBOX_DATA_DIR).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="TOML config file (default: agentbox.toml in the config directory).")
@DATABASE_URL_OPTION
def serve(host: str | None, port: int | None, data_dir: Path | None,
          config_file: Path | None, database_url: str | None) -> None:
    """Receive webhooks, run agents, serve the API.

    It says it is ready once it listens. What keeps it from starting is said in a
    sentence, with what to change: exit status 2 for the configuration (a config
    file that does not parse, a setting that does not fit, a data directory that
    cannot be made), 1 for the rest (the port in use, the data directory served
    by another agentbox, the database unreachable)."""
    from agentbox import config as cfg
    from agentbox import portable
    from agentbox.http import server
    from agentbox.logs import capture_output, setup_logging

    try:
        settings = cfg.load_settings(config_file, overrides={
            "host": host, "port": port, "data_dir": data_dir, "database_url": database_url})
    except cfg.ConfigError as exc:
        _refuse(str(exc), EXIT_USAGE)
    _trusted(settings, config_file)
    setup_logging(settings.log_level, settings.log_format)
    capture_output(settings.log_format)
    _data_directory(settings)
    settings, app = _app(settings)
    # Recorded once this server has started (the data directory is its own then: a
    # second serve refused never touches the first's file), removed at every stop.
    recorded: list[Path | None] = []
    try:
        sockets = [found] if (found := server.listen(settings.host, settings.port)) else None
        port = found.getsockname()[1] if found else settings.port
        server.run(app, settings, sockets=sockets,
                   on_ready=lambda: recorded.append(record_address(settings, port)),
                   on_stop=lambda: forget_address(*recorded[:1]),
                   host=settings.host, port=settings.port,
                   log_config=None, access_log=False, loop=portable.EVENT_LOOP,
                   lifespan="on",
                   timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 5,
                   timeout_keep_alive=max(1, round(settings.keep_alive_seconds)))
    except (server.PortInUse, server.StartupFailed) as exc:
        _refuse(str(exc), EXIT_REFUSED, settings)
    finally:
        forget_address(*recorded[:1])


def record_address(settings: cfg.Settings, port: int) -> Path | None:
    """Say where this server listens, for the CLI and the watcher to find it
    (client.find_url): its runtime file, the user's alone. None when it cannot be
    written: the clients then go by the configuration, as before."""
    from agentbox import portable
    from agentbox.client import configured_url, runtime_file

    path = runtime_file(settings.data_dir)
    url = configured_url(dataclasses.replace(settings, port=port))
    try:
        portable.private_directory(path.parent)
        portable.write_durably(path, json.dumps({"url": url, "pid": os.getpid()}), 0o600)
    except OSError as exc:
        click.echo(f"agentbox: where it listens cannot be recorded in {path} "
                   f"({exc.strerror or type(exc).__name__}); give clients --url {url}",
                   err=True)
        return None
    return path


def forget_address(path: Path | None = None) -> None:
    """Remove this server's runtime file, unless a later server has made it its own."""
    if path is None:
        return
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if json.loads(path.read_text(encoding="utf-8"))["pid"] == os.getpid():
            path.unlink()


def _refuse(sentence: str, status: int, settings: cfg.Settings | None = None) -> NoReturn:
    """Why agentbox does not start, in a sentence on stderr (a JSON line in a JSON
    log, with the exit status); no traceback. Before the settings are read (one of
    them is what refuses), AGENTBOX_LOG_FORMAT chooses, if it is one."""
    from agentbox import config as cfg
    from agentbox.logs import refusal_line, unwrapped

    if settings is not None:
        log_format = settings.log_format
    else:
        log_format = os.environ.get("AGENTBOX_LOG_FORMAT", "auto").strip().lower()
        log_format = log_format if log_format in cfg.LOG_FORMATS else "auto"
    click.echo(refusal_line(sentence, status, log_format), file=unwrapped(sys.stderr))
    sys.exit(status)


def _trusted(settings: cfg.Settings, config_file: Path | None) -> None:
    """Nothing another account can change is served from (agentbox.ownership): the
    config file, folders, token and secret files, and the runtime folder."""
    from agentbox import ownership
    from agentbox.client import runtime_file

    try:
        ownership.check(settings, config_file)
        ownership.check_path(runtime_file(settings.data_dir).parent)
    except ownership.Untrusted as exc:
        _refuse(str(exc), EXIT_USAGE)


def _data_directory(settings: cfg.Settings) -> None:
    """The data directory, made now (its user's alone): one that cannot be is said."""
    from agentbox import portable

    try:
        portable.private_directory(settings.data_dir)
    except OSError as exc:
        _refuse(f"the data directory {settings.data_dir} cannot be made "
                f"({exc.strerror or type(exc).__name__}); choose another with --data-dir "
                "or AGENTBOX_DATA_DIR", EXIT_USAGE, settings)


def _app(settings: cfg.Settings) -> tuple[cfg.Settings, Any]:
    """The secrets, the schema brought up to date and the app; what stops them said."""
    from agentbox import config as cfg
    from agentbox import files
    from agentbox import store as st
    from agentbox.apps import schemas_of
    from agentbox.http.app import create_app
    from agentbox.store import engines

    try:
        settings, secret_path = cfg.ensure_webhook_secret(settings)
        settings, callback_secret_path = cfg.ensure_callback_secret(settings)
        token = cfg.admin_token(settings)
        # A database newer than this code stops us here (the apps' tables too).
        engines.migrate(settings, schemas_of(settings))
        app = create_app(settings, token)
    except (cfg.ConfigError, st.EngineMissing) as exc:
        _refuse(str(exc), EXIT_USAGE, settings)
    except st.StoreError as exc:
        _refuse(str(exc), EXIT_REFUSED, settings)
    except OSError as exc:  # a config or data directory that cannot be written
        _refuse(f"{exc.filename or 'a file'} cannot be written "
                f"({exc.strerror or type(exc).__name__})", EXIT_REFUSED, settings)
    for warning in files.tighten(settings):  # what an older version or a copy left open
        _at_start(settings, warning, problem=True)
    if secret_path is not None:
        _at_start(settings, f"webhook secret is in {secret_path} "
                  "(show it with: agentbox secret)")
    if callback_secret_path is not None and settings.callback_allowed + \
            settings.callback_allowed_local:
        _at_start(settings, f"callbacks are signed with the secret in {callback_secret_path} "
                  "(show it with: agentbox secret --callback)")
    return settings, app


def _at_start(settings: cfg.Settings, sentence: str, problem: bool = False) -> None:
    """A line `serve` says as it starts: to a person as `agentbox: ...`; in a JSON
    log, a JSON line as every other (a plain one stops `jq` reading the stream)."""
    from agentbox import logs

    if logs.text_lines(settings.log_format):
        click.echo(f"agentbox: {sentence}", err=True)
        return
    logger = logs.get_logger("server")
    (logger.warning if problem else logger.info)(sentence)


@main.group(invoke_without_command=True)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@click.option("--path", "show_path", is_flag=True, help="Print where the secret is kept.")
@click.option("--callback", is_flag=True,
              help="The secret callbacks are signed with, for their receivers.")
@click.pass_context
def secret(ctx: click.Context, config_file: Path | None, show_path: bool,
           callback: bool) -> None:
    """Print the webhook secret that senders sign with (agentbox serve makes it at
    its first start; with none yet, where it was looked for is said).

    \b
    Rotation without downtime:
        agentbox secret rotate   # a new secret signs; the old one still verifies
        (give senders the new secret: agentbox secret)
        agentbox secret retire   # only the new one verifies
    The same for the callback secret: agentbox secret --callback rotate (callbacks
    are then signed with both until retire).
    """
    from agentbox import config as cfg

    ctx.obj = (config_file, callback)
    if ctx.invoked_subcommand is not None:
        return
    settings = _settings(config_file)
    _secret_made(settings, config_file, callback, show_path)
    if callback:
        settings, path = cfg.ensure_callback_secret(settings)
        value = settings.callback_secret[0]
    else:
        settings, path = cfg.ensure_webhook_secret(settings)
        value = settings.webhook_secret[0]
    if show_path:
        click.echo(path if path is not None else "set by configuration, not kept in a file")
    else:
        click.echo(value)


def _secret_made(settings: cfg.Settings, config_file: Path | None, callback: bool,
                 show_path: bool) -> None:
    """Refuse to make a secret here: one made by this command, under a configuration
    the server may not share (another config file, a service's environment), signs
    what the server then refuses. Say where it was looked for instead (with --path,
    where it will be)."""
    from agentbox import config as cfg

    name = "callback" if callback else "webhook"
    if settings.callback_secret if callback else settings.webhook_secret:
        return
    kept = settings.config_dir / (cfg.CALLBACK_SECRET_FILE if callback
                                  else cfg.WEBHOOK_SECRET_FILE)
    if kept.exists():
        return
    if show_path:
        click.echo(kept)
        raise click.exceptions.Exit(0)
    variable = cfg.env_name(f"{name}_secret")
    toml = config_file or (Path(os.environ[cfg.env_name("config")])
                           if os.environ.get(cfg.env_name("config"))
                           else cfg.default_config_dir() / cfg.CONFIG_FILE_NAME)
    raise click.ClickException(
        f"no {name} secret yet. Looked in {variable} (not set), for {name}_secret in "
        f"{toml} ({'not there' if toml.exists() else 'no such file'}) and in {kept} (no "
        "such file). agentbox serve makes it there at its first start; if agentbox runs "
        "with another configuration (a service, another config file), ask with the "
        "same: agentbox secret --config FILE")


def _secret_file(chosen: tuple[Path | None, bool]) -> Path:
    from agentbox import config as cfg

    config_file, callback = chosen
    settings = _settings(config_file)
    name = "callback" if callback else "webhook"
    if settings.callback_secret if callback else settings.webhook_secret:
        raise click.ClickException(
            f"the {name} secrets come from {cfg.env_name(name + '_secret')} or the config file: "
            "rotate them there (comma separated, the new one first)")
    return settings.config_dir / (cfg.CALLBACK_SECRET_FILE if callback
                                  else cfg.WEBHOOK_SECRET_FILE)


@secret.command("rotate")
@click.pass_obj
def secret_rotate(chosen: tuple[Path | None, bool]) -> None:
    """Make a new webhook secret; the old ones keep verifying until retired."""
    from agentbox import config as cfg

    path = _secret_file(chosen)
    cfg.rotate_secret(path)
    if chosen[1]:
        click.echo(f"a new callback secret is first in {path}; restart agentbox, and callbacks "
                   "are signed with both (webhook-signature) until: agentbox secret --callback "
                   "retire")
        return
    click.echo(f"a new secret signs from now on ({path}); the old one still verifies. Give "
               "senders the new one (agentbox secret), then: agentbox secret retire")


@secret.command("retire")
@click.pass_obj
def secret_retire(chosen: tuple[Path | None, bool]) -> None:
    """Stop accepting every webhook secret but the newest."""
    from agentbox import config as cfg

    path = _secret_file(chosen)
    retired = cfg.retire_secrets(path)
    click.echo(f"retired {retired} old secret(s); only the newest verifies now")


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def token(config_file: Path | None) -> None:
    """Print the admin token that admin API calls (replay) need.

    It is AGENTBOX_ADMIN_TOKEN, else the one `serve` made at its first start in the
    config directory; this command never makes one (a token made here would not be
    the one a server started with AGENTBOX_ADMIN_TOKEN takes). With none, it says
    where it looked (exit status 1); a running agentbox that refuses the one found
    is said too."""
    from agentbox import config as cfg

    settings = _settings(config_file)
    path = settings.config_dir / cfg.ADMIN_TOKEN_FILE
    given = os.environ.get(cfg.env_name("admin_token"))
    if not given and not path.is_file():
        raise click.ClickException(
            f"no admin token yet: none in {cfg.env_name('admin_token')}, none in {path}. "
            "agentbox serve makes one there at its first start (or set "
            f"{cfg.env_name('admin_token')} for the server and here alike)")
    try:
        found = cfg.admin_token(settings)
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    refused_by = _refused_by_server(found, config_file)
    if refused_by is not None:
        where = cfg.env_name("admin_token") if given else str(path)
        raise click.ClickException(
            f"the agentbox at {refused_by} does not take the token in {where}: it was "
            f"started with another ({cfg.env_name('admin_token')} in its environment?); "
            "use that one")
    click.echo(found)


def _refused_by_server(found: str, config_file: Path | None) -> str | None:
    """The URL of the running agentbox if it answers 401 to `found`; None when it takes
    it, or when none answers (then the token is the one a server started here takes)."""
    import httpx

    try:
        url = client_url(None, config_file)
        with httpx.Client(base_url=url, timeout=2.0, trust_env=False) as http:
            answer = http.get("/runs", params={"limit": "1"},
                              headers={"Authorization": f"Bearer {found}"})
    except (click.ClickException, httpx.HTTPError):
        return None
    return url if answer.status_code == 401 else None


@main.command("config")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="TOML config file (as serve's).")
def show_config(config_file: Path | None) -> None:
    """Print every setting as `serve` would use it: the engine's, then each app's in its
    section of agentbox.toml, each with where it was set (the key in the file, the
    variable, the flag) or `default`. Secrets are never shown. A configuration `serve`
    would refuse is refused here the same way (exit status 2)."""
    from agentbox import config as cfg
    from agentbox.apps import load_apps

    try:
        settings = cfg.load_settings(config_file)
        # The apps imported (their settings are known then) and checked as serve does:
        # names, what each requires, the settings' own checks.
        running = {app.name for app in load_apps(settings)}
    except cfg.ConfigError as exc:
        _refuse(str(exc), EXIT_USAGE)
    kept = {"webhook_secret": cfg.WEBHOOK_SECRET_FILE, "callback_secret": cfg.CALLBACK_SECRET_FILE}
    for section, rows in cfg.listing(settings):
        if section:
            idle = "" if section in running else \
                f"  # not used: {cfg.env_name('apps')} does not run the app {section!r}"
            click.echo(f"\n[{section}]{idle}")
        for name, value, where in rows:
            shown = (("(set, not shown)" if value else "(not set)") if cfg.is_secret(name)
                     else _setting_value(value))
            if not value and name in kept and (settings.config_dir / kept[name]).is_file():
                # serve reads (or made) it there
                shown, where = "(set, not shown)", str(settings.config_dir / kept[name])
            click.echo(f"{name} = {shown}  # {where}")


def _setting_value(value: Any) -> str:
    """A setting's value as the file writes it (a list in brackets, a table in braces)."""
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_setting_value(item) for item in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "{" + ", ".join(f"{f.name} = {_setting_value(getattr(value, f.name))}"
                               for f in dataclasses.fields(value)
                               if getattr(value, f.name) is not None) + "}"
    return json.dumps(str(value), ensure_ascii=False)


@main.command("open")
@click.option("--url", default=None, help="agentbox's address (default: as configured).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@click.option("--print", "print_only", is_flag=True,
              help="Print the one-time link instead of opening a browser.")
def open_page(url: str | None, config_file: Path | None, print_only: bool) -> None:
    """Open the page in a browser, logged in by a one-time link (once per browser).

    The page is yours alone, not every account's on this machine: the link is
    asked of the running agentbox with your admin token, works once, within
    minutes, and leaves a session in the browser that opened it. The browser is
    given a file of yours that forwards to the link, never the link itself (any
    account can read a program's arguments); it waits up to a minute for the
    browser to use it, then removes the file."""
    from agentbox import browser

    with _client_errors(), _client(url, config_file) as client:
        if print_only:
            click.echo(client.login_link())
            return
        opened = browser.open_logged_in(client, _browser_opened)
        if opened is False:  # no browser to start: the link, to paste into one
            click.echo(client.login_link())
    if opened is None:
        raise click.ClickException(
            f"the browser did not open the page within {browser.HANDOFF_SECONDS:g} s; "
            "run agentbox open --print for a link to paste into one")


def _browser_opened(uri: str) -> bool:
    import webbrowser

    try:
        return webbrowser.open(uri)
    except webbrowser.Error:
        return False


URL_OPTION = click.option(
    "--url", default=None, metavar="URL",
    help=f"agentbox's address, e.g. http://127.0.0.1:9000 (or its {RECEIVER_PATH} "
         f"endpoint). Default: {URL_ENV}, else where the running agentbox "
         f"recorded it listens, else host and port of the config file (as serve "
         f"reads them), else {DEFAULT_URL}.")
GENRE_OPTION = click.option(
    "--genre", type=_Named(_genres), default=None,
    help="payload.genre: the music's genre, for the tonal advice (its curve, and the "
         "parts of the arrangement the notes name); it sticks to the project.")
CONFIG_OPTION = click.option("--config", "config_file", type=click.Path(path_type=Path),
                             default=None, help="TOML config file (as serve's).")


def client_url(url: str | None, config_file: Path | None = None) -> str:
    """The agentbox the client commands talk to: `--url`, else AGENTBOX_URL, else where
    the running server recorded it listens, else the host and port that `serve`
    reads from the config file (client.find_url)."""
    from agentbox.client import BadAddress, Misconfigured, NotTrusted, find_url

    try:
        return find_url(url, config_file, where="--url")
    except BadAddress as exc:
        raise click.UsageError(str(exc)) from None
    except NotTrusted as exc:
        raise Unsafe(str(exc)) from None
    except Misconfigured as exc:
        raise click.ClickException(str(exc)) from None


def _client(url: str | None, config_file: Path | None) -> Client:
    """The running agentbox; what it waits for (busy, restarting) said on stderr."""
    from agentbox.client import Client

    return Client(client_url(url, config_file), config_file=config_file, progress=_say)


def _say(message: str) -> None:
    click.echo(f"agentbox: {message}", err=True)


@contextmanager
def _client_errors() -> Iterator[None]:
    """The client's errors as the command line's: their sentence, exit status 1."""
    from agentbox.client import AgentboxError, NotProven, NotTrusted

    try:
        yield
    except NotProven as exc:
        raise GaveUp(str(exc)) from None
    except NotTrusted as exc:
        raise Unsafe(str(exc)) from None
    except AgentboxError as exc:
        raise click.ClickException(_said(exc)) from None


def _said(exc: AgentboxError) -> str:
    """An error as a person reads it: a refusal's own sentence (and its fields'),
    without the HTTP status a library's caller gets in str(exc)."""
    from agentbox.client import Refused

    if not isinstance(exc, Refused) or not exc.message:
        return str(exc)  # unreachable, say: said without the terminal's review
    from agentbox import terminal

    return terminal.line(exc.message) + _field_errors(exc)


def _field_errors(exc: Refused) -> str:
    """Each field a refusal names, on a line of its own (at most 20)."""
    from agentbox import terminal

    fields = [f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg', '')}"
              for e in exc.errors[:20]]
    return "".join(f"\n  {terminal.line(field)}" for field in fields)


# Exit statuses of `agentbox send`, for export scripts.
EXIT_OK = 0  # stored (202) or already stored (200); with --wait: the run succeeded
EXIT_REFUSED = 1  # the event was refused (4xx other than 429): fix it, do not retry
EXIT_USAGE = 2  # as click's own usage errors; serve: a configuration that does not fit
EXIT_UNAVAILABLE = 3  # agentbox unreachable, busy (429) or unavailable (503) after retries
EXIT_RUN_FAILED = 4  # --wait: the run ended failed_permanent or dead_lettered
EXIT_WAIT_TIMEOUT = 5  # --wait: the run was not finished in time


class Unsafe(click.ClickException):
    """A file of the configuration another account can change: exit status 2."""

    exit_code = EXIT_USAGE


class GaveUp(click.ClickException):
    """agentbox unreachable for good: exit status 3, as `send`'s retries running out."""

    exit_code = EXIT_UNAVAILABLE


def follow(url: str | Client, run_id: str, timeout: float,
           sleep: Callable[[float], None] = time.sleep) -> RunDetail | None:
    """`send --wait`: the run once terminal (followed by the Client given, else one for
    `url`); None if `timeout` passes first. agentbox unreachable for
    FOLLOW_UNREACHABLE_SECONDS on end: GaveUp (exit status 3)."""
    from agentbox import client

    box = url if isinstance(url, client.Client) else client.Client(url, progress=_say)
    try:
        return box.follow(run_id, timeout,
                          unreachable_timeout=client.FOLLOW_UNREACHABLE_SECONDS, sleep=sleep)
    except client.NotFinished:
        return None
    except (client.Unreachable, client.NotProven) as exc:
        raise GaveUp(str(exc)) from None
    except client.AgentboxError as exc:
        raise click.ClickException(_said(exc)) from None
    finally:
        if box is not url:
            box.close()


def _parse_fields(fields: tuple[str, ...], event_type: str | None = None) -> dict[str, Any]:
    """The payload FIELD=VALUE ... give; a field the event type's payload does not have
    is refused here, before anything is sent (the server's 422 came after the retries
    and the signing, for a typo)."""
    from agentbox import terminal
    from agentbox.events import PAYLOAD_MODELS
    from agentbox.review import contract  # noqa: F401 - registers the review's event types

    payload: dict[str, Any] = {}
    model = PAYLOAD_MODELS.get(event_type or "")
    for item in fields:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="FIELDS")
        if model is not None and key not in model.model_fields:
            raise click.BadParameter(
                f"{event_type} has no field {terminal.line(key)!r}; its payload's fields: "
                + ", ".join(model.model_fields), param_hint="FIELDS")
        payload[key] = value
    return payload


@main.command()
@click.argument("event_type", metavar="[FILE | EVENT_TYPE]", required=False)
@click.argument("fields", nargs=-1)
@click.option("--type", "type_option", default=None,
              help="The event type (instead of the first argument).")
@click.option("--project", default=None,
              help="payload.project_id (for a FILE: default, the file's name).")
@click.option("--mix", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="payload.mix_url: the rendered file (made absolute).")
@click.option("--profile", default=None, help="payload.profile, e.g. streaming, club")
@click.option("--stage", type=_Named(_stages()), default=None,
              help="payload.stage: judge this file as a mix (going to mastering) or a "
                   "master; the project's later exports are not.")
@click.option("--project-stage", type=_Named(_stages("auto")), default=None,
              help="payload.project_stage: the project is at this stage from now on "
                   "(its later exports are judged so unless a file's own stage or the "
                   "watched folder's says otherwise); auto forgets it.")
@GENRE_OPTION
@URL_OPTION
@click.option("--source", default="cli", show_default=True)
@click.option("--event-id", default=None,
              help="Give a stable id (e.g. from the file) so that sending again is a "
                   "duplicate, not a new run. Default: a new random id; for a FILE, one "
                   "from its content.")
@click.option("--payload", "payload_json", default=None, help="The payload as JSON.")
@click.option("--callback-url", default=None)
@click.option("--file", "event_file", type=click.File("rb"), default=None,
              help="Send this complete event (JSON) as it is, '-' for stdin.")
@click.option("--retries", default=5, show_default=True, type=click.IntRange(0, 100),
              help="Retries on 429, 503 and connection errors, with backoff.")
@click.option("--wait", is_flag=True,
              help="Follow the run to its end and print the review (verdict, figures, notes).")
@click.option("--wait-timeout", default=600.0, show_default=True, help="Seconds, with --wait.")
@click.option("--json", "as_json", is_flag=True,
              help="Print agentbox's answer as JSON (with --wait: then the finished run).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def send(event_type: str | None, fields: tuple[str, ...], type_option: str | None,
         project: str | None, mix: Path | None, profile: str | None, stage: str | None,
         project_stage: str | None, genre: str | None, url: str | None,
         source: str, event_id: str | None, payload_json: str | None,
         callback_url: str | None, event_file: Any, retries: int, wait: bool,
         wait_timeout: float, as_json: bool, config_file: Path | None) -> None:
    """Send a mix for review, or sign and POST any event (from an export script):

    \b
        agentbox send night-drive.wav --wait
        agentbox send suite-1.wav --genre orchestral --wait
        agentbox send --type session.exported --project night-drive --mix ./mix.wav
        agentbox send session.exported project_id=night-drive mix_url=/mixes/mix.wav

    A FILE (no --type) is reviewed: a session.exported for it, its project named
    after the file as `watch` names it (or --project). What it is follows the one
    rule of every door: the very bytes of the project's latest export are that
    export (a duplicate that answers its review, however often it is sent or
    touched); the bytes of an older export are a new export of the same audio;
    anything else is a new export. Said for
    people; with an event type, agentbox's answer is printed as JSON, for scripts.
    With --wait the review is printed once finished (Ctrl-C stops waiting; the
    review goes on); --json prints the answer and the finished run as JSON. The
    project name is kept in Unicode NFC, as `watch` keeps a file's name.

    Exit status: 0 stored (or already stored; with --wait: succeeded), 1 refused,
    3 agentbox unreachable or busy after the retries, 4 the run failed (--wait),
    5 the run was not finished in time (--wait), 130 stopped with Ctrl-C.
    """
    from agentbox.client import export_event

    mix_file = _mix_to_review(event_type, type_option, event_file)
    if project_stage is not None:
        fields = (*fields, f"project_stage={project_stage}")
    if genre is not None:
        fields = (*fields, f"genre={genre}")
    if mix_file is not None:
        if mix is not None:
            raise click.UsageError("give the file to review once: as FILE or as --mix")
        payload = {**_parse_fields(fields, "session.exported"),
                   **({"profile": profile} if profile else {}),
                   **({"stage": stage} if stage else {})}
        event = export_event(mix_file, event_id or _export_id(mix_file, project, payload),
                             project, source, **payload)
    elif event_file is not None:
        event = None
    else:
        event = _typed_event(type_option or event_type, fields, project, mix, profile, stage,
                             source, event_id, payload_json, callback_url)
    body = event_file.read() if event is None else json.dumps(
        event, separators=(",", ":")).encode()
    sent = Sent(mix_file.name if mix_file else _named(event), _reviewed(event),
                for_people=mix_file is not None and not as_json)
    with _client(url, config_file) as box:
        answer = _deliver(box, body, retries, sent.for_people)
        if wait:
            _wait_and_tell(box, answer, wait_timeout, as_json, sent)
        else:
            click.echo(sent.line(answer) if sent.for_people else _compact(answer))


def _mix_to_review(first: str | None, type_option: str | None,
                   event_file: Any) -> Path | None:
    """The FILE of `agentbox send FILE`: the first argument when no --type or --file
    is given and it names a file (or a name an audio file would have)."""
    from agentbox import terminal
    from agentbox.desktop.watch import AUDIO_SUFFIXES
    from agentbox.events import is_event_type_name

    if first is None or type_option is not None or event_file is not None:
        return None
    path = Path(first).expanduser()
    if path.is_file():
        return path
    if (path.suffix.lower() in AUDIO_SUFFIXES or "/" in first or "\\" in first
            or not is_event_type_name(first)):  # "Night Drive": a file's name, not a type
        raise click.BadParameter(f"there is no file at {terminal.line(path)}",
                                 param_hint="FILE")
    return None


def _export_id(path: Path, project: str | None, asked: dict[str, Any]) -> str:
    """The event_id of `send FILE` (client.export_id); a file that cannot be read is
    a usage error."""
    from agentbox import terminal
    from agentbox.client import export_id

    try:
        return export_id(path, project, **asked)
    except OSError as exc:
        raise click.BadParameter(f"{terminal.line(path)} cannot be read: {exc.strerror}",
                                 param_hint="FILE") from None


def _typed_event(event_type: str | None, fields: tuple[str, ...], project: str | None,
                 mix: Path | None, profile: str | None, stage: str | None, source: str,
                 event_id: str | None,
                 payload_json: str | None, callback_url: str | None) -> dict[str, Any]:
    """The event of `agentbox send EVENT_TYPE key=value ...` (and --type, --payload)."""
    from uuid import uuid4

    from agentbox.client import build_event
    from agentbox.events import nfc_name as project_name

    if not event_type:
        raise click.UsageError("give a file to review, or the event type (--type, or the "
                               "first argument), or --file")
    payload = _parse_fields(fields, event_type)
    if payload_json:
        try:
            payload.update(json.loads(payload_json))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise click.BadParameter(f"not a JSON object: {exc}",
                                     param_hint="--payload") from None
    for key, value in (("project_id", None if project is None else project_name(project)),
                       ("profile", profile), ("stage", stage),
                       ("mix_url", None if mix is None else str(mix.expanduser().resolve()))):
        if value is not None:
            payload[key] = value
    return build_event(event_type, source, event_id or uuid4().hex, payload,
                       callback_url)


def _named(event: dict[str, Any] | None) -> str | None:
    """The name of the file an event names (its mix_url's), if any."""
    from agentbox import terminal

    payload = event.get("payload") if event else None
    mix_url = payload.get("mix_url") if isinstance(payload, dict) else None
    if not isinstance(mix_url, str):
        return None
    from agentbox.review.present import mix_name  # here: the other commands start without it

    return terminal.line(mix_name(mix_url))


def _reviewed(event: dict[str, Any] | None) -> bool:
    """Whether the review takes the event's type (the review's contract, loaded here)."""
    from agentbox.review.contract import AGENTS

    return event is not None and event.get("event_type") in AGENTS


@dataclass(frozen=True)
class Sent:
    """What was sent, for the sentences said about it."""

    name: str | None  # the file's name
    review: bool  # a mix review (else some other agent's run)
    for_people: bool  # sentences (else agentbox's JSON, for scripts)

    def line(self, answer: Accepted) -> str:
        """`night-drive.wav: sent for review (run run_...); see it with: agentbox show run_...`"""
        run_id = answer.run_id
        what = ("sent before: its review is run" if answer.duplicate else
                "sent for review: run" if self.review else "sent: run")
        return f"{self.name or 'the event'}: {what} {run_id}; see it with: agentbox show {run_id}"

    def waiting(self, answer: Accepted) -> str:
        what = "sent before" if answer.duplicate else "sent"
        doing = "reviewing" if self.review else "waiting for it to finish"
        return (f"{self.name or 'the event'} {what} (run {answer.run_id}); {doing}… "
                "Ctrl-C stops waiting, not the review")


def _compact(answer: Answer) -> str:
    """agentbox's JSON answer as it sent it."""
    return json.dumps(answer.as_json(), ensure_ascii=False, separators=(",", ":"))


def _indented(found: Answer | list[Answer]) -> str:
    """`--json`: agentbox's answer (or the list in it), indented for people too."""
    from agentbox.models import Answer

    shown = found.as_json() if isinstance(found, Answer) else [f.as_json() for f in found]
    return json.dumps(shown, indent=2)


EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a program stopped by SIGINT


def _deliver(box: Client, body: bytes, retries: int, for_people: bool) -> Accepted:
    """agentbox's answer to `body`; a refusal told (exit status 1), unavailable after
    the retries said why (exit status 3)."""
    from agentbox.client import AgentboxError, NotProven, Refused, Unreachable

    try:
        return box.send_body(body, retries=retries)
    except (Unreachable, NotProven) as exc:
        _say(f"giving up: {exc}" if isinstance(exc, Unreachable) else str(exc))
        sys.exit(EXIT_UNAVAILABLE)
    except Refused as exc:
        if for_people:
            _say(_refusal(exc))
        else:
            click.echo(exc.body)
        sys.exit(EXIT_REFUSED)
    except AgentboxError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        _say("stopped; agentbox has not taken it")
        sys.exit(EXIT_INTERRUPTED)


def _refusal(exc: Refused) -> str:
    """`agentbox refused it (422 invalid_event): ...`, and each field's error."""
    from agentbox import terminal

    told = f"agentbox refused it ({exc.status} {terminal.line(exc.error_code or '')}): " \
           f"{terminal.line(exc.message)}"
    return told + _field_errors(exc)


def _wait_and_tell(box: Client, answer: Accepted, wait_timeout: float, as_json: bool,
                   sent: Sent) -> None:
    from agentbox import terminal

    run_id = answer.run_id
    try:
        if as_json:
            click.echo(_compact(answer))
        else:
            _say(sent.waiting(answer))
        run = follow(box, run_id, wait_timeout)
    except KeyboardInterrupt:
        _say(f"stopped waiting. The {'review' if sent.review else 'run'} goes on in agentbox; "
             f"see it with: agentbox show {run_id}")
        sys.exit(EXIT_INTERRUPTED)
    if run is None:
        _say(f"the {'review' if sent.review else 'run'} is not finished after "
             f"{wait_timeout:g} s; see it later with: agentbox show {run_id}")
        sys.exit(EXIT_WAIT_TIMEOUT)
    if as_json:
        click.echo(_indented(run))
    else:
        lines = terminal.told(run, sent.name)
        if sys.stdout.isatty():  # a person's terminal: at word boundaries, as show does
            lines = terminal.wrapped(lines, shutil.get_terminal_size().columns)
        click.echo("\n".join(lines))
    if run.status != "succeeded":
        sys.exit(EXIT_RUN_FAILED)


@main.command()
@URL_OPTION
@click.option("--status", default=None, help="Only runs in this state.")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@CONFIG_OPTION
def runs(url: str | None, status: str | None, limit: int, as_json: bool,
         config_file: Path | None) -> None:
    """The newest reviews and runs, newest first: when, project, file, the verdict (or
    what became of the export), loudness, true peak and range, and a short id that
    `agentbox show` takes."""
    with _client_errors(), _client(url, config_file) as box:
        found = box.runs_json(limit, status)
    _print_runs(found, as_json, "no runs yet" if status is None else f"no {status} runs")


def _print_runs(found: list[dict[str, Any]], as_json: bool, empty: str,
                table: Callable[[list[dict[str, Any]], int], list[str]] | None = None
                ) -> None:
    """The runs found, as sent, as JSON or a table (terminal.runs_table, unless
    another) as wide as the terminal: no model built, so listing never imports
    pydantic."""
    from agentbox import terminal

    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif not found:
        click.echo(empty)
    else:
        width = terminal.terminal_width(sys.stdout.isatty())
        click.echo("\n".join((table or terminal.runs_table)(found, width)))


@main.command("dead-letters")
@URL_OPTION
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@CONFIG_OPTION
def dead_letters(url: str | None, limit: int, as_json: bool, config_file: Path | None) -> None:
    """List dead-lettered runs that wait for a decision (replay them with `agentbox
    replay RUN_ID`); those discarded on the status page are left out."""
    from agentbox import terminal

    with _client_errors(), _client(url, config_file) as box:
        found = box.runs_json(limit, "dead_lettered", discarded="false")
    _print_runs(found, as_json, "no dead letters waiting for a decision", terminal.why_table)


@main.command()
@click.argument("run_id", metavar="RUN_ID|PREFIX|PROJECT")
@URL_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@CONFIG_OPTION
def show(run_id: str, url: str | None, as_json: bool, config_file: Path | None) -> None:
    """Show one run: the review (verdict, figures, notes), its history and callbacks.

    The run is named by its id, by the start of it that no other run id has (as
    `agentbox runs` shows it), or by a project's name: its latest export."""
    from agentbox import terminal

    with _client_errors(), _client(url, config_file) as box:
        run = box.lookup(run_id, history=True)
    if as_json:
        click.echo(_indented(run))
        return
    size = shutil.get_terminal_size()
    lines = terminal.wrapped(terminal.show_lines(run), size.columns)
    if terminal.needs_pager(lines, size.lines, sys.stdout.isatty()):
        click.echo_via_pager("\n".join(lines) + "\n")
    else:
        click.echo("\n".join(lines))


@main.command()
@click.argument("ref", metavar="RUN_ID|PREFIX|PROJECT")
@click.option("--stage", type=click.Choice(["mix", "master"]), required=True,
              help="Judge it as a mix going to mastering, or as a master.")
@URL_OPTION
@click.option("--wait/--no-wait", "wait", default=True, show_default=True,
              help="Wait for the new review and print it (--no-wait: say the run it "
                   "started, and return).")
@click.option("--wait-timeout", default=600.0, show_default=True, help="Seconds, with --wait.")
@click.option("--json", "as_json", is_flag=True,
              help="Print agentbox's answer as JSON (with --wait: then the finished run).")
@CONFIG_OPTION
def rejudge(ref: str, stage: str, url: str | None, wait: bool, wait_timeout: float,
            as_json: bool, config_file: Path | None) -> None:
    """Judge a review again at another stage: a new review of the same audio (the
    archive's copy), beside the first, marked re-judged.

    \b
        agentbox rejudge "night drive" --stage master

    REF is what `agentbox show` takes: a run id, its start, or a project's name (its
    latest export). Asked again, it answers the first re-judgment. Exit status as
    `send`'s."""
    with _client_errors(), _client(url, config_file) as box:
        first = box.lookup(ref)
        answer = box.rejudge(first.run_id, stage)
        name = (first.file or first.get("project") or first.run_id)
        sent = Sent(f"{name} as a {stage}", review=True, for_people=not as_json)
        if wait:
            _wait_and_tell(box, answer, wait_timeout, as_json, sent)
        else:
            click.echo(sent.line(answer) if sent.for_people else _compact(answer))


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@DATABASE_URL_OPTION
def verify(data_dir: Path | None, config_file: Path | None, database_url: str | None) -> None:
    """Check the store's integrity (read-only; safe while the server runs)."""
    from agentbox.store import StoreError, engines

    settings = _settings(config_file, data_dir=data_dir, database_url=database_url)
    try:
        problems = engines.verify(settings)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    for problem in problems:
        click.echo(problem)
    if problems:
        sys.exit(1)
    click.echo(f"{engines.describe(settings)}: ok")


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@DATABASE_URL_OPTION
def migrate(data_dir: Path | None, config_file: Path | None, database_url: str | None) -> None:
    """Bring the database schema up to date (serve does this at start too).

    On PostgreSQL, instances starting together take turns on an advisory lock.
    A database written by a newer agentbox is refused, and left as it is.
    """
    from agentbox import config as cfg
    from agentbox.apps import schemas_of
    from agentbox.store import StoreError, engines

    settings = _settings(config_file, data_dir=data_dir, database_url=database_url)
    try:
        before, after = engines.migrate(settings, schemas_of(settings))
    except (StoreError, cfg.ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    where = engines.describe(settings)
    if before == after:
        click.echo(f"{where}: schema version {after}, up to date")
    else:
        click.echo(f"{where}: schema version {before} -> {after}")


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would go, per table; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@DATABASE_URL_OPTION
@URL_OPTION
def prune(dry_run: bool, as_json: bool, data_dir: Path | None, config_file: Path | None,
          database_url: str | None, url: str | None) -> None:
    """Remove finished runs older than AGENTBOX_RETENTION_DAYS and raw event bodies
    older than AGENTBOX_BODY_RETENTION_DAYS now (the server does it by itself every
    maintenance interval). A project's history stays.

    Works with the server stopped (it opens the store) and running: a SQLite store
    the server holds is pruned by the server (POST /prune, with the admin token);
    PostgreSQL is pruned from here, beside the running instances.
    """
    import asyncio

    from agentbox import config as cfg
    from agentbox.apps import prune_alone
    from agentbox.store import StoreError, StoreInUse

    settings = _settings(config_file, data_dir=data_dir, database_url=database_url)
    if settings.database_url is None and not settings.database_path.is_file():
        # Opening it would make an empty store there (a mistyped --data-dir, say).
        raise click.ClickException(f"there is no agentbox database at "
                                   f"{settings.database_path}: nothing to prune")
    try:
        report = asyncio.run(prune_alone(settings, dry_run)).as_json()
    except StoreInUse:
        with _client_errors(), _client(url, config_file) as box:
            report = box.prune(dry_run).as_json()
    except (StoreError, cfg.ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from agentbox.engine.retention import report_lines

    for line in report_lines(report):
        click.echo(line)


@main.command()
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN_ID...")
@URL_OPTION
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def replay(run_ids: tuple[str, ...], url: str | None, config_file: Path | None) -> None:
    """Send dead-lettered or permanently failed runs back to the queue (same run_id).
    Each RUN_ID may be the start of one that no other run id has."""
    with _client_errors(), _client(url, config_file) as box:
        for run_id in run_ids:
            run = box.replay(box.lookup(run_id, projects=False).run_id)
            click.echo(f"{run.run_id}  {run.status}")


@main.group()
def project() -> None:
    """Tidy projects: rename one, merge one into another, remove one."""


@project.command("rename")
@click.argument("old")
@click.argument("new")
@URL_OPTION
@CONFIG_OPTION
def project_rename(old: str, new: str, url: str | None, config_file: Path | None) -> None:
    """Call project OLD NEW from now on: its exports, kept audio and reference track
    follow, and an export still sent as OLD joins NEW."""
    from agentbox import terminal

    with _client_errors(), _client(url, config_file) as box:
        done = box.rename_project(old, new)
    click.echo(f"{terminal.line(done.was or old)} is now {terminal.line(done.project or new)}")


@project.command("merge")
@click.argument("from_project", metavar="FROM")
@click.argument("into")
@URL_OPTION
@CONFIG_OPTION
def project_merge(from_project: str, into: str, url: str | None,
                  config_file: Path | None) -> None:
    """Merge project FROM into project INTO: FROM's exports join INTO's history (its
    reference track too, unless INTO has one), and an export still sent as FROM
    joins INTO."""
    from agentbox import terminal

    with _client_errors(), _client(url, config_file) as box:
        done = box.merge_projects(from_project, into)
    click.echo(f"{terminal.line(done.merged or from_project)} merged into "
               f"{terminal.line(done.project or into)}")


@project.command("remove")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask before removing.")
@URL_OPTION
@CONFIG_OPTION
def project_remove(name: str, yes: bool, url: str | None, config_file: Path | None) -> None:
    """Remove project NAME: its exports leave the project pages, the archive lets
    their audio go, its reference track goes. Asks first, unless --yes."""
    from agentbox import terminal

    if not yes:
        click.confirm(f"Remove the project {terminal.line(name)} and the audio kept of "
                      "its exports?", abort=True)
    with _client_errors(), _client(url, config_file) as box:
        done = box.remove_project(name)
    exports, copies = done.exports or 0, done.audio_dropped or 0
    click.echo(f"{terminal.line(done.removed or name)} removed: {exports} "
               f"export{'' if exports == 1 else 's'}, {copies} kept "
               f"cop{'y' if copies == 1 else 'ies'} let go")


@main.group()
def reference() -> None:
    """A project's reference track: every review of the project compares with it."""


@reference.command("add")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--project", required=True, help="The project it is the reference of.")
@URL_OPTION
@CONFIG_OPTION
def reference_add(file: Path, project: str, url: str | None,
                  config_file: Path | None) -> None:
    """Make FILE the project's reference track (it replaces the one it had)."""
    from agentbox import terminal
    from agentbox.client import NotFound

    with _client_errors(), _client(url, config_file) as box:
        found = box.add_reference(file, project)
        click.echo(f"{found.name} is the reference of {found.project}: "
                   f"{_reference_figures(found)}")
        try:
            box.exports(found.project, limit=1)
        except NotFound:  # a name mistyped would compare nothing, unnoticed
            _say(f"no export of {terminal.line(found.project)} has arrived yet: its "
                 "reviews compare with this track once they come (is that the name its "
                 "exports have? agentbox runs shows them)")


@reference.command("list")
@URL_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
@CONFIG_OPTION
def reference_list(url: str | None, as_json: bool, config_file: Path | None) -> None:
    """Every project's reference track."""
    with _client_errors(), _client(url, config_file) as box:
        found = box.references().references
    if as_json:
        click.echo(_indented(list(found)))
        return
    if not found:
        click.echo("No project has a reference track yet: agentbox reference add FILE "
                   "--project NAME")
    for ref in found:
        click.echo(f"{ref.project}: {ref.name}, {_reference_figures(ref)}")


@reference.command("remove")
@click.argument("project")
@URL_OPTION
@CONFIG_OPTION
def reference_remove(project: str, url: str | None, config_file: Path | None) -> None:
    """PROJECT no longer has a reference track."""
    with _client_errors(), _client(url, config_file) as box:
        found = box.remove_reference(project).removed
    click.echo(f"{found.project} no longer has a reference track ({found.name}).")


def _reference_figures(ref: ReferenceOut) -> str:
    figures = [f"{value:{sign}.1f} {unit}"
               for value, unit, sign in ((ref.integrated_lufs, "LUFS", ""),
                                         (ref.true_peak_dbtp, "dBTP", "+"),  # as reviews say it
                                         (ref.loudness_range_lu, "LU LRA", ""))
               if value is not None]
    return ", ".join(figures) or "measured"


@main.group()
def callbacks() -> None:
    """Callback deliveries: list them, see destinations, resume one, verify one."""


@callbacks.command("list")
@URL_OPTION
@click.option("--state", type=click.Choice(["pending", "delivered", "dead"]), default=None)
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@CONFIG_OPTION
def callbacks_list(url: str | None, state: str | None, limit: int, as_json: bool,
                   config_file: Path | None) -> None:
    """The newest notifications and how their delivery stands."""
    with _client_errors(), _client(url, config_file) as box:
        found = box.callbacks(limit, state).callbacks
    if as_json:
        click.echo(_indented(list(found)))
        return
    for n in found:
        click.echo(f"{n.notification_id:<60} {n.state:<9} attempts={n.attempts} "
                   f"{n.destination} {n.last_error or ''}")


@callbacks.command("destinations")
@URL_OPTION
@CONFIG_OPTION
def callbacks_destinations(url: str | None, config_file: Path | None) -> None:
    """Every destination: active or paused, failures in a row, notifications waiting."""
    with _client_errors(), _client(url, config_file) as box:
        found = box.destinations().destinations
    for d in found:
        reason = f" ({d.paused_reason})" if d.paused_reason else ""
        click.echo(f"{d.destination:<40} {d.state}{reason} "
                   f"failures={d.consecutive_failures} pending={d.pending}")


@callbacks.command("resume")
@click.argument("destination")
@URL_OPTION
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def callbacks_resume(destination: str, url: str | None, config_file: Path | None) -> None:
    """Resume a paused destination (an origin such as https://studio.example)."""
    with _client_errors(), _client(url, config_file) as box:
        found = box.resume_destination(destination)
    click.echo(f"{found.destination}  {found.state}")


@callbacks.command("verify")
@click.argument("body_file", type=click.File("rb"))
@click.option("-H", "--header", "headers", multiple=True,
              help="A received header, 'Name: value' (repeat it).")
@click.option("--secret", "secret_value", default=None,
              help="Default: the callback secret of this machine's configuration.")
@click.option("--max-age", default=300.0, show_default=True,
              help="Refuse a timestamp further than this from now (seconds).")
@click.option("--ignore-age", is_flag=True, help="Check the signature only (a capture).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def callbacks_verify(body_file: Any, headers: tuple[str, ...], secret_value: str | None,
                     max_age: float, ignore_age: bool, config_file: Path | None) -> None:
    """Check a captured callback: its exact body (a file, '-' for stdin) and headers.

        agentbox callbacks verify body.json -H "X-Agent-Timestamp: 1785166920" \\
            -H "X-Agent-Signature: 5d1c..." --ignore-age
    """
    from agentbox import config as cfg
    from agentbox.signing import SignatureError, verify_callback

    received: dict[str, str] = {}
    for item in headers:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item[:40]!r} is not 'Name: value'", param_hint="-H")
        received[name.strip()] = value.strip()
    if secret_value is None:
        secret_value = cfg.ensure_callback_secret(_settings(config_file))[0].callback_secret[0]
    body = body_file.read()
    try:
        note = verify_callback(secret_value, received, body,
                               max_age_seconds=float("inf") if ignore_age else max_age)
    except SignatureError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from None
    click.echo(f"valid: {note.get('notification_id')} ({note.get('status')})")


class FolderOrAction(click.Path):
    """`agentbox watch`'s argument: a folder to watch, or `pause` / `resume` (the
    server's own watched folders); a folder named so is `./pause`."""

    def __init__(self) -> None:
        super().__init__(exists=True, file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        return value if value in WATCH_ACTIONS else super().convert(value, param, ctx)


WATCH_ACTIONS = ("pause", "resume")


@main.command()
@click.argument("folder", type=FolderOrAction())
@URL_OPTION
@click.option("--project", default=None, help="project_id (default: from the file name).")
@click.option("--profile", default=None, help="payload.profile for every file.")
@click.option("--stage", type=_Named(_stages()), default=None,
              help="The stage of this folder's files (payload.default_stage): mix or "
                   "master, unless the project was given another.")
@GENRE_OPTION
@click.option("--source", default="watch", show_default=True)
@click.option("--settle", default=2.0, show_default=True,
              help="Seconds a file must stay unchanged to count as written.")
@click.option("--headerless-settle", default=10.0, show_default=True,
              help="Seconds unchanged for a streamed file that says nothing of its length "
              "(an MP3 without a Xing/Info frame, a CAF written to the end).")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between scans.")
@click.option("--existing", is_flag=True,
              help="Also send the files already there at start (else only those written "
                   "since the folder was first watched and not seen).")
@click.option("--once", is_flag=True, help="Scan until nothing is being written, then exit.")
@click.option("--retries", default=5, show_default=True, type=click.IntRange(0, 100),
              help="With --once: retries per file on 429, 503 and connection errors.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def watch(folder: Path | str, url: str | None, project: str | None, profile: str | None,
          stage: str | None, genre: str | None,
          source: str, settle: float, headerless_settle: float, interval: float,
          existing: bool, once: bool, retries: int, config_file: Path | None) -> None:
    """Watch an export folder and send session.exported for each finished mix,
    then print each review as it finishes.

    A file counts as finished when its size and modification time have stayed
    the same for --settle seconds and its header says the audio is all there
    (WAV, RF64, W64, AIFF, CAF, FLAC, Ogg's last page, an MP3's Xing/Info frame);
    a streamed file that says nothing of its length must stay unchanged for
    --headerless-settle seconds. One write of a file is one export, however its
    writer stalls, and a file written on after it was sent is still that export
    (one run; if the review read less than the whole file, the whole file is
    reviewed again by a mix.review_requested naming the run). What counts as a new
    export is the rule of every door: the very bytes of the project's latest
    export are that export (a touch, a restarted watcher: a duplicate, no run);
    the bytes of an older export are a new export of the same audio; anything
    else is a new export. What the folder held is kept in the data dir (watch/):
    a restarted watcher reviews each render written while it was stopped, once,
    oldest first; files from before the folder was first watched are left alone
    unless --existing. Every format the review reads (WAV, AIFF, FLAC, MP3, Ogg, CAF, ...);
    hidden files are skipped. The project is --project, else the file's name
    without its extension (in Unicode NFC, as `send --project` keeps it).

    While agentbox cannot take a file (unreachable, busy, a signature refused
    while the secret is rotated) the file stays pending and is tried again with
    backoff, signed with the secret as it is then. With --once a file is given
    up instead, and the exit status says so as `send`'s does (1: a file was
    refused, 3: agentbox unreachable or busy).

    `agentbox watch pause` pauses the folders the server watches (the `watch`
    setting) until `agentbox watch resume`: renders written meanwhile are sent on
    resume, the newest last; the pause outlives a restart.
    """
    from agentbox.desktop.folders import Folder, FolderWatch

    if isinstance(folder, str):
        _pause_or_resume(folder == "pause", url, config_file)
        return
    box = _client(url, config_file)
    folder_watch = FolderWatch(
        Folder(folder, project, profile, {**({"default_stage": stage} if stage else {}),
                                          **({"genre": genre} if genre else {})},
               settle=settle, headerless_settle=headerless_settle,
               include_existing=existing),
        box, _print_news, _settings(config_file).data_dir, source)
    folder_watch.start()  # what was there before is left alone (unless --existing)
    click.echo(f"agentbox: watching {folder.resolve()} for {box.url} (Ctrl-C stops)",
               err=True)
    try:
        with box:
            if once:
                outcome = folder_watch.once(retries, interval)
                sys.exit(EXIT_UNAVAILABLE if outcome.unsent else
                         EXIT_REFUSED if outcome.refused else EXIT_OK)
            while True:
                folder_watch.turn()
                time.sleep(interval)
    except KeyboardInterrupt:
        return


def _pause_or_resume(paused: bool, url: str | None, config_file: Path | None) -> None:
    with _client_errors(), _client(url, config_file) as box:
        state = box.pause_watch() if paused else box.resume_watch()
    folders = len(state.folders)
    what = "paused" if state.paused else "watching again"
    click.echo(f"agentbox: watched folders {what} ({folders} folder"
               f"{'' if folders == 1 else 's'})")


def _print_news(news: Any) -> None:
    click.echo(news.text, err=news.problem)


@main.command()
@URL_OPTION
@CONFIG_OPTION
def tray(url: str | None, config_file: Path | None) -> None:
    """Show agentbox in the menu bar or notification area: whether it runs, reviews or
    idles, the last verdict, and a menu of the last five reviews (one opens its page),
    open agentbox, pause or resume the watched folders, start agentbox, quit.

    It follows the running agentbox's live updates; started at login beside the
    server by `agentbox service install`. A desktop without a tray says so and exits 2.
    Its log (a line per change of the icon) goes to stderr."""
    from agentbox.desktop.tray import NoTray, Tray, check_tray
    from agentbox.logs import setup_logging

    try:
        check_tray()
    except NoTray as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_USAGE)
    setup_logging("info", "auto")
    with _client(url, config_file) as box:
        Tray(box).run()


MCP_INSTALL = ("agentbox mcp needs the MCP Python SDK, an optional part: install it with\n"
               "    pip install 'agentbox[mcp]'\n"
               "(in the environment agentbox is installed in; from a checkout: "
               "pip install -e '.[mcp]')")
MCP_FROZEN = ("this agentbox executable was built without the MCP SDK; for agentbox mcp, "
              "install agentbox with pip: pip install 'agentbox[mcp]'")


@main.command()
@URL_OPTION
@CONFIG_OPTION
def mcp(url: str | None, config_file: Path | None) -> None:
    """Serve agentbox's tools to an AI assistant on this machine: a Model Context
    Protocol server on stdin/stdout, for the assistant to start (agentbox docs cli).

    It talks to the running agentbox (as send, runs and show do) and signs with the
    same secret. Needs the optional MCP SDK: pip install 'agentbox[mcp]'.
    """
    try:
        from agentbox import mcp_server
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types"):
            raise
        click.echo(MCP_FROZEN if getattr(sys, "frozen", False) else MCP_INSTALL, err=True)
        sys.exit(EXIT_USAGE)
    mcp_server.serve(client_url(url, config_file), config_file)


@main.command("docs")
@click.argument("topic", required=False)
def docs(topic: str | None) -> None:
    """Read the manual: its topics, or one TOPIC's text (e.g. agentbox docs review)."""
    from agentbox import manual
    try:
        text = manual.for_terminal(topic)
    except manual.UnknownTopic as exc:
        click.echo(manual.unknown_sentence(exc.name), err=True)
        sys.exit(EXIT_USAGE)
    (click.echo_via_pager if sys.stdout.isatty() else click.echo)(text)


# -- start at login (the logic is in agentbox/desktop/service.py) ---------------------------


@main.group()
def service() -> None:
    """Start agentbox at login: a systemd user unit, a launchd agent or a scheduled task."""


def _service(action: Callable[[Any], list[str]], config_file: Path | None = None,
             data_dir: Path | None = None,
             tray: Callable[[Any], list[str]] | None = None) -> None:
    """`action` on this OS's service manager; `tray` on its way to start the tray icon
    at login (install and uninstall do both)."""
    from agentbox.desktop import service as svc

    manager = svc.manager_for(svc.Installation.this(config_file), data_dir=data_dir)
    try:
        said = action(manager)
        if tray is not None:
            said += tray(svc.tray_for(manager.installation))
        click.echo("\n".join(said))
    except svc.ServiceError as exc:
        raise click.ClickException(str(exc)) from None


@service.command("install")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="The config file it serves with (default: the one `serve` would read).")
@click.option("--dry-run", is_flag=True, help="Print the file it would write, and where; "
              "write nothing.")
def service_install(config_file: Path | None, dry_run: bool) -> None:
    """Start this agentbox at login (and now), with this config, and its tray icon
    (agentbox tray) at login beside it."""
    settings = _settings(config_file)  # a config that cannot serve is refused now
    _service(lambda m: m.install(dry_run=dry_run), config_file, settings.data_dir,
             tray=lambda t: t.install(dry_run=dry_run))


@service.command("uninstall")
def service_uninstall() -> None:
    """Stop starting agentbox and its tray icon at login; stop it and remove the
    service's files."""
    _service(lambda m: m.uninstall(), tray=lambda t: t.uninstall())


@service.command("status")
def service_status() -> None:
    """Installed or not, where, and whether it runs."""
    _service(lambda m: m.status().lines())


@service.command("run", hidden=True, context_settings={"ignore_unknown_options": True})
@click.option("--log-file", type=click.Path(path_type=Path), required=True)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def service_run(log_file: Path, args: tuple[str, ...]) -> None:
    """Run agentbox with its output appended to a file (how the Windows task logs)."""
    from agentbox.desktop.service import run_logged

    run_logged(log_file, lambda: main(list(args)))
