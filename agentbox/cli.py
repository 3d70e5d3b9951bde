"""`agentbox`: a thin shell over functions that tests call directly."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import httpx

from agentbox import config as cfg
from agentbox import portable
from agentbox.signing import sign_headers

DEFAULT_URL = f"http://{cfg.DEFAULT_HOST}:{cfg.DEFAULT_PORT}"


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
    from agentbox import server
    from agentbox import store as st
    from agentbox.app import create_app
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
    if secret_path is not None:
        click.echo(f"agentbox: webhook secret is in {secret_path} "
                   "(show it with: agentbox secret)", err=True)
    if callback_secret_path is not None and settings.callback_allowed + \
            settings.callback_allowed_local:
        click.echo(f"agentbox: callbacks are signed with the secret in {callback_secret_path} "
                   "(show it with: agentbox secret --callback)", err=True)
    click.echo(f"agentbox: data in {engines.describe(settings)}; listening on "
               f"http://{settings.host}:{settings.port}", err=True)
    server.run(app, host=settings.host, port=settings.port, log_config=None,
               access_log=False, loop=portable.EVENT_LOOP, http="httptools", lifespan="on",
               timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 5,
               limit_concurrency=settings.max_connections,
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
    """
    ctx.obj = config_file
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


def _secret_file(config_file: Path | None) -> Path:
    settings = _settings(config_file)
    if settings.webhook_secret:
        raise click.ClickException(
            "the webhook secrets come from AGENTBOX_WEBHOOK_SECRET or the config file: rotate "
            "them there (comma separated, the new one first)")
    return settings.config_dir / cfg.WEBHOOK_SECRET_FILE


@secret.command("rotate")
@click.pass_obj
def secret_rotate(config_file: Path | None) -> None:
    """Make a new webhook secret; the old ones keep verifying until retired."""
    path = _secret_file(config_file)
    cfg.rotate_secret(path)
    click.echo(f"a new secret signs from now on ({path}); the old one still verifies. Give "
               "senders the new one (agentbox secret), then: agentbox secret retire")


