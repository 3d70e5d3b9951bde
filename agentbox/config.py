"""Settings: a TOML file, overridden by AGENTBOX_* environment variables, overridden by flags.

Every knob is a named default below, validated at start: a zero, negative or
malformed value refuses to start with a message that names the setting.
"""

from __future__ import annotations

import base64
import importlib
import ipaddress
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import platformdirs

from agentbox import portable
from agentbox.addresses import origin_of
from agentbox.bundled import DEFAULT_APPS
from agentbox.signing import secret_keys

APP_NAME = "agentbox"
ENV_PREFIX = "AGENTBOX_"
CONFIG_FILE_NAME = "agentbox.toml"
WEBHOOK_SECRET_FILE = "webhook_secret"
CALLBACK_SECRET_FILE = "callback_secret"
ADMIN_TOKEN_FILE = "admin_token"
PAGE_NAME_FILE = "page_name"  # the page's private host name (agentbox.http.access)
WEBHOOK_SECRET_BYTES = 32  # a made secret's key (Standard Webhooks allows 24 to 64)

MIN_ADMIN_TOKEN_CHARS = 16  # a shorter admin token is refused at start
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_SIGNATURE_MAX_AGE_SECONDS = 300.0
DEFAULT_IDEMPOTENCY_TTL_SECONDS = 604_800.0  # 7 days
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_PENDING = 100_000
DEFAULT_WORKER_CONCURRENCY = 16
DEFAULT_RUN_TIMEOUT_SECONDS = 300.0
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_RETRY_BASE_SECONDS = 2.0
DEFAULT_RETRY_MAX_SECONDS = 300.0
DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
DEFAULT_MAINTENANCE_INTERVAL_SECONDS = 60.0
# Svix's schedule: at once, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (delays before each attempt).
DEFAULT_CALLBACK_RETRY_SCHEDULE = (0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
DEFAULT_CALLBACK_TIMEOUT_SECONDS = 15.0
DEFAULT_CALLBACK_PAUSE_AFTER_FAILURES = 20
DEFAULT_CALLBACK_CONCURRENCY = 8
DEFAULT_MAX_HOPS = 8
DEFAULT_BODY_TIMEOUT_SECONDS = 10.0  # the whole request body
DEFAULT_MAX_CONNECTIONS = 1000  # requests handled at once; beyond it 503 at once
DEFAULT_KEEP_ALIVE_SECONDS = 5.0  # an idle connection is closed after this
# Connections waiting for a request head (new or kept alive): at most this many (the
# longest waiting is closed), each for at most DEFAULT_HEAD_TIMEOUT_SECONDS, with a head
# of at most DEFAULT_MAX_HEAD_BYTES (431 beyond). They never take a request's slot.
DEFAULT_MAX_IDLE_CONNECTIONS = 500
DEFAULT_HEAD_TIMEOUT_SECONDS = 5.0
DEFAULT_MAX_HEAD_BYTES = 32 * 1024
DEFAULT_SESSION_SECONDS = 43_200.0  # a login to the page (beyond loopback) lasts 12 hours
# ... and on loopback 400 days, the longest a browser keeps a cookie: a musician logs in
# once per browser, and the page is still the user's alone (agentbox.http.access).
DEFAULT_LOOPBACK_SESSION_SECONDS = 400 * 86_400.0
DEFAULT_LOGIN_DELAY_SECONDS = 1.0  # a wrong admin token's first wait (see login_delay_seconds)
# Retention: finished runs go after a month (a month of history on the operator's
# page, and well past the 7-day idempotency window, which it may not undercut);
# raw event bodies, which may carry personal data, after a week.
DEFAULT_RETENTION_DAYS = 30.0
DEFAULT_BODY_RETENTION_DAYS = 7.0
SECONDS_PER_DAY = 86_400.0
# Subscriptions: the TTL a subscriber may ask for is kept within these bounds.
DEFAULT_SUBSCRIPTION_MIN_TTL_SECONDS = 60.0
DEFAULT_SUBSCRIPTION_MAX_TTL_SECONDS = 86_400.0  # a day: refresh to keep it longer
DEFAULT_SUBSCRIPTION_SUSPEND_AFTER_FAILURES = 10
# Subscriptions held at once: each event owes every subscriber of its type a delivery,
# written with it (1,000 of them made an event's ingest about 100 ms).
DEFAULT_MAX_SUBSCRIPTIONS = 100


T = TypeVar("T")


class ConfigError(Exception):
    """A setting that cannot be used; the message names it and says what to change."""


def default_config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME))


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME))


