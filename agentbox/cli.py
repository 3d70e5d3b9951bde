"""`agentbox`: a thin shell over functions that tests call directly."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import httpx

from agentbox import config as cfg
from agentbox import portable
from agentbox.review import digest
from agentbox.signing import sign_headers

DEFAULT_URL = f"http://{cfg.DEFAULT_HOST}:{cfg.DEFAULT_PORT}"
URL_ENV = "AGENTBOX_URL"  # the client commands' agentbox, between the config file and --url
RECEIVER_PATH = "/webhooks/events"


def _settings(config_file: Path | None = None, **overrides: Any) -> cfg.Settings:
    try:
        return cfg.load_settings(config_file, overrides=overrides)
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None


DATABASE_URL_OPTION = click.option(
    "--database-url", default=None, metavar="URL",
    help="postgresql://... to share one PostgreSQL database between instances; without "
         "it, SQLite in the data dir. Prefer AGENTBOX_DATABASE_URL: a flag, password and "
         "all, shows in the process list.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agentbox")
def main() -> None:
    """agentbox: signed webhooks in, durable agent runs out."""


@main.command()
@click.option("--host", default=None, help=f"Address to bind (default {cfg.DEFAULT_HOST}).")
@click.option("--port", type=int, default=None, help=f"Port (default {cfg.DEFAULT_PORT}).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Where the database lives (AGENTBOX_DATA_DIR).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="TOML config file (default: agentbox.toml in the config directory).")
@DATABASE_URL_OPTION
def serve(host: str | None, port: int | None, data_dir: Path | None,
          config_file: Path | None, database_url: str | None) -> None:
    """Receive webhooks, run agents, serve the API."""
    from agentbox import files
    from agentbox import store as st
    from agentbox.http import server
    from agentbox.http.app import create_app
    from agentbox.logs import setup_logging
    from agentbox.store import engines

    settings = _settings(config_file, host=host, port=port, data_dir=data_dir,
                         database_url=database_url)
    setup_logging(settings.log_level)
    try:
        settings, secret_path = cfg.ensure_webhook_secret(settings)
        settings, callback_secret_path = cfg.ensure_callback_secret(settings)
        token = cfg.admin_token(settings)
        engines.migrate(settings)  # a database newer than this code stops us here
        app = create_app(settings, token)
    except (cfg.ConfigError, st.StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    for warning in files.tighten(settings):  # what an older version or a copy left open
        click.echo(f"agentbox: {warning}", err=True)
    if secret_path is not None:
        click.echo(f"agentbox: webhook secret is in {secret_path} "
                   "(show it with: agentbox secret)", err=True)
    if callback_secret_path is not None and settings.callback_allowed + \
            settings.callback_allowed_local:
        click.echo(f"agentbox: callbacks are signed with the secret in {callback_secret_path} "
                   "(show it with: agentbox secret --callback)", err=True)
    click.echo(f"agentbox: data in {engines.describe(settings)}; listening on "
               f"http://{settings.host}:{settings.port}", err=True)
    server.run(app, settings, host=settings.host, port=settings.port, log_config=None,
               access_log=False, loop=portable.EVENT_LOOP, lifespan="on",
               timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 5,
               timeout_keep_alive=max(1, round(settings.keep_alive_seconds)))


@main.group(invoke_without_command=True)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@click.option("--path", "show_path", is_flag=True, help="Print where the secret is kept.")
@click.option("--callback", is_flag=True,
              help="The secret callbacks are signed with, for their receivers.")
@click.pass_context
def secret(ctx: click.Context, config_file: Path | None, show_path: bool,
           callback: bool) -> None:
    """Print the webhook secret that senders sign with (made on first use).

    \b
    Rotation without downtime:
        agentbox secret rotate   # a new secret signs; the old one still verifies
        (give senders the new secret: agentbox secret)
        agentbox secret retire   # only the new one verifies
    The same for the callback secret: agentbox secret --callback rotate (callbacks
    are then signed with both until retire).
    """
    ctx.obj = (config_file, callback)
    if ctx.invoked_subcommand is not None:
        return
    settings = _settings(config_file)
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


def _secret_file(chosen: tuple[Path | None, bool]) -> Path:
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
    path = _secret_file(chosen)
    retired = cfg.retire_secrets(path)
    click.echo(f"retired {retired} old secret(s); only the newest verifies now")


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def token(config_file: Path | None) -> None:
    """Print the admin token that admin API calls (replay) need."""
    click.echo(cfg.admin_token(_settings(config_file)))


URL_OPTION = click.option(
    "--url", default=None, metavar="URL",
    help=f"agentbox's address, e.g. http://127.0.0.1:9000 (or its {RECEIVER_PATH} "
         f"endpoint). Default: {URL_ENV}, else host and port of the config file "
         f"(as serve reads them), else {DEFAULT_URL}.")
CONFIG_OPTION = click.option("--config", "config_file", type=click.Path(path_type=Path),
                             default=None, help="TOML config file (as serve's).")


def client_url(url: str | None, config_file: Path | None = None,
               environ: Mapping[str, str] | None = None) -> str:
    """The agentbox the client commands talk to, as a base URL: `--url`, else
    AGENTBOX_URL, else the host and port that `serve` reads from the config file
    (and AGENTBOX_HOST / AGENTBOX_PORT). A URL naming the receiver's endpoint is
    taken for the server it belongs to."""
    environ = os.environ if environ is None else environ
    if url is None and environ.get(URL_ENV, "").strip():
        return _base_url(environ[URL_ENV], URL_ENV)
    if url is not None:
        return _base_url(url, "--url")
    settings = _settings(config_file)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host,
                                                                     settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def _base_url(url: str, where: str) -> str:
    base = url.strip().rstrip("/")
    if base.endswith(RECEIVER_PATH):
        base = base[: -len(RECEIVER_PATH)]
    parts = urlsplit(base)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment:
        raise click.UsageError(f"{where}: {digest.one_line(url)[:80]!r} is not agentbox's "
                               f"address; give one such as {DEFAULT_URL}")
    return base


def build_event(event_type: str, source: str, event_id: str, payload: dict[str, Any],
                callback_url: str | None = None) -> dict[str, Any]:
    """A v1 envelope with its idempotency key derived from source, type and id."""
    event: dict[str, Any] = {
        "schema_version": "v1",
        "event_id": event_id,
        "idempotency_key": f"{source}:{event_type}:{event_id}",
        "event_type": event_type,
        "source": source,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "payload": payload,
    }
    if callback_url:
        event["callback_url"] = callback_url
    return event


def send_event(url: str, secret_value: str, body: bytes, timeout: float = 30.0) -> httpx.Response:
    headers = {"Content-Type": "application/json",
               **sign_headers(secret_value, body, int(time.time()))}
    return httpx.post(url.rstrip("/") + RECEIVER_PATH, content=body, headers=headers,
                      timeout=timeout)


# Exit statuses of `agentbox send`, for export scripts.
EXIT_OK = 0  # stored (202) or already stored (200); with --wait: the run succeeded
EXIT_REFUSED = 1  # the event was refused (4xx other than 429): fix it, do not retry
EXIT_UNAVAILABLE = 3  # agentbox unreachable, busy (429) or unavailable (503) after retries
EXIT_RUN_FAILED = 4  # --wait: the run ended failed_permanent or dead_lettered
EXIT_WAIT_TIMEOUT = 5  # --wait: the run was not finished in time
RETRYABLE_STATUSES = (429, 503)


def deliver(url: str, secret_value: str, body: bytes, retries: int,
            sleep: Callable[[float], None] = time.sleep) -> httpx.Response | None:
    """POST, retrying on 429, 503 and connection errors with backoff (and
    Retry-After). Signed afresh each time. None: still unavailable at the end."""
    delay = 0.5
    for attempt in range(retries + 1):
        wait = delay
        try:
            response = send_event(url, secret_value, body)
            if response.status_code not in RETRYABLE_STATUSES:
                return response
            hint = response.headers.get("retry-after", "")
            if hint.isascii() and hint.isdigit():
                wait = max(wait, min(float(hint), 60.0))
            reason = f"{response.status_code} {response.json().get('error_code', '')}"
        except httpx.TransportError as exc:
            reason = f"cannot reach agentbox at {url}: {type(exc).__name__}"
        except ValueError:
            reason = "an answer that is not JSON"
        if attempt < retries:
            click.echo(f"agentbox: {reason}; trying again in {wait:g} s", err=True)
            sleep(wait)
            delay = min(delay * 2, 30.0)
        else:
            click.echo(f"agentbox: {reason}; giving up", err=True)
    return None


# Following a run: the first look soon (a short review is told at once), then less
# and less often, down to one request a second over one kept-alive connection: a
# long wait beside a DAW costs next to nothing. A restart of agentbox meanwhile (the
# run is given back and taken up again) is waited out for FOLLOW_UNREACHABLE_SECONDS.
FOLLOW_FIRST_SECONDS = 0.1
FOLLOW_MAX_SECONDS = 1.0
FOLLOW_UNREACHABLE_SECONDS = 30.0


class Unreachable(click.ClickException):
    exit_code = EXIT_UNAVAILABLE


def follow(url: str, run_id: str, timeout: float,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any] | None:
    """Poll a run until it is terminal; None if `timeout` passes first. Unreachable
    for FOLLOW_UNREACHABLE_SECONDS on end: Unreachable (exit status 3)."""
    deadline = time.monotonic() + timeout
    interval, lost_since = FOLLOW_FIRST_SECONDS, None
    with httpx.Client(timeout=30) as client:
        while True:
            try:
                response = client.get(url.rstrip("/") + f"/runs/{run_id}")
            except httpx.TransportError as exc:
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    click.echo(f"agentbox: cannot reach agentbox at {url} "
                               f"({type(exc).__name__}); waiting for it", err=True)
                elif now - lost_since >= FOLLOW_UNREACHABLE_SECONDS:
                    raise Unreachable(f"cannot reach agentbox at {url} for "
                                      f"{FOLLOW_UNREACHABLE_SECONDS:g} s: {exc}") from None
            else:
                if lost_since is not None:
                    click.echo("agentbox: reachable again; following the run", err=True)
                    lost_since = None
                run: dict[str, Any] = _answer(url, response)
                if run["terminal"]:
                    return run
            if time.monotonic() > deadline:
                return None
            sleep(interval)
            interval = min(interval * 1.5, FOLLOW_MAX_SECONDS)


def _parse_fields(fields: tuple[str, ...]) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for item in fields:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="FIELDS")
        payload[key] = value
    return payload


@main.command()
@click.argument("event_type", required=False)
@click.argument("fields", nargs=-1)
@click.option("--type", "type_option", default=None,
              help="The event type (instead of the first argument).")
@click.option("--project", default=None, help="payload.project_id")
@click.option("--mix", type=click.Path(path_type=Path), default=None,
              help="payload.mix_url: the rendered file (made absolute).")
@click.option("--profile", default=None, help="payload.profile, e.g. streaming, club")
@URL_OPTION
@click.option("--source", default="cli", show_default=True)
@click.option("--event-id", default=None,
              help="Give a stable id (e.g. from the file) so that sending again is a "
                   "duplicate, not a new run. Default: a new random id.")
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
              help="With --wait: print agentbox's answer and the finished run as JSON.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def send(event_type: str | None, fields: tuple[str, ...], type_option: str | None,
         project: str | None, mix: Path | None, profile: str | None, url: str | None,
         source: str, event_id: str | None, payload_json: str | None,
         callback_url: str | None, event_file: Any, retries: int, wait: bool,
         wait_timeout: float, as_json: bool, config_file: Path | None) -> None:
    """Sign and POST an event, e.g. from an export script:

    \b
        agentbox send --type session.exported --project night-drive --mix ./mix.wav
        agentbox send session.exported project_id=night-drive mix_url=/mixes/mix.wav

    Prints agentbox's answer (JSON); with --wait, then the review for people
    (--json: the finished run as JSON). The project name is kept in Unicode NFC,
    as `watch` keeps a file's name, so both name one project alike.

    Exit status: 0 stored (or already stored; with --wait: succeeded), 1 refused,
    3 agentbox unreachable or busy after the retries, 4 the run failed (--wait),
    5 the run was not finished in time (--wait).
    """
    url = client_url(url, config_file)
    if event_file is not None:
        body = event_file.read()
    else:
        event_type = type_option or event_type
        if not event_type:
            raise click.UsageError("give the event type (--type, or the first argument) or "
                                   "--file")
        payload = _parse_fields(fields)
        if payload_json:
            try:
                payload.update(json.loads(payload_json))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise click.BadParameter(f"not a JSON object: {exc}",
                                         param_hint="--payload") from None
        from agentbox.events import project_name

        for key, value in (("project_id", None if project is None else project_name(project)),
                           ("profile", profile),
                           ("mix_url", None if mix is None else str(mix.expanduser().resolve()))):
            if value is not None:
                payload[key] = value
        event = build_event(event_type, source, event_id or uuid.uuid4().hex, payload,
                            callback_url)
        body = json.dumps(event, separators=(",", ":")).encode()
    settings, _ = cfg.ensure_webhook_secret(_settings(config_file))
    response = deliver(url, settings.webhook_secret[0], body, retries)
    if response is None:
        sys.exit(EXIT_UNAVAILABLE)
    click.echo(response.text)
    if response.status_code >= 300:
        sys.exit(EXIT_REFUSED)
    if wait:
        run = follow(url, response.json()["run_id"], wait_timeout)
        if run is None:
            click.echo(f"agentbox: the run is not finished after {wait_timeout:g} s", err=True)
            sys.exit(EXIT_WAIT_TIMEOUT)
        if as_json:
            click.echo(json.dumps(run, indent=2))
        else:
            click.echo("\n".join(told(run)))
        if run["status"] != "succeeded":
            sys.exit(EXIT_RUN_FAILED)


def _api(url: str, method: str, path: str, timeout: float | None = 30,
         **kwargs: Any) -> Any:
    try:
        response = httpx.request(method, url.rstrip("/") + path, timeout=timeout, **kwargs)
    except httpx.HTTPError as exc:
        raise click.ClickException(
            f"cannot reach agentbox at {url}: {exc}. Is it running (scripts/run, or "
            "agentbox serve)? Another address: --url or AGENTBOX_URL.") from None
    return _answer(url, response)


def _answer(url: str, response: httpx.Response) -> Any:
    """agentbox's JSON answer, or a ClickException that says what came instead."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict | list):  # an HTML page, say: another program's
        raise click.ClickException(
            f"{url} answered {response.status_code} with something that is not agentbox's "
            "JSON: is another program listening there? Name agentbox's address with --url "
            "or AGENTBOX_URL (for example http://127.0.0.1:8000).")
    if response.status_code >= 300:
        message = answer.get("message", "") if isinstance(answer, dict) else ""
        told = digest.one_line(str(message) or "refused")
        raise click.ClickException(f"{response.status_code}: {told}")
    return answer