@secret.command("retire")
@click.pass_obj
def secret_retire(config_file: Path | None) -> None:
    """Stop accepting every webhook secret but the newest."""
    path = _secret_file(config_file)
    retired = cfg.retire_secrets(path)
    click.echo(f"retired {retired} old secret(s); only the newest verifies now")


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def token(config_file: Path | None) -> None:
    """Print the admin token that admin API calls (replay) need."""
    click.echo(cfg.admin_token(_settings(config_file)))


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
    return httpx.post(url.rstrip("/") + "/webhooks/events", content=body, headers=headers,
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


def follow(url: str, run_id: str, timeout: float, interval: float = 0.2) -> dict[str, Any] | None:
    """Poll a run until it is terminal; None if `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = _api(url, "GET", f"/runs/{run_id}")
        if run["terminal"]:
            return run
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


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
@click.option("--url", default=DEFAULT_URL, show_default=True, help="agentbox's address.")
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
@click.option("--wait", is_flag=True, help="Follow the run to its end and print it.")
@click.option("--wait-timeout", default=600.0, show_default=True, help="Seconds, with --wait.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def send(event_type: str | None, fields: tuple[str, ...], type_option: str | None,
         project: str | None, mix: Path | None, profile: str | None, url: str, source: str,
         event_id: str | None, payload_json: str | None, callback_url: str | None,
         event_file: Any, retries: int, wait: bool, wait_timeout: float,
         config_file: Path | None) -> None:
    """Sign and POST an event, e.g. from an export script:

    \b
        agentbox send --type session.exported --project night-drive --mix ./mix.wav
        agentbox send session.exported project_id=night-drive mix_url=/mixes/mix.wav

    Exit status: 0 stored (or already stored; with --wait: succeeded), 1 refused,
    3 agentbox unreachable or busy after the retries, 4 the run failed (--wait),
    5 the run was not finished in time (--wait).
    """
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
        for key, value in (("project_id", project), ("profile", profile),
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
        click.echo(json.dumps(run, indent=2))
        if run["status"] != "succeeded":
            sys.exit(EXIT_RUN_FAILED)


def _api(url: str, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = httpx.request(method, url.rstrip("/") + path, timeout=30, **kwargs)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach agentbox at {url}: {exc}") from None
    if response.status_code >= 300:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise click.ClickException(f"{response.status_code}: {message}")
    return response.json()


@main.command()
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--status", default=None, help="Only runs in this state.")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def runs(url: str, status: str | None, limit: int, as_json: bool) -> None:
    """List the newest runs."""
    params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
    _print_runs(_api(url, "GET", "/runs", params=params)["runs"], as_json)


def _print_runs(found: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for run in found:
        click.echo(f"{run['run_id']}  {run['status']:<16} {run['event_type']:<22} "
                   f"{run['event_id'][:30]:<30} retries={run['retry_count']} "
                   f"{_line(run['error_code'] or '')}")


@main.command("dead-letters")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def dead_letters(url: str, limit: int, as_json: bool) -> None:
    """List dead-lettered runs that wait for a decision (replay them with `agentbox
    replay RUN_ID`); those discarded on the status page are left out."""
    found = _api(url, "GET", "/runs", params={"status": "dead_lettered", "limit": limit,
                                             "discarded": "false"})["runs"]
    _print_runs(found, as_json)


@main.command()
@click.argument("run_id")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
def show(run_id: str, url: str, as_json: bool) -> None:
    """Show one run with its attempts, state history, result and callbacks."""
    run = _api(url, "GET", f"/runs/{run_id}", params={"history": "1"})
    if as_json:
        click.echo(json.dumps(run, indent=2))
        return
    click.echo(f"{run['run_id']}  {run['status']}  {run['event_type']} from {run['source']} "
               f"(event {run['event_id']})")
    click.echo(f"agent {run['agent']}, attempt {run['attempt']}, retries {run['retry_count']}"
               + (f", {_line(run['error_code'])}: {_line(run['error_message'])}"
                  if run["error_code"] else ""))
    if run["correlation_id"] or run["hop"]:
        click.echo(f"chain {run['correlation_id']}, caused by {run['causation_id']}, "
                   f"hop {run['hop']}")
    click.echo("\nhistory:")
    for change in run["history"]:
        note = f"  ({_line(change['note'])})" if change["note"] else ""
        click.echo(f"  {change['at']}  {change['status']:<16} attempt {change['attempt']}{note}")
    result = run.get("result")
    from agentbox.mix_review import as_review

    review = as_review(result)
    if review is not None:
        click.echo(f"\n{_line(review.summary)}")
        for note in review.review_notes:
            click.echo(f"  - {_line(note)}")
    elif result is not None:
        click.echo("\nresult: " + json.dumps(result))
    for c in run.get("callbacks", []):
        click.echo(f"callback {c['notification_id']}: {c['state']} after {c['attempts']} "
                   f"attempt(s){' - ' + _line(c['last_error']) if c['last_error'] else ''}")


def _line(value: Any) -> str:
    """Text from a run (an agent's message, an event's data) as one line of output:
    a newline in it cannot make a line of its own that looks like agentbox's."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


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
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def replay(run_ids: tuple[str, ...], url: str, config_file: Path | None) -> None:
    """Send dead-lettered or permanently failed runs back to the queue (same run_id)."""
    headers = {"Authorization": f"Bearer {cfg.admin_token(_settings(config_file))}"}
    for run_id in run_ids:
        run = _api(url, "POST", f"/runs/{run_id}/replay", headers=headers)
        click.echo(f"{run['run_id']}  {run['status']}")


@main.group()
def callbacks() -> None:
    """Callback deliveries: list them, see destinations, resume one, verify one."""


@callbacks.command("list")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--state", type=click.Choice(["pending", "delivered", "dead"]), default=None)
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def callbacks_list(url: str, state: str | None, limit: int, as_json: bool) -> None:
    """The newest notifications and how their delivery stands."""
    params: dict[str, Any] = {"limit": limit, **({"state": state} if state else {})}
    found = _api(url, "GET", "/callbacks", params=params)["callbacks"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for n in found:
        click.echo(f"{n['notification_id']:<60} {n['state']:<9} attempts={n['attempts']} "
                   f"{n['destination']} {n['last_error'] or ''}")


@callbacks.command("destinations")
@click.option("--url", default=DEFAULT_URL, show_default=True)
def callbacks_destinations(url: str) -> None:
    """Every destination: active or paused, failures in a row, notifications waiting."""
    for d in _api(url, "GET", "/callbacks/destinations")["destinations"]:
        reason = f" ({d['paused_reason']})" if d["paused_reason"] else ""
        click.echo(f"{d['destination']:<40} {d['state']}{reason} "
                   f"failures={d['consecutive_failures']} pending={d['pending']}")


@callbacks.command("resume")
@click.argument("destination")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def callbacks_resume(destination: str, url: str, config_file: Path | None) -> None:
    """Resume a paused destination (an origin such as https://studio.example)."""
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
@click.option("--url", default=DEFAULT_URL, show_default=True, help="agentbox's address.")
@click.option("--project", default=None, help="project_id (default: from the file name).")
@click.option("--profile", default=None, help="payload.profile for every file.")
@click.option("--source", default="watch", show_default=True)
@click.option("--settle", default=2.0, show_default=True,
              help="Seconds a file must stay unchanged to count as written.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between scans.")
@click.option("--existing", is_flag=True, help="Also send the files already there at start.")
@click.option("--once", is_flag=True, help="Scan until nothing is being written, then exit.")
@click.option("--retries", default=5, show_default=True, type=click.IntRange(0, 100),
              help="Retries per file on 429, 503 and connection errors, with backoff.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def watch(folder: Path, url: str, project: str | None, profile: str | None, source: str,
          settle: float, interval: float, existing: bool, once: bool, retries: int,
          config_file: Path | None) -> None:
    """Watch an export folder and send session.exported for each finished mix.

    A file counts as finished when its size and modification time have stayed
    the same for --settle seconds. Its event id comes from its path, size and
    content: restarting the watcher or touching the file is a duplicate, not a
    second run. WAV, FLAC and AIFF files; hidden files are skipped. While
    agentbox cannot be reached a file is tried again at the next scan; with
    --once it is given up, and the exit status says so as `send`'s does (1: a
    file was refused, 3: agentbox unreachable or busy).
    """
    from agentbox.watch import Watcher, content_id, project_of

    settings, _ = cfg.ensure_webhook_secret(_settings(config_file))
    watcher = Watcher(folder, settle, existing)
    click.echo(f"agentbox: watching {folder.resolve()} (Ctrl-C stops)", err=True)
    idle, status = 0, EXIT_OK
    try:
        while True:
            ready = watcher.poll()
            for path in ready:
                size = path.stat().st_size
                payload = {"project_id": project or project_of(path),
                           "mix_url": str(path.resolve()),
                           **({"profile": profile} if profile else {})}
                event = build_event("session.exported", source, content_id(path, size), payload)
                body = json.dumps(event, separators=(",", ":")).encode()
                # --once: after one file found agentbox unavailable, the rest are not tried.
                response = (None if once and status == EXIT_UNAVAILABLE else
                            deliver(url, settings.webhook_secret[0], body, retries))
                if response is None:
                    if not once:
                        continue  # unavailable: try again at the next scan
                    click.echo(f"{_line(path.name)}: not sent (agentbox unavailable)",
                               err=True)
                    status = EXIT_UNAVAILABLE
                elif response.status_code < 300:
                    answer = response.json()
                    what = "duplicate" if answer["duplicate"] else "accepted"
                    click.echo(f"{_line(path.name)}: {what} {answer['run_id']}")
                else:
                    click.echo(f"{_line(path.name)}: refused: {_line(response.text)}",
                               err=True)
                    status = max(status, EXIT_REFUSED)
                watcher.sent(path)
            idle = 0 if ready or watcher.busy else idle + 1
            if once and idle >= 2:
                sys.exit(status)
            time.sleep(interval)
    except KeyboardInterrupt:
        return


# -- start at login (the logic is in agentbox/service.py) ------------------------------------


@main.group()
def service() -> None:
    """Start agentbox at login: a systemd user unit, a launchd agent or a scheduled task."""


def _service(action: Callable[[Any], list[str]], config_file: Path | None = None,
             data_dir: Path | None = None) -> None:
    from agentbox import service as svc

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
    from agentbox.service import run_logged

    run_logged(log_file, args)