@dataclass(frozen=True)
class AgentBinding:
    event_type: str
    target: str  # "module:function"


# The apps the server runs (docs/apps.md) are named by import string (`module:attribute`);
# which ones by default is the distribution's choice (agentbox.bundled), not the engine's.
# Importing an app's module registers its event types (agentbox.events.register_event_type),
# its settings (`app_settings`: a section of agentbox.toml and its environment variables)
# and its checks of the settings (`settings_check`): the server imports its apps before
# it starts; reading the settings reads and checks those of the apps imported so far.
SettingsCheck = Callable[["Settings", Callable[[str], str]], None]
_SETTINGS_CHECKS: list[SettingsCheck] = []


def settings_check(check: SettingsCheck) -> SettingsCheck:
    """Register an app's check of the settings: it raises ConfigError, naming the
    setting with the function it is given (the TOML key, variable or flag it came
    from). Registered once per function, however often its module is imported."""
    if check not in _SETTINGS_CHECKS:
        _SETTINGS_CHECKS.append(check)
    return check


def import_apps(targets: tuple[str, ...], where: str = "AGENTBOX_APPS") -> list[Any]:
    """Import each app (`module:attribute`) and return them, in order; a module that
    cannot be imported, or lacks the attribute, is a ConfigError naming the setting."""
    found = []
    for target in targets:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any failure to import is the configuration's
            raise ConfigError(f"{where}: cannot import {module_name!r}: "
                              f"{type(exc).__name__}: {exc}") from None
        app = getattr(module, attr or "app", None)
        if app is None:
            raise ConfigError(f"{where}: {module_name!r} has no {attr or 'app'!r}")
        found.append(app)
    return found


@dataclass(frozen=True)
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: Path = field(default_factory=default_data_dir)
    config_dir: Path = field(default_factory=default_config_dir)
    webhook_secret: tuple[str, ...] = field(default=(), repr=False)
    webhook_secret_file: Path | None = None  # where they were read from, if from a file
    signature_max_age_seconds: float = DEFAULT_SIGNATURE_MAX_AGE_SECONDS
    idempotency_ttl_seconds: float = DEFAULT_IDEMPOTENCY_TTL_SECONDS
    max_retries: int = DEFAULT_MAX_RETRIES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_pending: int = DEFAULT_MAX_PENDING
    worker_concurrency: int = DEFAULT_WORKER_CONCURRENCY
    run_timeout_seconds: float = DEFAULT_RUN_TIMEOUT_SECONDS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    retry_base_seconds: float = DEFAULT_RETRY_BASE_SECONDS
    retry_max_seconds: float = DEFAULT_RETRY_MAX_SECONDS
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    maintenance_interval_seconds: float = DEFAULT_MAINTENANCE_INTERVAL_SECONDS
    callback_allowed: tuple[str, ...] = ()
    callback_allowed_local: tuple[str, ...] = ()
    callback_secret: tuple[str, ...] = field(default=(), repr=False)
    callback_retry_schedule: tuple[float, ...] = DEFAULT_CALLBACK_RETRY_SCHEDULE
    callback_timeout_seconds: float = DEFAULT_CALLBACK_TIMEOUT_SECONDS
    callback_pause_after_failures: int = DEFAULT_CALLBACK_PAUSE_AFTER_FAILURES
    callback_concurrency: int = DEFAULT_CALLBACK_CONCURRENCY
    max_hops: int = DEFAULT_MAX_HOPS
    alert_url: str | None = None  # operator alerts: a signed POST, like a callback
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    keep_alive_seconds: float = DEFAULT_KEEP_ALIVE_SECONDS
    max_idle_connections: int = DEFAULT_MAX_IDLE_CONNECTIONS
    head_timeout_seconds: float = DEFAULT_HEAD_TIMEOUT_SECONDS
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES
    session_seconds: float | None = None  # None: session_seconds() by the host
    # The wait after a client's first wrong admin token; it doubles with each, up to 60
    # times this (agentbox.http.access)
    login_delay_seconds: float = DEFAULT_LOGIN_DELAY_SECONDS
    # Reverse proxies (IPs or networks) whose X-Forwarded-For / -Proto are believed: the
    # client address the login throttle counts by. None by default: nobody's.
    trusted_proxies: tuple[str, ...] = ()
    agents: tuple[AgentBinding, ...] = ()
    apps: tuple[str, ...] = DEFAULT_APPS  # the apps this server runs, by import string
    log_level: str = "info"
    # auto: text lines for a person when stderr is a terminal, JSON lines otherwise.
    log_format: str = "auto"
    # PostgreSQL instead of SQLite: several instances share one database. Holds a password.
    database_url: str | None = field(default=None, repr=False)
    instance_id: str | None = None  # this instance's name in /healthz, metrics and leases
    # Retention (agentbox.engine.retention): finished runs, then raw event bodies, go after
    # these many days (fractions allowed); what an app keeps is the app's to say.
    retention_days: float = DEFAULT_RETENTION_DAYS
    body_retention_days: float = DEFAULT_BODY_RETENTION_DAYS
    # -- subscriptions (other programs' webhook subscriptions) --
    # Loopback origins a subscription may use over plain http (else https only).
    subscription_allowed: tuple[str, ...] = ()
    subscription_min_ttl_seconds: float = DEFAULT_SUBSCRIPTION_MIN_TTL_SECONDS
    subscription_max_ttl_seconds: float = DEFAULT_SUBSCRIPTION_MAX_TTL_SECONDS
    subscription_suspend_after_failures: int = DEFAULT_SUBSCRIPTION_SUSPEND_AFTER_FAILURES
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS  # past it, POST /subscriptions: 409
    # What the file, the environment and the flags said beyond the engine's settings:
    # the apps' settings, each read by the class its app registered (`of`).
    given: Given = field(default_factory=lambda: Given(), repr=False, compare=False)

    @property
    def database_path(self) -> Path:
        return self.data_dir / "agentbox.sqlite3"

    def of(self, kind: type[T]) -> T:
        """An app's settings, by the class it registered (`app_settings`): read from its
        section of the file (or a key of it at the top, as before sections), its
        environment variables and flags, and checked, once."""
        return self.given.read(kind)

    def with_app(self, *chosen: Any) -> Settings:
        """These settings with an app's settings given as they are (a test, a script)."""
        return _replace(self, given=self.given.choosing(chosen))