@main.command()
@URL_OPTION
@click.option("--status", default=None, help="Only runs in this state.")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@CONFIG_OPTION
def runs(url: str | None, status: str | None, limit: int, as_json: bool,
         config_file: Path | None) -> None:
    """List the newest runs: project, loudness and verdict of each."""
    params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
    found = _api(client_url(url, config_file), "GET", "/runs", params=params)["runs"]
    _print_runs(found, as_json, "no runs yet" if status is None else f"no {status} runs")


RUN_COLUMNS = ("RUN", "STATUS", "PROJECT", "FILE", "LUFS", "TRUE PEAK", "VERDICT", "EVENT",
               "RETRIES", "ERROR")


def run_row(run: dict[str, Any]) -> tuple[str, ...]:
    """One run as the cells of `agentbox runs`."""
    metrics = digest.metrics_of(run.get("result"))
    loudness, peak = (metrics.get(k) for k in ("integrated_lufs", "true_peak_dbtp"))
    return (_line(run["run_id"]), _line(run["status"]), digest.project_of(run)[:32],
            digest.file_name(run)[:32],
            f"{loudness:.1f}" if isinstance(loudness, int | float) else "-",
            f"{peak:+.1f}" if isinstance(peak, int | float) else "-",
            _verdict_cell(run), _line(run["event_type"]),
            str(run["retry_count"]), _line(run["error_code"] or ""))


