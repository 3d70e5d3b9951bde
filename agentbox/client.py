"""A running agentbox, from Python: send events and exports, follow runs, read them.

    from agentbox.client import Client

    with Client() as box:  # finds agentbox as the `agentbox` command does
        answer = box.send_export("exports/night-drive.wav")
        run = box.follow(answer.run_id, timeout=300)
        print(run.status, run.result["verdict"])

`Client(url=None, secret=None, admin_token=None)` finds agentbox as the CLI does:
`url`, else AGENTBOX_URL, else the host and port `agentbox serve` reads from the
config file; it signs with `secret`, else the webhook secret of this machine's
configuration (read afresh for each event, so a rotation is picked up); admin
calls (replay) carry `admin_token`, else AGENTBOX_ADMIN_TOKEN or the token file.
Every method answers a typed model of agentbox.models (a run is a `RunDetail` or a
`RunView`, read by attribute; `.as_json()` is the answer as agentbox sent it);
every failure is an `AgentboxError`, one of the typed errors below (`Unreachable`,
`Refused`, `NotFound`, `FileUnreadable`, ...). Sending retries on 429, 503 and a
connection that fails (`retries` times, with backoff); `follow` waits out a
restart; nothing else is tried twice. Waiting (a busy or restarting agentbox) is
told to the `progress` callback, never printed. One Client keeps one HTTP
connection alive; close it, or use it in a `with`. To a loopback address, each new
connection first has the server prove it holds this user's admin token
(agentbox.proof): a listener that cannot gets nothing, and the call raises
`NotProven`. A configuration another account can change raises `NotTrusted`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import ssl
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload
from urllib.parse import parse_qs, quote, urlsplit

import httpcore
import httpx

from agentbox import config as cfg
from agentbox import ownership, proof
from agentbox.logs import one_line
from agentbox.runs import RunStatus
from agentbox.signing import RECEIVER_PATH as RECEIVER_PATH  # its name here too, as before
from agentbox.signing import sign_headers

# The answers' models, importable from here too (the apps' as they were from
# agentbox.models before the apps owned them). Each is imported where it is read or
# named (module __getattr__): pydantic's import alone took half of what `agentbox
# runs` took, which reads its runs as sent (`runs_json`) and builds no model.
ANSWERS = {name: "agentbox.models" for name in (
    "Accepted", "Answer", "Destinations", "LoginLink", "Notifications", "Pruned", "Resumed",
    "RunDetail", "RunList", "RunView")}
ANSWERS.update({name: "agentbox.desktop.answers" for name in ("WatchedFolderOut", "WatchState")})
ANSWERS.update({name: "agentbox.review.answers" for name in (
    "ExportList", "ExportView", "OctaveBandOut", "ProjectChanged", "ReferenceList",
    "ReferenceOut", "ReferenceRemoved")})
if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentbox.desktop.answers import WatchedFolderOut as WatchedFolderOut
    from agentbox.desktop.answers import WatchState as WatchState
    from agentbox.models import Accepted as Accepted
    from agentbox.models import Answer as Answer
    from agentbox.models import Destinations as Destinations
    from agentbox.models import LoginLink as LoginLink
    from agentbox.models import Notifications as Notifications
    from agentbox.models import Pruned as Pruned
    from agentbox.models import Resumed as Resumed
    from agentbox.models import RunDetail as RunDetail
    from agentbox.models import RunList as RunList
    from agentbox.models import RunView as RunView
    from agentbox.review.answers import ExportList as ExportList
    from agentbox.review.answers import ExportView as ExportView
    from agentbox.review.answers import OctaveBandOut as OctaveBandOut
    from agentbox.review.answers import ProjectChanged as ProjectChanged
    from agentbox.review.answers import ReferenceList as ReferenceList
    from agentbox.review.answers import ReferenceOut as ReferenceOut
    from agentbox.review.answers import ReferenceRemoved as ReferenceRemoved
else:
    def __getattr__(name: str) -> Any:
        """An answer's model, imported when it is first named."""
        if name not in ANSWERS:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        found = getattr(importlib.import_module(ANSWERS[name]), name)
        globals()[name] = found
        return found

DEFAULT_URL = f"http://{cfg.DEFAULT_HOST}:{cfg.DEFAULT_PORT}"
URL_ENV = "AGENTBOX_URL"  # the client's agentbox, between the config file and `url`
# Where a running `agentbox serve` says it listens (`runtime_file`), and how long a
# client tries the address it names before taking it for a server that is gone.
RUNTIME_FILE = "server.json"
RUNTIME_CHECK_SECONDS = 0.5
DEFAULT_RETRIES = 5  # sending: 0.5, 1, 2, 4, 8 s apart (or as Retry-After says)
DEFAULT_TIMEOUT = 30.0
LIVE_TIMEOUT = 60.0  # the page's stream pings every 15 s: silent this long, it is lost
# Sending a reference track: the file goes up whole, then agentbox measures it before
# it answers (a long track takes a few seconds of the analysis process).
REFERENCE_TIMEOUT = 300.0
RETRYABLE_STATUSES = (429, 503)  # busy, unavailable: worth sending again later

# Following a run: the first look soon (a short review is told at once), then less
# and less often, down to one request a second over the kept-alive connection: a
# long wait beside a DAW costs next to nothing. A restart of agentbox meanwhile (the
# run is given back and taken up again) is waited out for FOLLOW_UNREACHABLE_SECONDS.
FOLLOW_FIRST_SECONDS = 0.1
FOLLOW_MAX_SECONDS = 1.0
FOLLOW_UNREACHABLE_SECONDS = 30.0
DEFAULT_FOLLOW_SECONDS = 600.0