# -- the apps' settings ------------------------------------------------------------------
# An app declares its settings as a frozen dataclass registered under its section of
# agentbox.toml (`app_settings`); each field is a setting, read from `[section] name`
# (or `name` at the top of the file, where the settings were before sections), from
# AGENTBOX_NAME, from a flag, in that order of precedence, by the parser of its
# `setting(...)`. A class may have `check(named)`: settings that disagree, in words.
Parse = Callable[[Any, str], Any]  # (value, where it came from) -> the setting's value
_SECTIONS: dict[str, tuple[str, type[Any]]] = {}  # "module.Class" -> (its section, it)


def setting(default: Any, parse: Parse) -> Any:
    """A field of an app's settings: its default and how it is read from the file or the
    environment (a parser raising ValueError, TypeError, or ConfigError in words)."""
    return field(default=default, metadata={"parse": parse})


def app_settings(section: str) -> Callable[[type[T]], type[T]]:
    """Register an app's settings class under its section of agentbox.toml (at import,
    as event types are). Several classes may share a section (an app's rooms); a name
    is one setting's alone, the engine's or one app's."""
    def register(kind: type[T]) -> type[T]:
        key = _key(kind)
        taken = {name for other, (_, each) in _SECTIONS.items() if other != key
                 for name in _names(each)}
        for name in _names(kind):
            if name in _SETTABLE or name in taken:
                raise ValueError(f"{key}: the setting {name!r} is taken")
        _SECTIONS[key] = (section, kind)
        return kind
    return register


def registered_settings() -> list[type[Any]]:
    """The apps' settings classes registered so far, in order."""
    return [kind for _, kind in _SECTIONS.values()]