def _verdict_cell(run: dict[str, Any]) -> str:
    result = run.get("result")
    verdict = result.get("verdict") if isinstance(result, dict) else None
    return _line(verdict) if isinstance(verdict, str) else "-"


def _print_runs(found: list[dict[str, Any]], as_json: bool, empty: str) -> None:
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo(empty)
        return
    rows = [RUN_COLUMNS, *(run_row(run) for run in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RUN_COLUMNS))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                   .rstrip())


@main.command("dead-letters")
@URL_OPTION
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@CONFIG_OPTION
def dead_letters(url: str | None, limit: int, as_json: bool, config_file: Path | None) -> None:
    """List dead-lettered runs that wait for a decision (replay them with `agentbox
    replay RUN_ID`); those discarded on the status page are left out."""
    found = _api(client_url(url, config_file), "GET", "/runs", params={
        "status": "dead_lettered", "limit": limit, "discarded": "false"})["runs"]
    _print_runs(found, as_json, "no dead letters waiting for a decision")


@main.command()
@click.argument("run_id")
@URL_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@CONFIG_OPTION
def show(run_id: str, url: str | None, as_json: bool, config_file: Path | None) -> None:
    """Show one run: the review (verdict, figures, notes), its history and callbacks."""
    run = _api(client_url(url, config_file), "GET", f"/runs/{run_id}",
               params={"history": "1"})
    if as_json:
        click.echo(json.dumps(run, indent=2))
        return
    click.echo(f"{run['run_id']}  {run['status']}  {run['event_type']} from {run['source']} "
               f"(event {run['event_id']})")
    click.echo(f"agent {run['agent']}, attempt {run['attempt']}, retries {run['retry_count']}"
               + (f", {_line(run['error_code'])}: {_line(run['error_message'])}"
                  if run["error_code"] else ""))
    if digest.project_of(run):
        click.echo(f"project {digest.project_of(run)}")
    if digest.file_name(run):
        click.echo(f"file {digest.file_name(run)}")
    if run.get("body_removed_at"):
        click.echo(f"event body removed by retention at {run['body_removed_at']} "
                   "(the run cannot be replayed)")
    if run["correlation_id"] or run["hop"]:
        click.echo(f"chain {run['correlation_id']}, caused by {run['causation_id']}, "
                   f"hop {run['hop']}")
    click.echo("\nhistory:")
    for change in run["history"]:
        note = f"  ({_line(change['note'])})" if change["note"] else ""
        click.echo(f"  {change['at']}  {change['status']:<16} attempt {change['attempt']}{note}")
    result = run.get("result")
    if _is_review(result):
        click.echo("\n" + "\n".join(digest.review_lines(run)))
    elif result is not None:
        click.echo("\nresult: " + json.dumps(result))
    for c in run.get("callbacks", []):
        click.echo(f"callback {c['notification_id']}: {c['state']} after {c['attempts']} "
                   f"attempt(s){' - ' + _line(c['last_error']) if c['last_error'] else ''}")