# Run ids are made by the store as `run_` and hexadecimal digits (a millisecond
# clock, then random ones; older ones a UUID's hex). Letters, digits and `_` are
# all a run id may hold: nothing that could reach another path of the API.
RUN_ID = re.compile(r"run_[A-Za-z0-9_]{1,252}")
# What `lookup` takes for the start of a run id without its `run_` (as `agentbox
# runs` shows them): hexadecimal digits. A word made of them ("cafe") that starts
# no run id, or several while a project has that name, is the project's.
BARE_PREFIX = re.compile(r"[0-9a-f]{1,252}")

Progress = Callable[[str], None]
Model = TypeVar("Model", bound="Answer")
Result = TypeVar("Result", bound="BaseModel")  # an agent's result model (Client.run's result=)


def _detail(result: type[BaseModel] | None) -> type[RunDetail[Any]]:
    """RunDetail, or RunDetail[result]: a run whose result is read into that model."""
    from agentbox.models import RunDetail

    return RunDetail if result is None else cast(Any, RunDetail)[result]


# -- errors -------------------------------------------------------------------------------------


class AgentboxError(Exception):
    """What went wrong, as a sentence that says what to do."""


class BadAddress(AgentboxError, ValueError):
    """The address given is not one agentbox could be at (not http(s)://host:port)."""


class Misconfigured(AgentboxError):
    """The configuration (its file, the secret or token files) cannot be read."""


class NotTrusted(Misconfigured):
    """A file or folder of the configuration (the config file, the token or a secret
    file, the config, data or runtime folder) can be changed by another account
    (agentbox.ownership): nothing is read from it, nothing sent."""


class InvalidRunId(AgentboxError, ValueError):
    """Not a run id (they look like run_0192f3a4b5c6...): never put into a path."""


class Unreachable(AgentboxError):
    """agentbox could not be reached, or stayed busy (429) or unavailable (503)
    through the retries. `status` and `error_code` are the last answer's (None when
    nothing answered); `reason` says it in a few words, `detail` in agentbox's own
    (its answer's message: why it cannot store events, say); `retry_after` the
    seconds agentbox asked to wait (Retry-After, 0 if it did not say)."""

    def __init__(self, message: str, reason: str, status: int | None = None,
                 error_code: str | None = None, retry_after: float = 0.0,
                 detail: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.error_code = error_code
        self.retry_after = retry_after
        self.detail = detail


class NotAgentbox(AgentboxError):
    """Something answered at the address that is not agentbox (another program)."""


class NotProven(AgentboxError):
    """What listens at agentbox's loopback address did not prove it is the user's
    agentbox (agentbox.proof): another account's program, say, on the port of a
    stopped agentbox. Nothing was sent to it: no token, no event, no request."""


class UnexpectedAnswer(NotAgentbox):
    """JSON came that is not the answer agentbox gives (a field missing, or of
    another type): another program, or an agentbox far from this client's version.
    `answer` is the JSON."""

    def __init__(self, message: str, answer: Any) -> None:
        super().__init__(message)
        self.answer = answer


class FileUnreadable(AgentboxError, OSError):
    """A file to send cannot be read (there is none at the path, say): `filename`,
    `strerror` and `errno` as an OSError has them."""

    def __str__(self) -> str:
        return f"cannot read {self.filename}: {self.strerror}"


def _cannot_keep(what: str, variable: str, exc: OSError) -> Misconfigured:
    """A credential made on first use that could not be written where it is kept."""
    return Misconfigured(f"{what} cannot be kept in {exc.filename or 'the config directory'}"
                         f": {exc.strerror or exc}; give it in {variable}, or make the "
                         "config directory writable")


def _unreadable(exc: OSError) -> FileUnreadable:
    return FileUnreadable(exc.errno, exc.strerror or type(exc).__name__, exc.filename)


class Refused(AgentboxError):
    """agentbox answered with an error: `status` (HTTP), `error_code`, `message`,
    `errors` (field errors of a refused event: `loc`, `msg`), `answer` (the JSON)."""

    def __init__(self, status: int, answer: Mapping[str, Any], body: str = "") -> None:
        self.status = status
        self.answer = dict(answer)
        self.body = body or json.dumps(self.answer)
        code, message = answer.get("error_code"), answer.get("message")
        self.error_code = code if isinstance(code, str) else None
        self.message = message if isinstance(message, str) else ""
        errors = answer.get("errors")
        self.errors: list[dict[str, Any]] = [e for e in errors if isinstance(e, dict)] \
            if isinstance(errors, list) else []
        super().__init__(f"{status}: {one_line(self.message or 'refused')}")


class NotFound(Refused):
    """404: no such run, project or path."""


class Ambiguous(AgentboxError, LookupError):
    """A prefix that starts several run ids: `run_ids`, newest first."""

    def __init__(self, message: str, run_ids: list[str]) -> None:
        super().__init__(message)
        self.run_ids = run_ids


class NotFinished(AgentboxError, TimeoutError):
    """`follow` ran out of time; `run` is the run as last seen (not terminal)."""

    def __init__(self, message: str, run: RunDetail | None) -> None:
        super().__init__(message)
        self.run = run


# -- where agentbox is ------------------------------------------------------------------------


def base_url(url: str, where: str = "url") -> str:
    """agentbox's address as a base URL; one naming the receiver's endpoint is taken
    for the server it belongs to. BadAddress if it cannot be agentbox's."""
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
        raise BadAddress(f"{where}: {one_line(url)[:80]!r} is not agentbox's address; "
                         f"give one such as {DEFAULT_URL}")
    return base


def find_url(url: str | None = None, config_file: Path | None = None,
             environ: Mapping[str, str] | None = None, where: str = "url") -> str:
    """agentbox's address: `url`, else AGENTBOX_URL, else where the running server of
    this configuration's data directory says it listens (its runtime file), else the
    host and port that `agentbox serve` reads from the config file (and
    AGENTBOX_HOST / AGENTBOX_PORT)."""
    environ = os.environ if environ is None else environ
    if url is not None:
        return base_url(url, where)
    if environ.get(URL_ENV, "").strip():
        return base_url(environ[URL_ENV], URL_ENV)
    settings = load_settings(config_file)
    check_runtime_folder(settings.data_dir)
    return recorded_url(settings.data_dir) or configured_url(settings)


def runtime_file(data_dir: Path) -> Path:
    """Where the server of `data_dir` records its address while it runs: in the
    user's runtime directory (platformdirs: private to the user, emptied at logout
    or restart), one file per data directory; in the data directory itself where
    there is no such directory (platformdirs then falls back to one of its own in
    the shared temporary directory, made by whichever process asks first)."""
    import platformdirs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fall-back's warning: handled here
        folder = Path(platformdirs.user_runtime_dir("agentbox", appauthor=False))
    if folder.parent.parent == Path(tempfile.gettempdir()):
        return data_dir / RUNTIME_FILE
    key = hashlib.sha256(str(data_dir.expanduser().absolute()).encode()).hexdigest()[:16]
    return folder / f"server-{key}.json"


def recorded_url(data_dir: Path) -> str | None:
    """The address the running server of `data_dir` recorded, if it is still
    listening there (a server killed outright leaves its file behind)."""
    try:
        found = json.loads(runtime_file(data_dir).read_text(encoding="utf-8"))
        url = base_url(str(found["url"]), "the runtime file")
    except (OSError, ValueError, KeyError, TypeError, BadAddress):
        return None
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80),
                                      timeout=RUNTIME_CHECK_SECONDS):
            return url
    except OSError:
        return None