def _key(kind: type[Any]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _names(kind: type[Any]) -> list[str]:
    return [f.name for f in fields(kind)]


def section_of(kind: type[Any]) -> str:
    """The section of agentbox.toml an app's settings class was registered under."""
    if _key(kind) not in _SECTIONS:
        raise TypeError(f"{kind.__qualname__} is not registered with app_settings")
    return _SECTIONS[_key(kind)][0]


@dataclass(frozen=True)
class Given:
    """What the file, the environment and the flags said beyond the engine's settings,
    and the apps' settings read from it (each class once)."""

    path: Path | None = None
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    loose: Mapping[str, Any] = field(default_factory=dict)  # at the file's top
    # AGENTBOX_* (not shown: it may hold a secret, as AGENTBOX_ADMIN_TOKEN does)
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # the engine's: where each was set
    # Each class's settings and where each of them was set, once read (or given).
    read_so_far: dict[type[Any], tuple[Any, dict[str, str]]] = field(default_factory=dict)

    def read(self, kind: type[T]) -> T:
        if kind not in self.read_so_far:
            self.read_so_far[kind] = _read_app_settings(kind, self)
        found: T = self.read_so_far[kind][0]
        return found

    def where(self, kind: type[Any]) -> dict[str, str]:
        """Where each of an app's settings was set (none: at its default)."""
        self.read(kind)
        return self.read_so_far[kind][1]

    def choosing(self, chosen: tuple[Any, ...]) -> Given:
        read = dict(self.read_so_far)
        for each in chosen:
            section_of(type(each))
            read[type(each)] = (each, {})
        return Given(self.path, self.sections, self.loose, self.environ, self.overrides,
                     self.sources, read)

    def unknown(self) -> list[str]:
        """The file's keys no setting registered so far claims."""
        owned: dict[str, set[str]] = {}
        for section, kind in _SECTIONS.values():
            owned.setdefault(section, set()).update(_names(kind))
        every = set().union(*owned.values())
        unknown = [name for name in self.loose if name not in every]
        for section, values in self.sections.items():
            if section not in owned:
                unknown.append(section)
            else:
                unknown += [f"{section}.{name}" for name in values if name not in owned[section]]
        return sorted(unknown)


def _read_app_settings(kind: type[T], given: Given) -> tuple[T, dict[str, str]]:
    section = section_of(kind)
    in_file = given.sections.get(section, {})
    raw: dict[str, tuple[str, Any]] = {}
    for name in _names(kind):
        if name in in_file and name in given.loose:
            raise ConfigError(f"{name} is set twice in {given.path}: at the top and in "
                              f"[{section}]; keep the one in [{section}]")
        if name in in_file:
            raw[name] = (f"{section}.{name} in {given.path}", in_file[name])
        elif name in given.loose:
            raw[name] = (f"{name} in {given.path}", given.loose[name])
        if env_name(name) in given.environ:
            raw[name] = (env_name(name), given.environ[env_name(name)])
        if given.overrides.get(name) is not None:
            raw[name] = (f"--{name.replace('_', '-')}", given.overrides[name])
    parsers = {f.name: f.metadata["parse"] for f in fields(kind)}  # type: ignore[arg-type]
    values = {name: _parsed(parsers[name], where, value)
              for name, (where, value) in raw.items()}
    found = kind(**values)
    sources = {name: where for name, (where, _) in raw.items()}
    check = getattr(found, "check", None)
    if check is not None:
        check(Named(sources))
    return found, sources


def _parsed(parse: Parse, where: str, value: Any) -> Any:
    try:
        return parse(value, where)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where}: {_describe(value)} is not a valid value") from None


# Parsers for an app's settings (`setting(default, parse)`), as the engine reads its own.
def parse_positive_float(value: Any, where: str) -> float:
    number: float = _positive(float(_scalar(value)), where)
    return number


def parse_positive_int(value: Any, where: str) -> int:
    number = _scalar(value)
    if isinstance(number, float) or (isinstance(number, str) and not number.strip()
                                      .lstrip("+").isdigit()):
        raise ValueError
    whole: int = _positive(int(number), where)
    return whole


def parse_bool(value: Any, where: str) -> bool:
    return _boolean(value)


def parse_text(value: Any, where: str) -> str:
    """A word or a line: a TOML string (or number), as it is."""
    return str(_scalar(value))


# How each setting is read from text (env var or TOML string); None = not settable there.
_POSITIVE_FLOATS = {
    "signature_max_age_seconds", "idempotency_ttl_seconds", "run_timeout_seconds",
    "lease_seconds", "retry_base_seconds", "retry_max_seconds", "shutdown_grace_seconds",
    "maintenance_interval_seconds", "callback_timeout_seconds", "body_timeout_seconds",
    "keep_alive_seconds", "head_timeout_seconds", "session_seconds", "retention_days",
    "login_delay_seconds",
    "body_retention_days", "subscription_min_ttl_seconds", "subscription_max_ttl_seconds",
}
_POSITIVE_INTS = {"port", "max_retries", "max_body_bytes", "max_pending", "worker_concurrency",
                  "callback_pause_after_failures", "callback_concurrency", "max_hops",
                  "max_connections", "max_idle_connections", "max_head_bytes",
                  "subscription_suspend_after_failures", "max_subscriptions"}
_LISTS = {"webhook_secret", "callback_allowed", "callback_allowed_local", "callback_secret",
          "apps", "trusted_proxies",
          "subscription_allowed"}