def _is_review(result: Any) -> bool:
    """A result that validates as a mix review (another agent's may use its key names)."""
    from agentbox.review.model import as_review

    return as_review(result) is not None


def told(run: dict[str, Any], name: str | None = None) -> list[str]:
    """A finished run for people: the review, else its status and result as JSON."""
    result = run.get("result")
    if run.get("status") != "succeeded" or result is None or _is_review(result):
        return digest.review_lines(run, name)
    return [f"{_line(name or run['run_id'])}: succeeded", "result: " + json.dumps(result)]


def _line(value: Any) -> str:
    """Text from a run (an agent's message, an event's data) as one line of output:
    a newline in it cannot make a line of its own that looks like agentbox's."""
    return digest.one_line(value)


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
    except (StoreError, cfg.ConfigError) as exc:
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
    from agentbox.store import StoreError, engines

    settings = _settings(config_file, data_dir=data_dir, database_url=database_url)
    try:
        before, after = engines.migrate(settings)
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

    from agentbox.engine.retention import prune_store
    from agentbox.store import StoreError, StoreInUse

    settings = _settings(config_file, data_dir=data_dir, database_url=database_url)
    if settings.database_url is None and not settings.database_path.is_file():
        # Opening it would make an empty store there (a mistyped --data-dir, say).
        raise click.ClickException(f"there is no agentbox database at "
                                   f"{settings.database_path}: nothing to prune")
    try:
        report = asyncio.run(prune_store(settings, dry_run)).as_json()
    except StoreInUse:
        headers = {"Authorization": f"Bearer {cfg.admin_token(settings)}"}
        report = _api(client_url(url, config_file), "POST", "/prune", timeout=None,
                      headers=headers, json={"dry_run": dry_run})
    except (StoreError, cfg.ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from agentbox.engine.retention import report_lines

    for line in report_lines(report):
        click.echo(line)


@main.command()
@click.argument("run_ids", nargs=-1, required=True)
@URL_OPTION
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def replay(run_ids: tuple[str, ...], url: str | None, config_file: Path | None) -> None:
    """Send dead-lettered or permanently failed runs back to the queue (same run_id)."""
    url = client_url(url, config_file)
    headers = {"Authorization": f"Bearer {cfg.admin_token(_settings(config_file))}"}
    for run_id in run_ids:
        run = _api(url, "POST", f"/runs/{run_id}/replay", headers=headers)
        click.echo(f"{run['run_id']}  {run['status']}")


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
    params: dict[str, Any] = {"limit": limit, **({"state": state} if state else {})}
    found = _api(client_url(url, config_file), "GET", "/callbacks",
                 params=params)["callbacks"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for n in found:
        click.echo(f"{n['notification_id']:<60} {n['state']:<9} attempts={n['attempts']} "
                   f"{n['destination']} {n['last_error'] or ''}")


@callbacks.command("destinations")
@URL_OPTION
@CONFIG_OPTION
def callbacks_destinations(url: str | None, config_file: Path | None) -> None:
    """Every destination: active or paused, failures in a row, notifications waiting."""
    for d in _api(client_url(url, config_file), "GET",
                  "/callbacks/destinations")["destinations"]:
        reason = f" ({d['paused_reason']})" if d["paused_reason"] else ""
        click.echo(f"{d['destination']:<40} {d['state']}{reason} "
                   f"failures={d['consecutive_failures']} pending={d['pending']}")


@callbacks.command("resume")
@click.argument("destination")
@URL_OPTION
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def callbacks_resume(destination: str, url: str | None, config_file: Path | None) -> None:
    """Resume a paused destination (an origin such as https://studio.example)."""
    url = client_url(url, config_file)
    headers = {"Authorization": f"Bearer {cfg.admin_token(_settings(config_file))}"}
    found = _api(url, "POST", "/callbacks/destinations/resume", headers=headers,
                 json={"destination": destination})
    click.echo(f"{found['destination']}  {found.get('state', 'active')}")


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


@main.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@URL_OPTION
@click.option("--project", default=None, help="project_id (default: from the file name).")
@click.option("--profile", default=None, help="payload.profile for every file.")
@click.option("--source", default="watch", show_default=True)
@click.option("--settle", default=2.0, show_default=True,
              help="Seconds a file must stay unchanged to count as written.")
@click.option("--headerless-settle", default=10.0, show_default=True,
              help="Seconds unchanged for a streamed file that says nothing of its length "
              "(an MP3 without a Xing/Info frame, a CAF written to the end).")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between scans.")
@click.option("--existing", is_flag=True, help="Also send the files already there at start.")
@click.option("--once", is_flag=True, help="Scan until nothing is being written, then exit.")
@click.option("--retries", default=5, show_default=True, type=click.IntRange(0, 100),
              help="With --once: retries per file on 429, 503 and connection errors.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def watch(folder: Path, url: str | None, project: str | None, profile: str | None,
          source: str, settle: float, headerless_settle: float, interval: float,
          existing: bool, once: bool, retries: int, config_file: Path | None) -> None:
    """Watch an export folder and send session.exported for each finished mix,
    then print each review as it finishes.

    A file counts as finished when its size and modification time have stayed
    the same for --settle seconds and its header says the audio is all there
    (WAV, RF64, W64, AIFF, CAF, FLAC, Ogg's last page, an MP3's Xing/Info frame);
    a streamed file that says nothing of its length must stay unchanged for
    --headerless-settle seconds. Its event id comes from its path, size and
    content when first sent: restarting the watcher or touching the file is a
    duplicate, not a second run, and so is a file written on after it was sent
    (one export, one run); if that run's review read less than the whole file,
    the whole file is reviewed again by a mix.review_requested naming the run.
    What was sent is kept in the data dir (watch/), so a restarted watcher
    goes on where it stopped. Every format the review reads (WAV, AIFF, FLAC, MP3, Ogg, CAF, ...);
    hidden files are skipped. The project is --project, else the file's name
    without its extension (in Unicode NFC, as `send --project` keeps it).

    While agentbox cannot take a file (unreachable, busy, a signature refused
    while the secret is rotated) the file stays pending and is tried again with
    backoff, signed with the secret as it is then. With --once a file is given
    up instead, and the exit status says so as `send`'s does (1: a file was
    refused, 3: agentbox unreachable or busy).
    """
    from agentbox.desktop.watch import Watcher, state_file

    url = client_url(url, config_file)
    watcher = Watcher(folder, settle, existing, headerless_settle=headerless_settle,
                      state=state_file(_settings(config_file).data_dir, folder),
                      warn=lambda message: click.echo(f"agentbox: {message}", err=True))
    watcher.poll()  # what is there now is left alone (unless --existing, or sent unfinished)
    click.echo(f"agentbox: watching {folder.resolve()} for {url} (Ctrl-C stops)", err=True)
    try:
        if once:
            sys.exit(_watch_once(watcher, url, project, profile, source, interval, retries,
                                 config_file))
        _watch_forever(watcher, url, project, profile, source, interval, config_file)
    except KeyboardInterrupt:
        return


def _export_event(path: Path, event_id: str, project: str | None, profile: str | None,
                  source: str, again_of: str | None = None) -> bytes:
    """session.exported for a finished file; with `again_of`, the follow-up that has
    the whole file reviewed when the run `again_of` read it before it was all written."""
    from agentbox.desktop.watch import project_of
    from agentbox.events import project_name

    payload = {"project_id": project_name(project) if project else project_of(path),
               "mix_url": str(path.resolve()), **({"profile": profile} if profile else {})}
    if again_of is None:
        event = build_event("session.exported", source, event_id, payload)
    else:
        payload["requested_by"] = "agentbox watch"
        payload["note"] = (f"{path.name} was written on after run {again_of} reviewed it: "
                           "the whole file, reviewed again")
        event = build_event("mix.review_requested", source, event_id, payload)
        event["causation_id"] = again_of
    return json.dumps(event, separators=(",", ":")).encode()


def _signing_secret(config_file: Path | None) -> str:
    """The secret to sign with now: read afresh, so that a rotation is picked up."""
    return cfg.ensure_webhook_secret(_settings(config_file))[0].webhook_secret[0]


def _watch_once(watcher: Any, url: str, project: str | None, profile: str | None,
                source: str, interval: float, retries: int, config_file: Path | None) -> int:
    idle, status = 0, EXIT_OK
    while True:
        ready = watcher.poll()
        for path in ready:
            found = _event_id(watcher, path)
            if found is None:
                continue
            event_id = found[0]
            body = _export_event(path, event_id, project, profile, source)
            # After one file found agentbox unavailable, the rest are not tried.
            response = (None if status == EXIT_UNAVAILABLE else
                        deliver(url, _signing_secret(config_file), body, retries))
            watcher.sent(path, event_id)
            if response is None:
                click.echo(f"{_line(path.name)}: not sent (agentbox unavailable)", err=True)
                status = EXIT_UNAVAILABLE
                continue
            if response.status_code < 300:
                answer = response.json()
                what = "duplicate" if answer["duplicate"] else "accepted"
                click.echo(f"{_line(path.name)}: {what} {answer['run_id']}")
            else:
                click.echo(f"{_line(path.name)}: refused: {_line(response.text)}", err=True)
                status = max(status, EXIT_REFUSED)
            watcher.taken(path)
        idle = 0 if ready or watcher.busy else idle + 1
        if idle >= 2:
            return status
        time.sleep(interval)


# Refusals that heal by themselves: a signature refused while the secret is rotated
# (or the clock is off), agentbox busy or unavailable. The file waits for them.
HEALING_STATUSES = (401, *RETRYABLE_STATUSES)
FOLLOW_EVERY_SECONDS = 1.0


def _event_id(watcher: Any, path: Path) -> tuple[str, bool] | None:
    """The event_id of a finished file, and whether it is an export sent before and
    written on since (same event_id: one export, one run); else the id comes from
    its path, size and content (a touch, a restart: the same id again)."""
    from agentbox.desktop.watch import content_id

    try:
        own = content_id(path, path.stat().st_size)
    except OSError:
        return None  # gone meanwhile
    earlier = watcher.continues(path)
    if earlier is not None:
        return str(earlier.event_id), earlier.event_id != own
    return own, False


def _watch_forever(watcher: Any, url: str, project: str | None, profile: str | None,
                   source: str, interval: float, config_file: Path | None) -> None:
    from agentbox.desktop.watch import Pending, Reviewing

    pending: dict[Path, Pending] = {}
    reviewing: dict[str, Reviewing] = {}  # run_id -> its file, until its review is printed
    followed = 0.0
    while True:
        now = time.monotonic()
        for path in watcher.poll():
            found = _event_id(watcher, path)
            if found is None:
                continue
            event_id, grown = found
            pending[path] = Pending(path, event_id, grown=grown)
            watcher.sent(path, event_id)  # pending now: not again until it changes
        for item in [p for p in pending.values() if p.due <= now]:
            run_id = _try_once(item, url, project, profile, source, config_file)
            if run_id is None:
                item.later(time.monotonic())
                continue
            del pending[item.path]
            if item.again_of is None:  # a follow-up's id is not the file's
                watcher.taken(item.path)
            if run_id:
                try:
                    size = item.path.stat().st_size
                except OSError:
                    continue
                reviewing[run_id] = Reviewing(item.path.name, item.path, item.event_id, size,
                                              item.grown)
        if reviewing and now - followed >= FOLLOW_EVERY_SECONDS:
            followed = now
            for again in _print_finished_reviews(url, reviewing):
                pending.setdefault(again.path, again)
        time.sleep(interval)


def _try_once(item: Any, url: str, project: str | None, profile: str | None, source: str,
              config_file: Path | None) -> str | None:
    """One attempt at handing a file over: its run_id, '' when it was refused for
    good (or is gone), None when it should be tried again later."""
    name = _line(item.path.name)
    try:
        body = _export_event(item.path, item.event_id, project, profile, source,
                             item.again_of)
        response = send_event(url, _signing_secret(config_file), body)
        answer = response.json()
    except (OSError, httpx.TransportError) as exc:
        if not item.path.exists():
            click.echo(f"{name}: gone before agentbox took it", err=True)
            return ""
        reason = f"cannot reach agentbox at {url} ({type(exc).__name__})"
    except (click.ClickException, ValueError) as exc:  # the config, or an answer not JSON
        reason = str(exc) if isinstance(exc, click.ClickException) else "an answer not JSON"
    else:
        if response.status_code < 300:
            what = "duplicate" if answer["duplicate"] else "accepted"
            if item.grown:  # the same export, written on: its run, not a new one
                what = "written on after it was sent; still"
            elif item.again_of:
                what = f"reviewed whole again (run {item.again_of} read it unfinished):"
            click.echo(f"{name}: {what} {answer['run_id']}")
            return str(answer["run_id"])
        if response.status_code not in HEALING_STATUSES:
            click.echo(f"{name}: refused: {_line(response.text)}", err=True)
            return ""
        reason = f"{response.status_code} {_line(answer.get('error_code', ''))}"
    if reason != item.said:
        item.said = reason
        click.echo(f"{name}: waiting: {reason}; trying again with backoff", err=True)
    return None


def _print_finished_reviews(url: str, reviewing: dict[str, Any]) -> list[Any]:
    """Print the reviews that finished; the follow-ups to send for files written on
    after their run read them (their review is of less than the whole file)."""
    from agentbox.desktop.watch import Pending, follow_up_id, reviewed_whole

    again: list[Any] = []
    for run_id, item in list(reviewing.items()):
        try:
            run = httpx.get(f"{url}/runs/{run_id}", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return again  # asked again at the next turn
        if not isinstance(run, dict) or not run.get("terminal"):
            continue
        del reviewing[run_id]
        if item.grown and not reviewed_whole(run, item.size) and item.path.exists():
            again.append(Pending(item.path, follow_up_id(item.event_id, item.size),
                                 again_of=run_id))
            continue
        click.echo("\n".join(told(run, item.name)))
    return again


MCP_INSTALL = ("agentbox mcp needs the MCP Python SDK, an optional part: install it with\n"
               "    pip install 'agentbox[mcp]'\n"
               "(in the environment agentbox is installed in; from a checkout: "
               "pip install -e '.[mcp]')")
MCP_FROZEN = ("this agentbox executable was built without the MCP SDK; for agentbox mcp, "
              "install agentbox with pip: pip install 'agentbox[mcp]'")
EXIT_USAGE = 2  # as click's own usage errors


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


# -- start at login (the logic is in agentbox/service.py) ------------------------------------


@main.group()
def service() -> None:
    """Start agentbox at login: a systemd user unit, a launchd agent or a scheduled task."""


def _service(action: Callable[[Any], list[str]], config_file: Path | None = None,
             data_dir: Path | None = None) -> None:
    from agentbox.desktop import service as svc

    manager = svc.manager_for(svc.Installation.this(config_file), data_dir=data_dir)
    try:
        click.echo("\n".join(action(manager)))
    except svc.ServiceError as exc:
        raise click.ClickException(str(exc)) from None


@service.command("install")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="The config file it serves with (default: the one `serve` would read).")
@click.option("--dry-run", is_flag=True, help="Print the file it would write, and where; "
              "write nothing.")
def service_install(config_file: Path | None, dry_run: bool) -> None:
    """Start this agentbox at login (and now), with this config."""
    settings = _settings(config_file)  # a config that cannot serve is refused now
    _service(lambda m: m.install(dry_run=dry_run), config_file, settings.data_dir)


@service.command("uninstall")
def service_uninstall() -> None:
    """Stop starting agentbox at login; stop it and remove the service's file."""
    _service(lambda m: m.uninstall())


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

    run_logged(log_file, args)