def configured_url(settings: cfg.Settings) -> str:
    """The address `agentbox serve` listens on with these settings, as a client
    reaches it (a server bound to every address is reached on loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host,
                                                                     settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def load_settings(config_file: Path | None) -> cfg.Settings:
    """The configuration, as `agentbox serve` reads it: Misconfigured when it cannot be
    read, NotTrusted when another account can change it (agentbox.ownership)."""
    try:
        settings = cfg.load_settings(config_file)
        ownership.check(settings, config_file)
    except cfg.ConfigError as exc:
        raise Misconfigured(str(exc)) from None
    except ownership.Untrusted as exc:
        raise NotTrusted(str(exc)) from None
    return settings


def check_runtime_folder(data_dir: Path) -> None:
    """NotTrusted when the folder of the server's address file is another account's: its
    file would name that account's address (and no port is guessed instead)."""
    try:
        ownership.check_path(runtime_file(data_dir).parent)
    except ownership.Untrusted as exc:
        raise NotTrusted(str(exc)) from None


# -- events -------------------------------------------------------------------------------------


def project_name(name: str) -> str:
    """A project's name as agentbox keeps it (events.nfc_name: Unicode NFC); the events'
    module, with its models, is imported when an event is made, not by every client."""
    from agentbox.events import nfc_name

    return nfc_name(name)


def build_event(event_type: str, source: str, event_id: str, payload: dict[str, Any],
                callback_url: str | None = None) -> dict[str, Any]:
    """An envelope of the current schema (SCHEMA_VERSION) with its idempotency key
    derived from source, type and id."""
    from agentbox.events import SCHEMA_VERSION

    event: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
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


def content_id(path: Path, size: int, modified_ns: int | None = None) -> str:
    """The event_id of a finished file: its absolute path, size, modification time
    and content. The same file sent again unchanged is a duplicate (its first run);
    what a changed one is (a touch, a render written again) agentbox decides by its
    bytes (agentbox.review.renders: its project's latest export's bytes are that
    export)."""
    stamp = "" if modified_ns is None else f"{modified_ns}\0"
    digest = hashlib.sha256(f"{path.resolve()}\0{size}\0{stamp}".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "watch-" + digest.hexdigest()[:40]


def export_id(path: Path, project: str | None = None, **asked: Any) -> str:
    """The event_id of a rendered file sent for review: the file's (content_id: its
    path, size, modification time and content), and what was asked of it (the
    project, stage, profile, other fields), so that the same file sent again
    unchanged, the same way, is a duplicate that answers the first review. Whatever
    the id, the very bytes of the project's latest export are that export (the
    review's rule, agentbox.review.renders). Asked nothing, it is the id `watch`
    gives the file (a file sent both ways is one export)."""
    stat = path.stat()
    found = content_id(path, stat.st_size, stat.st_mtime_ns)
    if project is None and not asked:
        return found
    how = json.dumps({"project": project, **asked}, sort_keys=True, ensure_ascii=False)
    return f"{found}-{hashlib.sha256(how.encode()).hexdigest()[:12]}"


def project_of(path: Path) -> str:
    """A file's project, as the review names it (agentbox.review.contract's
    project_of_file): its stem, in NFC, else "mix"."""
    from agentbox.events import name_of_file

    return name_of_file(path, "mix")


def export_event(path: Path, event_id: str, project: str | None = None,
                 source: str = "client", **payload_fields: Any) -> dict[str, Any]:
    """session.exported for a rendered file: the project is `project` (in NFC), else
    the file's name; `mix_url` its absolute path."""
    payload = {"project_id": project_name(project) if project else project_of(path),
               "mix_url": str(path.resolve()), **payload_fields}
    return build_event("session.exported", source, event_id, payload)


# RunView's fields: the JSON types each may hold, and whether an answer must carry it
# (tests/test_client_library.py holds the table to the model). What `runs_json`
# checks a listing by, where `runs` builds a model of each run.
_TEXT, _TEXT_OR_NULL, _NUMBER, _ANY = (str,), (str, type(None)), (int,), (object,)
RUN_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "run_id": (_TEXT, True), "status": (_TEXT, True), "event_id": (_TEXT, True),
    "event_type": (_TEXT, True), "source": (_TEXT, True), "agent": (_TEXT, True),
    "idempotency_key": (_TEXT, True), "webhook_id": (_TEXT_OR_NULL, False),
    "accepted_at": (_TEXT, True), "started_at": (_TEXT_OR_NULL, True),
    "updated_at": (_TEXT, True), "completed_at": (_TEXT_OR_NULL, True),
    "attempt": (_NUMBER, True), "retry_count": (_NUMBER, True),
    "next_attempt_at": (_TEXT_OR_NULL, True), "result": (_ANY, True),
    "error_code": (_TEXT_OR_NULL, True), "error_message": (_TEXT_OR_NULL, True),
    "replays": (_NUMBER, True), "correlation_id": (_TEXT_OR_NULL, True),
    "causation_id": (_TEXT_OR_NULL, True), "hop": (_NUMBER, True),
    "terminal": ((bool,), True), "file": (_TEXT_OR_NULL, False)}