_SCHEDULES = {"callback_retry_schedule"}
_SECRETS = {"webhook_secret", "callback_secret", "database_url"}  # never echoed in an error
_PATHS = {"data_dir", "config_dir"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_STRINGS = {"host", "log_level", "log_format", "alert_url", "instance_id"}
_SETTABLE = (_POSITIVE_FLOATS | _POSITIVE_INTS | _LISTS | _SCHEDULES | _PATHS | _STRINGS
             | {"agents", "database_url"})
_LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "text", "json")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge TOML < environment < overrides (flags), validate, and return Settings."""
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[str, Any]] = {}  # name -> (where it came from, value)
    explicit = config_file or (Path(environ[env_name("config")]) if environ.get(
        env_name("config")) else None)
    path = explicit or default_config_dir() / CONFIG_FILE_NAME
    beyond: dict[str, Any] = {}  # the file's keys that are no setting of the engine's
    for name, value in _read_toml(path, required=explicit is not None).items():
        if name in _SETTABLE:
            raw[name] = (f"{name} in {path}", value)
        else:
            beyond[name] = value
    for name in _SETTABLE:
        if env_name(name) in environ:
            raw[name] = (env_name(name), environ[env_name(name)])
    for name, value in (overrides or {}).items():
        if value is not None and name in _SETTABLE:
            raw[name] = (f"--{name.replace('_', '-')}", value)
    values = {name: _coerce(name, where, value) for name, (where, value) in raw.items()}
    values.setdefault("config_dir", path.parent)
    sources = {name: where for name, (where, _) in raw.items()}
    values["given"] = Given(
        path, {k: v for k, v in beyond.items() if isinstance(v, dict)},
        {k: v for k, v in beyond.items() if not isinstance(v, dict)},
        {k: v for k, v in environ.items()
         if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() not in _SETTABLE},
        {k: v for k, v in (overrides or {}).items() if k not in _SETTABLE}, sources)
    settings = Settings(**values)
    if settings.given.unknown():  # perhaps an app's, not imported yet: import them, and
        # the bundled ones, whose settings a server running without them still accepts
        import_apps(tuple(dict.fromkeys((*settings.apps, *DEFAULT_APPS))),
                    Named(sources)("apps"))
    _check_consistency(settings, sources)
    return settings


def _read_toml(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise ConfigError(f"config file {path} does not exist")
        return {}
    import tomllib  # here: most starts have no config file (its parser takes 0.005 s)

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}; fix it there (it is "
                          "TOML: name = value, text in quotes)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    return data


def _coerce(name: str, where: str, value: Any) -> Any:
    try:
        if name in _POSITIVE_FLOATS:
            return parse_positive_float(value, where)
        if name in _POSITIVE_INTS:
            return parse_positive_int(value, where)
        if name in _LISTS:
            return _string_list(value)
        if name in _SCHEDULES:
            return _schedule(value, where)
        if name in _PATHS:
            return Path(str(value)).expanduser()
        if name == "agents":
            return parse_agents(value, where)
        if name == "database_url":
            return _database_url(value, where)
        if name == "log_level":
            if str(value).lower() not in _LOG_LEVELS:
                raise ValueError
            return str(value).lower()
        if name == "log_format":
            if str(value).lower() not in LOG_FORMATS:
                raise ConfigError(f"{where} must be one of {', '.join(LOG_FORMATS)}, "
                                  f"not {_describe(value)}")
            return str(value).lower()
        return str(value)
    except (TypeError, ValueError, OverflowError):
        shown = "this value" if name in _SECRETS else _describe(value)
        raise ConfigError(f"{where}: {shown} is not a valid value") from None


def _boolean(value: Any) -> bool:
    """A TOML true/false, or 1/0, true/false, yes/no, on/off from the environment."""
    if isinstance(value, bool):
        return value
    text = str(_scalar(value)).strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"{value!r} is not true or false")
    return text in _TRUE


def _database_url(value: Any, where: str) -> str | None:
    url = str(_scalar(value)).strip()
    if not url:
        return None  # empty: SQLite
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{where} must be a postgresql:// URL (or empty for SQLite)")
    return url


def _scalar(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError
    return value


def _positive(number: float, where: str) -> Any:
    if number != number or number <= 0 or number == float("inf"):  # NaN, <= 0, inf
        raise ConfigError(f"{where} must be a positive number (got {number})")
    return number


def _string_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        items = value
    else:
        raise ValueError("expected a string or a list of strings")
    return tuple(item.strip() for item in items if item.strip())


def _schedule(value: Any, where: str) -> tuple[float, ...]:
    """Delays in seconds before each attempt: `0, 5, 300`; zero is allowed (at once)."""
    items = (value.split(",") if isinstance(value, str)
             else [_scalar(item) for item in value] if isinstance(value, list) else None)
    if not items:
        raise ValueError("expected a list of seconds")
    delays = tuple(float(item) for item in items)
    if any(d != d or d < 0 or d == float("inf") for d in delays):
        raise ConfigError(f"{where}: every delay must be a number of seconds, 0 or more")
    return delays


def describe(value: Any) -> str:
    """A value as a message shows it: its repr, cut at 60 characters."""
    return _describe(value)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_agents(value: Any, where: str = env_name("agents")) -> tuple[AgentBinding, ...]:
    """`event.type=module:function` pairs, comma separated (or a TOML table of lists)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for event_type, targets in value.items():
            for target in [targets] if isinstance(targets, str) else targets:
                pairs.append((str(event_type), str(target)))
    else:
        for item in _string_list(value):
            event_type, sep, target = item.partition("=")
            pairs.append((event_type.strip(), target.strip()) if sep else ("", item))
    bindings = []
    for event_type, target in pairs:
        module, colon, function = target.partition(":")
        if not event_type or not colon or not module or not function:
            raise ConfigError(
                f"{where}: {_describe(f'{event_type}={target}')} is not "
                "event.type=module:function"
            )
        bindings.append(AgentBinding(event_type, target))
    return tuple(bindings)


