"""`agentbox`: a thin shell over functions that tests call directly."""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import httpx

from agentbox import config as cfg
from agentbox.signing import sign_headers

DEFAULT_URL = f"http://{cfg.DEFAULT_HOST}:{cfg.DEFAULT_PORT}"


def _settings(config_file: Path | None = None, **overrides: Any) -> cfg.Settings:
    try:
        return cfg.load_settings(config_file, overrides=overrides)
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None


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
def serve(host: str | None, port: int | None, data_dir: Path | None,
          config_file: Path | None) -> None:
    """Receive webhooks, run agents, serve the API."""
    import uvicorn

    from agentbox.app import create_app
    from agentbox.logs import setup_logging

    settings = _settings(config_file, host=host, port=port, data_dir=data_dir)
    try:
        settings, secret_path = cfg.ensure_webhook_secret(settings)
        settings, callback_secret_path = cfg.ensure_callback_secret(settings)
        token = cfg.admin_token(settings)
        app = create_app(settings, token)
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    setup_logging(settings.log_level)
    if secret_path is not None:
        click.echo(f"agentbox: webhook secret is in {secret_path} "
                   "(show it with: agentbox secret)", err=True)
    if callback_secret_path is not None and settings.callback_allowed + \
            settings.callback_allowed_local:
        click.echo(f"agentbox: callbacks are signed with the secret in {callback_secret_path} "
                   "(show it with: agentbox secret --callback)", err=True)
    click.echo(f"agentbox: data in {settings.data_dir}; listening on "
               f"http://{settings.host}:{settings.port}", err=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None,
                access_log=False, loop="uvloop", http="httptools", lifespan="on",
                timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 5)


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
@click.option("--path", "show_path", is_flag=True, help="Print where the secret is kept.")
@click.option("--callback", is_flag=True,
              help="The secret callbacks are signed with, for their receivers.")
def secret(config_file: Path | None, show_path: bool, callback: bool) -> None:
    """Print the webhook secret that senders sign with (made on first use)."""
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
@click.option("--url", default=DEFAULT_URL, show_default=True, help="agentbox's address.")
@click.option("--source", default="cli", show_default=True)
@click.option("--event-id", default=None, help="Default: a new random id.")
@click.option("--payload", "payload_json", default=None, help="The payload as JSON.")
@click.option("--callback-url", default=None)
@click.option("--file", "event_file", type=click.File("rb"), default=None,
              help="Send this complete event (JSON) as it is, '-' for stdin.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def send(event_type: str | None, fields: tuple[str, ...], url: str, source: str,
         event_id: str | None, payload_json: str | None, callback_url: str | None,
         event_file: Any, config_file: Path | None) -> None:
    """Sign and POST an event, e.g. for an export script:

        agentbox send session.exported project_id=night-drive mix_url=/mixes/night-drive.wav
    """
    if event_file is not None:
        body = event_file.read()
    else:
        if not event_type:
            raise click.UsageError("give EVENT_TYPE (or --file)")
        payload = _parse_fields(fields)
        if payload_json:
            try:
                payload.update(json.loads(payload_json))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise click.BadParameter(f"not a JSON object: {exc}",
                                         param_hint="--payload") from None
        event = build_event(event_type, source, event_id or uuid.uuid4().hex, payload,
                            callback_url)
        body = json.dumps(event, separators=(",", ":")).encode()
    settings, _ = cfg.ensure_webhook_secret(_settings(config_file))
    try:
        response = send_event(url, settings.webhook_secret[0], body)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach agentbox at {url}: {exc}") from None
    click.echo(response.text)
    if response.status_code >= 300:
        sys.exit(1)


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
    found = _api(url, "GET", "/runs", params=params)["runs"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for run in found:
        click.echo(f"{run['run_id']}  {run['status']:<16} {run['event_type']:<22} "
                   f"{run['event_id'][:30]:<30} retries={run['retry_count']} "
                   f"{run['error_code'] or ''}")


@main.command("dead-letters")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--limit", default=50, show_default=True)
@click.pass_context
def dead_letters(ctx: click.Context, url: str, limit: int) -> None:
    """List dead-lettered runs (replay them with `agentbox replay RUN_ID`)."""
    ctx.invoke(runs, url=url, status="dead_lettered", limit=limit, as_json=False)


@main.command()
@click.argument("run_id")
@click.option("--url", default=DEFAULT_URL, show_default=True)
def show(run_id: str, url: str) -> None:
    """Show one run with its attempts and state history."""
    click.echo(json.dumps(_api(url, "GET", f"/runs/{run_id}", params={"history": "1"}),
                          indent=2))


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None)
def verify(data_dir: Path | None, config_file: Path | None) -> None:
    """Check the store's integrity (read-only; safe while the server runs)."""
    from agentbox.store import StorageUnavailable
    from agentbox.store.sqlite import verify_database

    settings = _settings(config_file, data_dir=data_dir)
    try:
        problems = verify_database(settings.database_path)
    except StorageUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    for problem in problems:
        click.echo(problem)
    if problems:
        sys.exit(1)
    click.echo(f"{settings.database_path}: ok")


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