RUN_STATES = frozenset(status.value for status in RunStatus)


def listed_runs(answer: Any) -> list[dict[str, Any]] | None:
    """A GET /runs answer's runs as sent, when each has RunView's fields with their
    types (an app's added fields too, unchecked); None when not."""
    runs = answer.get("runs") if isinstance(answer, dict) else None
    if not isinstance(runs, list):
        return None
    for run in runs:
        if not isinstance(run, dict):
            return None
        for name, (types, required) in RUN_FIELDS.items():
            if name not in run:
                if required:
                    return None
            elif not isinstance(run[name], types) or (
                    isinstance(run[name], bool) and bool not in types and object not in types):
                return None
        if run["status"] not in RUN_STATES:
            return None
    return runs


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise InvalidRunId(f"{one_line(run_id)[:80]!r} is not a run id (they look like "
                           "run_0192f3a4b5c6d7e8f9a0b1c2d3e4f5a6)")
    return run_id


def segment(value: str) -> str:
    """One path segment, every character that means something in a URL quoted."""
    return quote(value, safe="")


# -- the client -------------------------------------------------------------------------------


class Client:
    """A running agentbox (see the module's text)."""

    def __init__(self, url: str | None = None, secret: str | None = None,
                 admin_token: str | None = None, *, config_file: Path | None = None,
                 environ: Mapping[str, str] | None = None, retries: int = DEFAULT_RETRIES,
                 timeout: float = DEFAULT_TIMEOUT, progress: Progress | None = None) -> None:
        self.config_file = config_file
        self._environ = os.environ if environ is None else environ
        self.url = find_url(url, config_file, self._environ)
        self._secret = secret
        self._admin_token = admin_token
        self.retries = retries
        self.progress: Progress = progress or (lambda message: None)
        parts = urlsplit(self.url)
        proving = parts.scheme == "http" and cfg.is_loopback_host(parts.hostname or "")
        # To loopback, no proxy of the environment's (HTTP_PROXY): the token would
        # go to the proxy, unproved
        self._http = httpx.Client(timeout=timeout, transport=self._transport(proving),
                                  trust_env=not proving)

    def _transport(self, proving: bool) -> httpx.HTTPTransport:
        """httpx's transport; `proving` (to a loopback address over http), each new
        connection proves the server first (agentbox.proof)."""
        if not proving:
            return httpx.HTTPTransport()
        # Plain http to this machine has no TLS: a context that trusts no certificate
        # (loading the system's, as httpx's default does, took 0.02 s of CPU, a tenth
        # of `agentbox runs`), so nothing through it can pass for verified.
        transport = httpx.HTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        # httpx names no door for a network backend: its pool's is set here
        pool = transport._pool
        pool._network_backend = _ProvingBackend(pool._network_backend, self._proof_token,
                                                self.url)
        return transport

    def _proof_token(self) -> str | None:
        """The token a server must prove it holds; None when this client has none (a
        sender's configuration, with the webhook secret alone: none is made for it
        here, as an admin call would)."""
        try:
            if self._admin_token is None and not self._environ.get(
                    cfg.env_name("admin_token"), "").strip():
                kept = load_settings(self.config_file).config_dir / cfg.ADMIN_TOKEN_FILE
                if not kept.exists():
                    return None
            return self._token()
        except NotTrusted:
            raise  # nothing is sent, proved or not
        except Misconfigured:
            return None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # -- credentials (read when needed: reading runs needs neither) --

    def signing_secret(self) -> str:
        """The secret events are signed with: given, else the configured one, read
        afresh (made on first use, as `agentbox secret` does)."""
        if self._secret is not None:
            return self._secret
        try:
            settings, _ = cfg.ensure_webhook_secret(load_settings(self.config_file))
        except cfg.ConfigError as exc:
            raise Misconfigured(str(exc)) from None
        except OSError as exc:  # the config directory, where it is made, is not writable
            raise _cannot_keep("the webhook secret", "AGENTBOX_WEBHOOK_SECRET", exc) from None
        return settings.webhook_secret[0]

    def _token(self) -> str:
        """The admin token: given, else the user's own (read afresh)."""
        if self._admin_token is not None:
            return self._admin_token
        try:
            return cfg.admin_token(load_settings(self.config_file), self._environ)
        except cfg.ConfigError as exc:
            raise Misconfigured(str(exc)) from None
        except OSError as exc:
            raise _cannot_keep("the admin token", "AGENTBOX_ADMIN_TOKEN", exc) from None

    def _admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token()}"}

    # -- sending --

    def send(self, event: Mapping[str, Any], *, retries: int | None = None) -> Accepted:
        """Sign and POST an event (an envelope, see `build_event`): agentbox's answer
        (`run_id`, `status`, `duplicate`, `runs`). Busy, unavailable or unreachable:
        tried again with backoff (`retries` times), then Unreachable."""
        return self.send_body(json.dumps(event, separators=(",", ":")).encode(),
                              retries=retries)

    def send_export(self, path: str | os.PathLike[str], project: str | None = None, *,
                    source: str = "client", retries: int | None = None,
                    genre: str | None = None, **payload_fields: Any) -> Accepted:
        """Send a rendered mix for review (session.exported): the project from the
        file's name unless given; its id from the file's content and what was asked
        of it (export_id), so the same file sent again the same way is a duplicate
        of its first run. `genre`: the music's genre for the tonal advice
        (payload.genre; one agentbox does not know is Refused, invalid_event on the
        field). `payload_fields`: more of the payload (profile=..., stage=...).
        FileUnreadable: no file there, or not one to read."""
        if genre is not None:
            payload_fields["genre"] = genre
        file = Path(path).expanduser()
        try:
            event_id = export_id(file, project, **payload_fields)
        except OSError as exc:
            raise _unreadable(exc) from None
        event = export_event(file, event_id, project, source, **payload_fields)
        return self.send(event, retries=retries)

    def send_body(self, body: bytes, *, retries: int | None = None) -> Accepted:
        """POST `body` exactly as given, signed afresh for each try."""
        retries = self.retries if retries is None else retries
        delay, told = 0.5, set()
        for attempt in range(retries + 1):
            try:
                return self.post_event(body)
            except Unreachable as exc:
                if attempt == retries:
                    raise
                wait = max(delay, exc.retry_after)
                # the first time: agentbox's own reason why it cannot store events, or
                # how to start it when nothing answers (the retries wait for a restart)
                first = exc.reason not in told
                said = f"{exc.reason} ({exc.detail})" if first and exc.status == 503 \
                    and exc.detail else exc.reason
                hint = f". {START_HINT}" if first and exc.status is None else ""
                told.add(exc.reason)
                self.progress(f"{said}; trying again in {wait:g} s{hint}")
                time.sleep(wait)
                delay = min(delay * 2, 30.0)
        raise AssertionError("unreachable")  # the loop returns or raises

    def post_event(self, body: bytes) -> Accepted:
        """One try: the answer, or Unreachable (worth trying again), or Refused."""
        from agentbox.models import Accepted

        headers = {"Content-Type": "application/json",
                   **sign_headers(self.signing_secret(), body, int(time.time()))}
        try:
            response = self._http.post(self.url + RECEIVER_PATH, content=body,
                                       headers=headers)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        if response.status_code in RETRYABLE_STATUSES:
            raise _busy(response, self.url)
        return self._read(Accepted, self._answer(response))

    # -- reading runs --

    @overload
    def run(self, run_id: str, *, history: bool = False) -> RunDetail: ...

    @overload
    def run(self, run_id: str, *, history: bool = False,
            result: type[Result]) -> RunDetail[Result]: ...

    def run(self, run_id: str, *, history: bool = False,
            result: type[BaseModel] | None = None) -> RunDetail[Any]:
        """GET /runs/{run_id}; with `history`, its attempts and state changes too. The
        result is a JSON object, or read into `result`, the model of the agent that
        made it (`result=MixReview`): None until the run succeeded."""
        return self._read(_detail(result), self._get(
            f"/runs/{segment(check_run_id(run_id))}",
            params={"history": "1"} if history else None))

    def lookup(self, ref: str, *, history: bool = False, projects: bool = True
               ) -> RunDetail:
        """The run `ref` names: a run id, the start of one (`run_01a2...`, or its
        hexadecimal digits alone, as `agentbox runs` shows them) that no other run
        id starts with, else (with `projects`) a project's name: its latest export.
        NotFound when nothing is so named; Ambiguous for a prefix of several."""
        prefix = ref if RUN_ID.fullmatch(ref) else \
            f"run_{ref}" if BARE_PREFIX.fullmatch(ref) else None
        if prefix is not None:
            found = [run.run_id for run in self.runs(2, prefix=prefix).runs
                     if run.run_id.startswith(prefix)]  # an older agentbox ignores it
            if ref in found or len(found) == 1:
                return self.run(ref if ref in found else found[0], history=history)
            if found:
                if projects:  # a project so named wins over a prefix of several ids
                    with contextlib.suppress(NotFound):
                        return self._latest_export(ref, history)
                raise Ambiguous(f"{one_line(ref)!r} starts the ids of several runs: "
                                f"{', '.join(found)}, ...; give more of it", found)
        if projects:
            return self._latest_export(ref, history)
        raise NotFound(404, {"error_code": "run_not_found",
                             "message": f"No run id starts with {one_line(ref)[:100]!r}."})

    def _latest_export(self, project: str, history: bool) -> RunDetail:
        """The project's latest export; for a project with none (each file it was
        sent could not be reviewed: no audio, no export), its latest run, as
        `agentbox runs` lists it under that project."""
        try:
            export = self.exports(project, limit=1).exports[0]
        except NotFound:  # no export (the export's run gone by retention is another 404)
            export = None
        if export is not None:
            return self.run(export.run_id, history=history)
        # Checked by its `project`: an agentbox without the review ignores the filter.
        latest = [run for run in self.runs(1, project=project).runs
                  if run.get("project") == project]
        if latest:
            return self.run(latest[0].run_id, history=history)
        raise NotFound(404, {"error_code": "not_found", "message": (
            f"No run id starts with {one_line(project)[:100]!r}, and no project "
            "has that name.")})

    def runs(self, limit: int = 50, status: str | None = None,
             **filters: str) -> RunList:
        """GET /runs: `.runs`, newest first. `filters`: the API's other query
        parameters (correlation_id=..., discarded="false", prefix=...)."""
        from agentbox.models import RunList

        return self._read(RunList, self._runs_answer(limit, status, filters))

    def runs_json(self, limit: int = 50, status: str | None = None,
                  **filters: str) -> list[dict[str, Any]]:
        """`runs`, each run the JSON object agentbox sent: checked for RunView's
        fields and their types, no model built (what `agentbox runs` lists, without
        pydantic's import). UnexpectedAnswer, as `runs`, for an answer of another shape."""
        answer = self._runs_answer(limit, status, filters)
        listed = listed_runs(answer)
        if listed is None:  # the model says what is amiss (or reads what it may)
            from agentbox.models import RunList

            listed = [run.as_json() for run in self._read(RunList, answer).runs]
        return listed

    def _runs_answer(self, limit: int, status: str | None, filters: Mapping[str, str]) -> Any:
        """GET /runs's JSON answer, as `runs` and `runs_json` ask it."""
        params = {"limit": limit, **({"status": status} if status else {}), **filters}
        return self._get("/runs", params=params)

    @overload
    def follow(self, run_id: str, timeout: float = DEFAULT_FOLLOW_SECONDS, *,
               unreachable_timeout: float = FOLLOW_UNREACHABLE_SECONDS,
               sleep: Callable[[float], None] = time.sleep) -> RunDetail: ...

    @overload
    def follow(self, run_id: str, timeout: float = DEFAULT_FOLLOW_SECONDS, *,
               unreachable_timeout: float = FOLLOW_UNREACHABLE_SECONDS,
               sleep: Callable[[float], None] = time.sleep,
               result: type[Result]) -> RunDetail[Result]: ...

    def follow(self, run_id: str, timeout: float = DEFAULT_FOLLOW_SECONDS, *,
               unreachable_timeout: float = FOLLOW_UNREACHABLE_SECONDS,
               sleep: Callable[[float], None] = time.sleep,
               result: type[BaseModel] | None = None) -> RunDetail[Any]:
        """The run once it is terminal (succeeded, failed_permanent, dead_lettered),
        its result read as `run` reads it (`result=`). NotFinished after `timeout`
        seconds; an agentbox gone meanwhile is waited for (told to `progress`) up to
        `unreachable_timeout`, then Unreachable."""
        path = f"/runs/{segment(check_run_id(run_id))}"
        deadline = time.monotonic() + timeout
        interval, lost_since = FOLLOW_FIRST_SECONDS, None
        run: RunDetail[Any] | None = None
        model = _detail(result)
        headers = self._read_headers()
        while True:
            try:
                response = self._http.get(self.url + path, headers=headers)
            except httpx.TransportError as exc:
                lost_since = self._lost(exc, lost_since, unreachable_timeout)
            else:
                if lost_since is not None:
                    self.progress("reachable again; following the run")
                    lost_since = None
                run = self._read(model, self._answer(response))
                if run.terminal:
                    return run
            if time.monotonic() > deadline:
                raise NotFinished(f"run {run_id} is not finished after {timeout:g} s", run)
            sleep(interval)
            interval = min(interval * 1.5, FOLLOW_MAX_SECONDS)

    def _lost(self, exc: Exception, since: float | None, patience: float) -> float:
        now = time.monotonic()
        if since is None:
            self.progress(f"cannot reach agentbox at {self.url} ({type(exc).__name__}); "
                          "waiting for it")
            return now
        if now - since >= patience:
            raise Unreachable(f"cannot reach agentbox at {self.url} for {patience:g} s: "
                              f"{exc}", f"cannot reach agentbox at {self.url}") from None
        return since

    def login_link(self, next_path: str | None = None) -> str:
        """A one-time login link to the page (it opens a session in one browser, once,
        within minutes), showing `next_path` (e.g. a review's page) once logged in.
        Needs the admin token."""
        from agentbox.models import LoginLink

        url = self._read(LoginLink, self._call("POST", "/login-links",
                                                headers=self._admin_headers())).url
        return url if next_path is None else f"{url}&next={quote(next_path, safe='/')}"

    def login_link_used(self, link: str) -> bool | None:
        """Whether the one-time login link `link` (of `login_link`) was used yet; None
        once it has expired. Needs the admin token."""
        code = parse_qs(urlsplit(link).query).get("code", [""])[0]
        link_id = hashlib.sha256(code.encode()).hexdigest()[:32]
        try:
            found = self._call("GET", f"/login-links/{link_id}",
                               headers=self._admin_headers())
        except NotFound:
            return None
        return bool(found.get("used")) if isinstance(found, dict) else None

    def replay(self, run_id: str) -> RunView:
        """Send a dead-lettered or permanently failed run back to the queue (same
        run id): the run, accepted again. Needs the admin token."""
        from agentbox.models import RunView

        return self._read(RunView, self._call(
            "POST", f"/runs/{segment(check_run_id(run_id))}/replay",
            headers=self._admin_headers()))

    def rejudge(self, run_id: str, stage: str) -> Accepted:
        """A new review of the same audio `run_id`'s review heard, judged at `stage`
        ("mix" or "master"), beside the first: the new run, accepted (asked again,
        the same one). Needs the admin token."""
        from agentbox.models import Accepted

        return self._read(Accepted, self._call(
            "POST", f"/runs/{segment(check_run_id(run_id))}/rejudge",
            json={"stage": stage}, headers=self._admin_headers()))

    def rename_project(self, old: str, new: str) -> ProjectChanged:
        """Project `old` is called `new` from now on (its exports, kept audio and
        reference follow; `old` stays an alias). Needs the admin token."""
        return self._tidy(old, "rename", {"to": project_name(new)})

    def merge_projects(self, old: str, into: str) -> ProjectChanged:
        """Project `old`'s exports join project `into`. Needs the admin token."""
        return self._tidy(old, "merge", {"into": project_name(into)})

    def remove_project(self, project: str) -> ProjectChanged:
        """The project's exports leave the pages and its audio the archive. Needs the
        admin token."""
        return self._tidy(project, "remove", {})

    def _tidy(self, project: str, action: str, body: dict[str, str]) -> ProjectChanged:
        from agentbox.review.answers import ProjectChanged

        return self._read(ProjectChanged, self._call(
            "POST", f"/projects/{segment(project_name(project))}/{action}", json=body,
            headers=self._admin_headers()))

    def exports(self, project: str | None = None, limit: int = 50,
                cursor: str | None = None) -> ExportList:
        """GET /exports: `.exports`, a project's exports newest first (the
        project named in any form: NFC is the one kept); without one, each project's
        latest, a page of them (`cursor`: the `.next_cursor` of the page before).
        NotFound for a project with no export."""
        from agentbox.review.answers import ExportList

        params: dict[str, Any] = {"limit": limit}
        if project is not None:
            params["project"] = project
        if cursor is not None:
            params["cursor"] = cursor
        return self._read(ExportList, self._get("/exports", params=params))

    # -- reference tracks --

    def references(self) -> ReferenceList:
        """GET /references: `.references`, every project's reference track."""
        from agentbox.review.answers import ReferenceList

        return self._read(ReferenceList, self._get("/references"))

    def reference(self, project: str) -> ReferenceOut:
        """A project's reference track and what was measured of it. NotFound: none."""
        from agentbox.review.answers import ReferenceOut

        return self._read(ReferenceOut, self._get(f"/projects/{segment(project)}/reference"))

    def add_reference(self, path: str | os.PathLike[str], project: str) -> ReferenceOut:
        """Make the audio file at `path` the project's reference track (sent whole,
        measured once by agentbox): the reference as agentbox now keeps it. Refused
        (413 reference_too_large, 422 reference_unreadable) says why not;
        FileUnreadable, no file there to send. Needs the admin token."""
        from agentbox.review.answers import ReferenceOut

        file = Path(path)
        try:
            body = open(file, "rb")  # noqa: SIM115 - closed below, around the request
        except OSError as exc:
            raise _unreadable(exc) from None
        with body:
            found = self._call(
                "PUT", f"/projects/{segment(project)}/reference", params={"name": file.name},
                content=body, headers={**self._admin_headers(),
                                       "Content-Type": "application/octet-stream"},
                timeout=REFERENCE_TIMEOUT)
        return self._read(ReferenceOut, found)

    def remove_reference(self, project: str) -> ReferenceRemoved:
        """The project no longer has a reference track: `.removed`, the one it had.
        NotFound: it had none. Needs the admin token."""
        from agentbox.review.answers import ReferenceRemoved

        return self._read(ReferenceRemoved, self._call(
            "DELETE", f"/projects/{segment(project)}/reference",
            headers=self._admin_headers()))

    # -- callbacks and maintenance --

    def callbacks(self, limit: int = 20, state: str | None = None) -> Notifications:
        """GET /callbacks: `.callbacks`, the newest notifications."""
        from agentbox.models import Notifications

        params = {"limit": limit, **({"state": state} if state else {})}
        return self._read(Notifications, self._get("/callbacks", params=params))

    def destinations(self) -> Destinations:
        """GET /callbacks/destinations: `.destinations`."""
        from agentbox.models import Destinations

        return self._read(Destinations, self._get("/callbacks/destinations"))

    def resume_destination(self, destination: str) -> Resumed:
        """Resume a paused callback destination (an origin). Needs the admin token."""
        from agentbox.models import Resumed

        return self._read(Resumed, self._call("POST", "/callbacks/destinations/resume",
                                              headers=self._admin_headers(),
                                              json={"destination": destination}))

    def prune(self, dry_run: bool = False) -> Pruned:
        """A retention pass by the server now (or what it would remove). Admin."""
        from agentbox.models import Pruned

        return self._read(Pruned, self._call("POST", "/prune", headers=self._admin_headers(),
                                             json={"dry_run": dry_run}, timeout=None))

    # -- one request --

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._call("GET", path, params=params, headers=self._read_headers())

    def _read_headers(self) -> dict[str, str]:
        """Reading runs needs the admin token too (the page and API are the user's
        alone): the given one, else the user's own; without one the server says 401."""
        try:
            return self._admin_headers()
        except Misconfigured:
            return {}

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, self.url + path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._answer(response)

    def _read(self, model: type[Model], answer: Any) -> Model:
        """An answer as its model; JSON of another shape is not agentbox's answer."""
        from pydantic import ValidationError

        try:
            return model.model_validate(answer)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the answer"
            raise UnexpectedAnswer(
                f"{self.url} answered with JSON that is not agentbox's {model.__name__} "
                f"({one_line(where)[:80]}: {one_line(first['msg'])}): is it another program, "
                "or an agentbox of a far older or newer version?", answer) from None

    def _unreachable(self, exc: httpx.HTTPError) -> Unreachable:
        """Nothing (or nothing in time) answered: what, and how to start agentbox."""
        what = ("nothing answers there" if isinstance(exc, httpx.ConnectError) else
                "it does not answer" if isinstance(exc, httpx.TimeoutException) else
                f"{type(exc).__name__}: {one_line(exc)}")
        return Unreachable(f"cannot reach agentbox at {self.url} ({what}). {START_HINT}",
                           f"cannot reach agentbox at {self.url} ({what})")

    def _answer(self, response: httpx.Response) -> Any:
        """agentbox's JSON answer, or the error that says what came instead."""
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict | list):  # an HTML page, say: another program's
            raise NotAgentbox(
                f"{self.url} answered {response.status_code} with something that is not "
                "agentbox's JSON: is another program listening there? Name agentbox's "
                f"address with --url or {URL_ENV} (for example {DEFAULT_URL}).")
        if response.status_code >= 300:
            refusal = NotFound if response.status_code == 404 else Refused
            raise refusal(response.status_code, answer if isinstance(answer, dict) else {},
                          response.text)
        return answer

    # -- the watched folders (the desktop app's routes) --

    def watch_state(self) -> WatchState:
        """`GET /watch`: whether the server's watched folders are paused, and each one."""
        from agentbox.desktop.answers import WatchState

        return self._read(WatchState, self._get("/watch"))

    def pause_watch(self) -> WatchState:
        """`POST /watch/pause` (admin): renders are found but not sent until resumed;
        the pause outlives a restart of the server."""
        from agentbox.desktop.answers import WatchState

        return self._read(WatchState, self._call("POST", "/watch/pause",
                                                 headers=self._admin_headers()))

    def resume_watch(self) -> WatchState:
        """`POST /watch/resume` (admin): what was written meanwhile is sent, newest last."""
        from agentbox.desktop.answers import WatchState

        return self._read(WatchState, self._call("POST", "/watch/resume",
                                                 headers=self._admin_headers()))

    # -- live updates (the page's stream) --

    def live(self, timeout: float = LIVE_TIMEOUT) -> Iterator[LiveUpdate]:
        """The page's live updates (`GET /ui/stream`, Server-Sent Events) as they come:
        `stats` (the run counts, `active`, the apps' figures) at once and every few
        seconds, `run` at each run transition. Waits without polling; ends when the
        server closes the stream (a stop), `Unreachable` when nothing answers or the
        stream goes silent for `timeout` seconds (its keep-alive pings are 15 s apart)."""
        try:
            with self._http.stream("GET", self.url + "/ui/stream",
                                   headers={"Accept": "text/event-stream",
                                            **self._read_headers()},
                                   timeout=httpx.Timeout(DEFAULT_TIMEOUT, read=timeout)
                                   ) as response:
                if response.status_code != 200:
                    response.read()
                    self._answer(response)  # the refusal, raised
                    raise NotAgentbox(f"{self.url}/ui/stream answered "
                                      f"{response.status_code}, not a stream")
                yield from _events(response.iter_lines())
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None