def folder_list(value: Any) -> list[Any]:
    """A setting's folders: a TOML list as it is, or the environment's string split
    at the OS's path separator (`:`, on Windows `;`)."""
    if isinstance(value, str):
        return [item for item in value.split(os.pathsep) if item.strip()]
    if isinstance(value, list):
        return value
    raise ValueError("expected a list of folders")


class Named:
    """Names a setting in a message as `_coerce` does: where its value came from (the
    TOML key in its file, the environment variable, the flag); one left at its
    default by the environment variable that would set it."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.sources = sources

    def __call__(self, name: str) -> str:
        return self.sources.get(name) or env_name(name)


def _check_consistency(settings: Settings, sources: Mapping[str, str] | None = None) -> None:
    named = Named(sources or {})
    if settings.port > 65535:
        raise ConfigError(f"{named('port')} must be at most 65535")
    if settings.retry_base_seconds > settings.retry_max_seconds:
        raise ConfigError(
            f"{named('retry_base_seconds')} must not exceed {named('retry_max_seconds')}"
        )
    for name in ("callback_allowed", "callback_allowed_local"):
        for origin in getattr(settings, name):
            check_allowed_origin(origin, named(name))
    if settings.alert_url is not None:
        allowed = {origin_of(o) for o in (*settings.callback_allowed,
                                          *settings.callback_allowed_local)}
        try:
            alert_origin = origin_of(settings.alert_url)
        except ValueError:
            alert_origin = ""
        if alert_origin not in allowed or urlsplit(settings.alert_url).username is not None:
            raise ConfigError(f"{named('alert_url')}: its origin must be listed in "
                              f"{named('callback_allowed')} (alerts follow the callbacks' "
                              "rules), and it must carry no credentials")
    for proxy in settings.trusted_proxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(f"{named('trusted_proxies')}: {proxy!r} is not an IP address "
                              "or network (such as 127.0.0.1 or 10.0.0.0/8)") from None
    if settings.max_idle_connections >= settings.max_connections:
        raise ConfigError(f"{named('max_idle_connections')} must be less than "
                          f"{named('max_connections')}: connections waiting for a request "
                          "must leave slots for the requests that have arrived")
    _check_retention(settings, named)
    _check_subscriptions(settings, named)
    for name in ("webhook_secret", "callback_secret"):
        for secret in getattr(settings, name):
            if not all(secret_keys(secret)):
                raise ConfigError(f"{named(name)}: a secret is empty")
    run_settings_checks(settings, named)


def run_settings_checks(settings: Settings, named: Callable[[str], str] = env_name) -> None:
    """The file's keys, every app's settings read and checked, and every registered
    app check of the settings: those of the apps imported so far (reading settings
    imports no app unless the file names a setting no app imported so far knows, so
    that a client of agentbox stays light)."""
    unknown = settings.given.unknown()
    if unknown:
        raise ConfigError(f"config file {settings.given.path}: unknown setting(s) "
                          f"{', '.join(unknown)}")
    for kind in registered_settings():
        settings.of(kind)
    for check in _SETTINGS_CHECKS:
        check(settings, named)


def listing(settings: Settings) -> list[tuple[str, list[tuple[str, Any, str]]]]:
    """Every setting by section (the engine's first, under ""), each as (name, value,
    where it was set: the key in its file, the variable, the flag, else "default")."""
    engine = [(f.name, getattr(settings, f.name), settings.given.sources.get(f.name, "default"))
              for f in fields(settings) if f.name in _SETTABLE]
    found: dict[str, list[tuple[str, Any, str]]] = {"": engine}
    for kind in registered_settings():
        values, where = settings.of(kind), settings.given.where(kind)
        found.setdefault(section_of(kind), []).extend(
            (name, getattr(values, name), where.get(name, "default")) for name in _names(kind))
    return list(found.items())


def is_secret(name: str) -> bool:
    """A setting whose value is never shown (listing, errors)."""
    return name in _SECRETS


def check_apps(settings: Settings, named: Callable[[str], str] = env_name) -> list[Any]:
    """Import the settings' apps (their checks register as they do) and run every
    app's check of the settings; the apps, in order."""
    apps = import_apps(settings.apps, named("apps"))
    run_settings_checks(settings, named)
    return apps