PROOF_TRIES = 3  # connections proved and then closed by the server, before giving up


class _ProvingBackend(httpcore.NetworkBackend):
    """httpcore's network, where each new connection proves the server before httpx
    sends a request on it (agentbox.proof); NotProven closes it unused."""

    def __init__(self, inner: httpcore.NetworkBackend, token: Callable[[], str | None],
                 url: str) -> None:
        self._inner, self._token, self._url = inner, token, url

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        for _ in range(PROOF_TRIES):
            stream = self._inner.connect_tcp(host, port, timeout, local_address,
                                             socket_options)
            token = self._token()
            if token is None:
                return stream
            try:
                open_on = self._prove(stream, token, f"{host}:{port}" if ":" not in host
                                      else f"[{host}]:{port}")
            except BaseException:
                stream.close()
                raise
            if open_on:
                return stream
            stream.close()  # proved, but closed after it (at its connections' limit)
        raise httpcore.ConnectError(f"{self._url} closed each connection after its proof")

    def _prove(self, stream: httpcore.NetworkStream, token: str, host: str) -> bool:
        """NotProven unless the server proves itself; whether the connection stays open."""
        nonce = proof.new_nonce()
        try:
            body, open_on = proof.exchange(
                lambda data: stream.write(data, proof.PROOF_SECONDS),
                lambda: stream.read(65536, proof.PROOF_SECONDS), host, nonce)
            proof.check(token, nonce, stream.get_extra_info("server_addr"), body)
            return open_on
        except (proof.NotProven, httpcore.TimeoutException) as exc:
            why = str(exc) if isinstance(exc, proof.NotProven) else \
                f"it did not prove itself within {proof.PROOF_SECONDS:g} s"
            raise NotProven(f"something else listens at {self._url}, not your agentbox "
                            f"({why}); nothing was sent to it") from None

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