def _check_retention(settings: Settings, named: Named) -> None:
    """A run kept shorter than its idempotency claim would let a duplicate inside the
    window find nothing (retention keeps a run while its claim holds, so the store
    would grow past the setting instead); a body kept longer than its run is not kept."""
    days = settings.idempotency_ttl_seconds / SECONDS_PER_DAY
    if settings.retention_days < days:
        raise ConfigError(
            f"{named('retention_days')} ({settings.retention_days:g} days) is shorter than "
            f"the idempotency window {named('idempotency_ttl_seconds')} ({days:g} days): "
            "a duplicate within the window must still find its run. Keep runs at least "
            "as long, or shorten the window.")
    if settings.body_retention_days > settings.retention_days:
        raise ConfigError(
            f"{named('body_retention_days')} ({settings.body_retention_days:g}) is longer "
            f"than {named('retention_days')} ({settings.retention_days:g}): a body goes "
            "with its run at the latest. Set it to at most the runs' retention.")


def _check_subscriptions(settings: Settings, named: Named) -> None:
    where = named("subscription_allowed")
    for origin in settings.subscription_allowed:
        check_allowed_origin(origin, where)
        if not is_loopback_host(urlsplit(origin).hostname or ""):
            raise ConfigError(f"{where}: {origin!r}: list loopback origins only (other "
                              "subscribers use https and need no listing)")
    if settings.subscription_min_ttl_seconds > settings.subscription_max_ttl_seconds:
        raise ConfigError(f"{named('subscription_min_ttl_seconds')} must not exceed "
                          f"{named('subscription_max_ttl_seconds')}")


def check_allowed_origin(origin: str, where: str = env_name("callback_allowed")) -> str:
    """Normalise one AGENTBOX_CALLBACK_ALLOWED(_LOCAL) origin, or refuse it."""
    parts = urlsplit(origin)
    if parts.username is not None or parts.password is not None:
        # Not echoed: the text holds a credential.
        raise ConfigError(f"{where}: an origin carries credentials; list bare origins only")
    try:
        if parts.port == 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{where}: {origin!r} has an invalid port") from None
    if not origin.isascii():
        raise ConfigError(f"{where}: {origin!r}: write an international host name in its "
                          "ASCII (xn--) form")
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"{where}: {origin!r} is not an origin such as https://studio.example")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"{where}: {origin!r} must be a bare origin (scheme://host[:port])")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ConfigError(f"{where}: {origin!r}: plain http is allowed only for loopback hosts")
    return origin_of(origin)




def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def session_seconds(settings: Settings) -> float:
    """How long a login to the page lasts: AGENTBOX_SESSION_SECONDS, else by the host
    (12 hours beyond loopback, 400 days on it)."""
    if settings.session_seconds is not None:
        return settings.session_seconds
    return (DEFAULT_LOOPBACK_SESSION_SECONDS if is_loopback_host(settings.host)
            else DEFAULT_SESSION_SECONDS)


def ensure_webhook_secret(settings: Settings) -> tuple[Settings, Path | None]:
    """Use the configured secret(s), else the one kept in the config dir, else make one.

    Returns the settings with the secret filled in and, when a secret file was
    used or created, its path (so the caller can say where it is, never what).
    """
    if settings.webhook_secret:
        return settings, None
    path = settings.config_dir / WEBHOOK_SECRET_FILE
    secret_from_file(path, new_webhook_secret)  # made on first use
    return _replace(settings, webhook_secret=secrets_in_file(path),
                    webhook_secret_file=path), path