START_HINT = ("Is it running? Start it with: agentbox serve (in a checkout: scripts/run; at "
              "every login: agentbox service install). Running elsewhere: --url or "
              f"{URL_ENV}.")


def _busy(response: httpx.Response, url: str) -> Unreachable:
    """429 or 503: agentbox busy or unavailable, worth trying again."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    code = detail = None
    if not isinstance(answer, dict):
        reason = "an answer that is not JSON"
    else:
        code = answer.get("error_code") if isinstance(answer.get("error_code"), str) else None
        message = answer.get("message")
        detail = one_line(message) if isinstance(message, str) and message else None
        reason = f"{response.status_code} {one_line(code or '')}"
    hint = response.headers.get("retry-after", "")
    wait = min(float(hint), 60.0) if hint.isascii() and hint.isdigit() else 0.0
    what = "busy" if response.status_code == 429 else "unavailable"
    return Unreachable(f"agentbox at {url} is {what} ({reason}): "
                       f"{detail or 'try again later'}", reason,
                       response.status_code, code, wait, detail)


@dataclass(frozen=True)
class LiveUpdate:
    """One event of the page's stream: `kind` (stats, run) and its JSON `data`."""

    kind: str
    data: Any


def _events(lines: Iterator[str]) -> Iterator[LiveUpdate]:
    """Server-Sent Events as updates: `event:` and `data:` lines up to a blank line;
    comments (the pings) and `retry:` are the transport's."""
    kind, data = "message", list[str]()
    for text in lines:
        if not text:
            found = _json_or_none("\n".join(data)) if data else None
            if found is not None:  # else not one of agentbox's updates
                yield LiveUpdate(kind, found)
            kind, data = "message", []
        elif text.startswith("event:"):
            kind = text[6:].strip()
        elif text.startswith("data:"):
            data.append(text[5:].removeprefix(" "))


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