def secrets_in_file(path: Path) -> tuple[str, ...]:
    """Every secret kept in `path`, one per line, the current (newest) first."""
    try:
        found = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                      if line.strip())
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror}") from None
    if not found:
        raise ConfigError(f"{path} is empty; delete it to generate a new one")
    return found


def rotate_secret(path: Path) -> None:
    """Put a new secret first in `path`; the old ones keep verifying until retired."""
    old = secrets_in_file(path) if path.exists() else ()
    _write_secrets(path, (new_webhook_secret(), *old))


def retire_secrets(path: Path) -> int:
    """Keep only the current (first) secret in `path`; returns how many were retired."""
    found = secrets_in_file(path)
    _write_secrets(path, found[:1])
    return len(found) - 1


def _write_secrets(path: Path, values: tuple[str, ...]) -> None:
    portable.private_directory(path.parent)
    portable.write_durably(path, "".join(v + "\n" for v in values))


def ensure_callback_secret(settings: Settings) -> tuple[Settings, Path | None]:
    """Like the webhook secret: configured, else kept in the config dir, else made.

    A made one has the Standard Webhooks form (`whsec_` + base64), so receivers
    can hand it to any Standard Webhooks library as it is. The file may hold
    several, the current first (a rotation): callbacks are signed with each.
    """
    if settings.callback_secret:
        return settings, None
    path = settings.config_dir / CALLBACK_SECRET_FILE
    secret_from_file(path, new_webhook_secret)
    return _replace(settings, callback_secret=secrets_in_file(path)), path


def admin_token(settings: Settings, environ: Mapping[str, str] | None = None) -> str:
    """AGENTBOX_ADMIN_TOKEN, else the token kept in the config dir (made on first use)."""
    environ = os.environ if environ is None else environ
    path = settings.config_dir / ADMIN_TOKEN_FILE
    given = environ.get(env_name("admin_token"), "").strip()  # as a Bearer token is read
    token = given or secret_from_file(path)
    if len(token) < MIN_ADMIN_TOKEN_CHARS:  # guessed in minutes, throttle or not
        where = env_name("admin_token") if given else str(path)
        raise ConfigError(f"the admin token in {where} is shorter than "
                          f"{MIN_ADMIN_TOKEN_CHARS} characters: give a longer one (or "
                          "delete the file, and agentbox makes a random one)")
    return token


# A name under .localhost, which browsers resolve to loopback themselves (RFC 6761),
# random per install: the label a page would have to guess (128 bits).
PAGE_NAME = re.compile(r"agentbox-[0-9a-f]{32}\.localhost")


def page_name(settings: Settings) -> str:
    """The host name the page is served on: kept in the config dir (mode 0600), made at
    the first start. A session's cookie is the browser's for this name alone, and the
    browser sends it to no other port of 127.0.0.1 (agentbox.http.access)."""
    path = settings.config_dir / PAGE_NAME_FILE
    name = secret_from_file(path, lambda: f"agentbox-{secrets.token_hex(16)}.localhost")
    if not PAGE_NAME.fullmatch(name):
        raise ConfigError(f"{path} does not hold a page name agentbox made (agentbox-, "
                          "32 hexadecimal digits, .localhost): delete it, and agentbox "
                          "makes a new one")
    return name


def secret_from_file(path: Path, make: Callable[[], str] | None = None) -> str:
    """Read a secret kept in `path`, creating it (mode 0600) on first use."""
    if not path.exists():
        portable.private_directory(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, portable.PRIVATE_FILE)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write((make or _random_secret)() + "\n")
                f.flush()
                portable.durable_flush(f.fileno())
            portable.flush_directory(path.parent)
    return secrets_in_file(path)[0]


def _random_secret() -> str:
    return secrets.token_urlsafe(32)


def new_webhook_secret() -> str:
    """A new webhook or callback secret in the Standard Webhooks form: `whsec_` and
    the base64 of 32 random bytes (the HMAC key of the standard's headers; the hex
    scheme keys with the whole text)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(WEBHOOK_SECRET_BYTES)).decode()


def _replace(settings: Settings, **changes: Any) -> Settings:
    values = {f.name: getattr(settings, f.name) for f in fields(settings)}
    values.update(changes)
    return Settings(**values)
