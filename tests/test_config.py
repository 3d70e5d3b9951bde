"""Settings (agentbox.config): precedence, validation, secrets, agents, callback origins.

Every test passes an explicit config file and `environ`, and keeps config_dir under
tmp_path, so the real home directory and environment are never read or written.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox.config import (
    ADMIN_TOKEN_FILE,
    WEBHOOK_SECRET_FILE,
    AgentBinding,
    ConfigError,
    Settings,
    admin_token,
    check_allowed_origin,
    ensure_callback_secret,
    ensure_webhook_secret,
    load_settings,
    origin_of,
    parse_agents,
)

# env var -> (Settings attribute, is an integer setting)
NUMERIC = {
    "AGENTBOX_SIGNATURE_MAX_AGE_SECONDS": ("signature_max_age_seconds", False),
    "AGENTBOX_IDEMPOTENCY_TTL_SECONDS": ("idempotency_ttl_seconds", False),
    "AGENTBOX_MAX_RETRIES": ("max_retries", True),
    "AGENTBOX_MAX_BODY_BYTES": ("max_body_bytes", True),
    "AGENTBOX_MAX_PENDING": ("max_pending", True),
    "AGENTBOX_WORKER_CONCURRENCY": ("worker_concurrency", True),
    "AGENTBOX_RUN_TIMEOUT_SECONDS": ("run_timeout_seconds", False),
    "AGENTBOX_LEASE_SECONDS": ("lease_seconds", False),
    "AGENTBOX_RETRY_BASE_SECONDS": ("retry_base_seconds", False),
    "AGENTBOX_RETRY_MAX_SECONDS": ("retry_max_seconds", False),
    "AGENTBOX_CALLBACK_TIMEOUT_SECONDS": ("callback_timeout_seconds", False),
    "AGENTBOX_CALLBACK_PAUSE_AFTER_FAILURES": ("callback_pause_after_failures", True),
    "AGENTBOX_CALLBACK_CONCURRENCY": ("callback_concurrency", True),
    "AGENTBOX_MAX_SUBSCRIPTIONS": ("max_subscriptions", True),
}
BAD_ANY = ["0", "-1", "-0", "abc", "", "   ", "nan", "inf", "-inf", "1e999", "0x10", "1,5",
           "five", "--1", "++1"]
BAD_INT_ONLY = ["1.5", "2.0", "1e3"]


def write_toml(directory: Path, text: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "agentbox.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, environ=None, toml: str = "", overrides=None) -> Settings:
    return load_settings(write_toml(tmp_path, toml), dict(environ or {}), overrides)


def config_error(tmp_path: Path, environ=None, toml: str = "", overrides=None) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, environ, toml, overrides)
    return str(info.value)


# -- defaults and precedence ----------------------------------------------------------------


def test_defaults_with_empty_config(tmp_path):
    s = load(tmp_path)
    assert s.host == "127.0.0.1" and s.port == 8000
    assert s.max_retries == 3 and s.max_body_bytes == 1024 * 1024
    assert s.retry_base_seconds == 2.0 and s.retry_max_seconds == 300.0
    assert s.webhook_secret == () and s.callback_allowed == () and s.agents == ()
    assert s.config_dir == tmp_path  # the config file's directory


def test_precedence_toml_env_overrides(tmp_path):
    toml = "max_retries = 4\nlease_seconds = 10\nhost = '127.0.0.2'\n"
    assert load(tmp_path, toml=toml).max_retries == 4
    env = {"AGENTBOX_MAX_RETRIES": "5"}
    s = load(tmp_path, env, toml=toml)
    assert (s.max_retries, s.lease_seconds, s.host) == (5, 10.0, "127.0.0.2")
    s = load(tmp_path, env, toml=toml, overrides={"max_retries": 6, "host": None})
    assert (s.max_retries, s.host) == (6, "127.0.0.2")  # None = flag not given
    s = load(tmp_path, {"AGENTBOX_HOST": "0.0.0.0"}, toml=toml, overrides={"host": "::1"})
    assert s.host == "::1"


def test_config_dir_override_and_toml(tmp_path):
    cfg = tmp_path / "cfg"
    assert load(tmp_path, overrides={"config_dir": cfg}).config_dir == cfg
    assert load(tmp_path, toml=f"config_dir = '{cfg}'\n").config_dir == cfg
    assert load(tmp_path, {"AGENTBOX_CONFIG_DIR": str(cfg)}).config_dir == cfg


def test_config_file_from_environment(tmp_path):
    path = write_toml(tmp_path / "elsewhere", "max_pending = 7\n")
    s = load_settings(None, {"AGENTBOX_CONFIG": str(path)})
    assert s.max_pending == 7 and s.config_dir == path.parent


def test_explicit_missing_config_file_is_refused(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(missing, {})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(None, {"AGENTBOX_CONFIG": str(missing)})


def test_unknown_toml_keys_are_refused(tmp_path):
    msg = config_error(tmp_path, toml="max_retries = 2\nmax_retrys = 3\nbogus = 'x'\n")
    assert "max_retrys" in msg and "bogus" in msg


def test_broken_toml_is_refused(tmp_path):
    assert "cannot be read" in config_error(tmp_path, toml="max_retries = = 3\n")


def test_unknown_env_vars_are_ignored(tmp_path):
    s = load(tmp_path, {"AGENTBOX_NOT_A_SETTING": "x", "HOME": "/nowhere"})
    assert s == load(tmp_path)


# -- numeric settings -----------------------------------------------------------------------


@pytest.mark.parametrize("var", NUMERIC)
def test_numeric_setting_from_env(tmp_path, var):
    attr, _ = NUMERIC[var]
    value = getattr(load(tmp_path, {var: " 7 "}), attr)
    assert value == 7 and type(value) is (int if NUMERIC[var][1] else float)


@pytest.mark.parametrize("var", NUMERIC)
@pytest.mark.parametrize("bad", BAD_ANY)
def test_numeric_setting_refuses_bad_values(tmp_path, var, bad):
    assert var in config_error(tmp_path, {var: bad})


@pytest.mark.parametrize("var", [v for v, (_, is_int) in NUMERIC.items() if is_int])
@pytest.mark.parametrize("bad", BAD_INT_ONLY)
def test_integer_setting_refuses_fractions(tmp_path, var, bad):
    assert var in config_error(tmp_path, {var: bad})


def test_retry_base_may_be_a_fraction(tmp_path):
    assert load(tmp_path, {"AGENTBOX_RETRY_BASE_SECONDS": "0.25"}).retry_base_seconds == 0.25
    assert load(tmp_path, toml="retry_base_seconds = 0.5\n").retry_base_seconds == 0.5


def test_retry_base_must_not_exceed_max(tmp_path):
    msg = config_error(tmp_path, {"AGENTBOX_RETRY_BASE_SECONDS": "10",
                                  "AGENTBOX_RETRY_MAX_SECONDS": "5"})
    assert "AGENTBOX_RETRY_BASE_SECONDS" in msg and "AGENTBOX_RETRY_MAX_SECONDS" in msg


def test_settings_that_disagree_are_named_where_they_were_set(tmp_path):
    msg = config_error(tmp_path, {"AGENTBOX_RETRY_MAX_SECONDS": "5"},
                       toml="retry_base_seconds = 10\n")
    toml = tmp_path / "agentbox.toml"
    assert msg == f"retry_base_seconds in {toml} must not exceed AGENTBOX_RETRY_MAX_SECONDS"
    msg = config_error(tmp_path, toml="port = 70000\n")
    assert msg == f"port in {toml} must be at most 65535"
    msg = config_error(tmp_path, toml='callback_allowed = ["http://nas.lan"]\n')
    assert msg.startswith(f"callback_allowed in {toml}: ") and "plain http" in msg


@pytest.mark.parametrize("toml", ["max_retries = 0", "max_retries = -2", "max_retries = 2.5",
                                  "max_retries = true", "lease_seconds = 0.0",
                                  "lease_seconds = -1", "lease_seconds = [1]",
                                  "lease_seconds = nan", "lease_seconds = inf"])
def test_numeric_setting_refuses_bad_toml(tmp_path, toml):
    name = toml.split()[0]
    assert name in config_error(tmp_path, toml=toml + "\n")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "x"])
def test_numeric_override_refused_with_flag_name(tmp_path, value):
    assert "--max-retries" in config_error(tmp_path, overrides={"max_retries": value})


def test_port_range(tmp_path):
    assert load(tmp_path, {"AGENTBOX_PORT": "65535"}).port == 65535
    assert "AGENTBOX_PORT" in config_error(tmp_path, {"AGENTBOX_PORT": "65536"})
    assert "AGENTBOX_PORT" in config_error(tmp_path, {"AGENTBOX_PORT": "0"})


def test_log_level(tmp_path):
    assert load(tmp_path, {"AGENTBOX_LOG_LEVEL": "DEBUG"}).log_level == "debug"
    assert "AGENTBOX_LOG_LEVEL" in config_error(tmp_path, {"AGENTBOX_LOG_LEVEL": "loud"})


@settings(max_examples=150, deadline=None)
@given(var=st.sampled_from(sorted(NUMERIC)), text=st.text(max_size=20))
def test_numeric_env_any_text_is_value_or_config_error(tmp_path_factory, var, text):
    path = write_toml(tmp_path_factory.mktemp("cfg"))
    try:
        s = load_settings(path, {var: text})
    except ConfigError as exc:
        assert var in str(exc)
    else:
        value = getattr(s, NUMERIC[var][0])
        assert value > 0 and value == float(text)


@settings(max_examples=100, deadline=None)
@given(var=st.sampled_from(sorted(NUMERIC)), n=st.integers(min_value=-10**6, max_value=10**6))
def test_numeric_env_integers(tmp_path_factory, var, n):
    path = write_toml(tmp_path_factory.mktemp("cfg"))
    env = {var: str(n)}
    # the base may not exceed the maximum: the other one out of the way
    if var == "AGENTBOX_RETRY_BASE_SECONDS":
        env["AGENTBOX_RETRY_MAX_SECONDS"] = str(10**7)
    if var == "AGENTBOX_RETRY_MAX_SECONDS":
        env["AGENTBOX_RETRY_BASE_SECONDS"] = "1"  # under the default 2 s, n = 1 was refused
    if n <= 0:
        with pytest.raises(ConfigError, match=var):
            load_settings(path, env)
    else:
        assert getattr(load_settings(path, env), NUMERIC[var][0]) == n


# -- secrets --------------------------------------------------------------------------------


def test_webhook_secret_comma_separated(tmp_path):
    s = load(tmp_path, {"AGENTBOX_WEBHOOK_SECRET": " old-secret , new-secret,, "})
    assert s.webhook_secret == ("old-secret", "new-secret")
    assert load(tmp_path, toml="webhook_secret = ['a', 'b']\n").webhook_secret == ("a", "b")


def test_secret_not_in_repr(tmp_path):
    s = load(tmp_path, {"AGENTBOX_WEBHOOK_SECRET": "zqx-very-secret-value"})
    assert "zqx-very-secret-value" not in repr(s)


secret_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=8,
                      max_size=24).map(lambda s: "zqxS" + s)


@settings(max_examples=100, deadline=None)
@given(secret=secret_text, var=st.sampled_from(sorted(NUMERIC)),
       bad=st.sampled_from(BAD_ANY + BAD_INT_ONLY), in_toml=st.booleans())
def test_secret_never_in_config_error(tmp_path_factory, secret, var, bad, in_toml):
    directory = tmp_path_factory.mktemp("cfg")
    env = {var: bad}
    if in_toml:
        path = write_toml(directory, f"webhook_secret = '{secret}'\n")
    else:
        path = write_toml(directory)
        env["AGENTBOX_WEBHOOK_SECRET"] = f"{secret},{secret}2"
    try:
        load_settings(path, env)
    except ConfigError as exc:
        assert secret not in str(exc)
        assert var in str(exc)
    else:
        assert bad in BAD_INT_ONLY and not NUMERIC[var][1]  # a float setting accepting "1.5"


@pytest.mark.parametrize("toml", ["webhook_secret = 918273645546372819",
                                  "webhook_secret = 3.14159265358979"])
def test_wrongly_typed_secret_not_in_config_error(tmp_path, toml):
    msg = config_error(tmp_path, toml=toml + "\n")
    assert "webhook_secret" in msg
    assert toml.split(" = ")[1] not in msg


# -- ensure_webhook_secret / admin_token ----------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ensure_webhook_secret_creates_then_reuses(tmp_path):
    cfg = tmp_path / "cfg" / "nested"
    s = load(tmp_path, overrides={"config_dir": cfg})
    filled, path = ensure_webhook_secret(s)
    assert path == cfg / WEBHOOK_SECRET_FILE and path.is_file()
    assert _mode(path) == 0o600
    (secret,) = filled.webhook_secret
    assert len(secret) >= 32 and secret == path.read_text().strip()
    again, path2 = ensure_webhook_secret(s)
    assert path2 == path and again.webhook_secret == (secret,)
    # Every other setting is kept.
    assert again.config_dir == cfg and again.max_retries == s.max_retries


def test_ensure_webhook_secret_keeps_configured_secret(tmp_path):
    cfg = tmp_path / "cfg"
    s = load(tmp_path, {"AGENTBOX_WEBHOOK_SECRET": "a,b"}, overrides={"config_dir": cfg})
    filled, path = ensure_webhook_secret(s)
    assert path is None and filled.webhook_secret == ("a", "b")
    assert not (cfg / WEBHOOK_SECRET_FILE).exists()


def test_ensure_webhook_secret_uses_existing_file(tmp_path):
    (tmp_path / WEBHOOK_SECRET_FILE).write_text("kept-secret\n")
    filled, _ = ensure_webhook_secret(load(tmp_path))
    assert filled.webhook_secret == ("kept-secret",)


def test_empty_secret_file_is_refused_without_content(tmp_path):
    (tmp_path / WEBHOOK_SECRET_FILE).write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        ensure_webhook_secret(load(tmp_path))


def test_admin_token_env_then_file(tmp_path):
    cfg = tmp_path / "cfg"
    s = load(tmp_path, overrides={"config_dir": cfg})
    long_token = "from-env-and-long-enough"
    assert admin_token(s, {"AGENTBOX_ADMIN_TOKEN": long_token}) == long_token
    assert not (cfg / ADMIN_TOKEN_FILE).exists()
    token = admin_token(s, {})
    path = cfg / ADMIN_TOKEN_FILE
    assert path.is_file() and _mode(path) == 0o600 and len(token) >= 32
    assert admin_token(s, {}) == token
    secret = ensure_webhook_secret(s)[0].webhook_secret[0]
    assert secret != token


def test_a_short_admin_token_is_refused_by_name(tmp_path):
    """A 4-digit token is guessed in minutes whatever the login throttle does."""
    s = load(tmp_path, overrides={"config_dir": tmp_path / "cfg"})
    with pytest.raises(ConfigError, match="AGENTBOX_ADMIN_TOKEN is shorter than 16"):
        admin_token(s, {"AGENTBOX_ADMIN_TOKEN": "1234"})
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / ADMIN_TOKEN_FILE).write_text("123456789012345\n")
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        admin_token(s, {})


def test_secret_files_private_even_with_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        _, path = ensure_webhook_secret(load(tmp_path))
    finally:
        os.umask(old)
    assert _mode(path) == 0o600


# -- agents ---------------------------------------------------------------------------------


def test_agents_from_env(tmp_path):
    env = {"AGENTBOX_AGENTS": "session.exported=my.mod:review, session.exported=other:fn,"
                              "mix.review_requested=my.mod:review"}
    assert load(tmp_path, env).agents == (
        AgentBinding("session.exported", "my.mod:review"),
        AgentBinding("session.exported", "other:fn"),
        AgentBinding("mix.review_requested", "my.mod:review"),
    )


def test_agents_from_toml_table(tmp_path):
    toml = "[agents]\n'session.exported' = ['a:b', 'c.d:e']\n'mix.review_requested' = 'f:g'\n"
    assert load(tmp_path, toml=toml).agents == (
        AgentBinding("session.exported", "a:b"),
        AgentBinding("session.exported", "c.d:e"),
        AgentBinding("mix.review_requested", "f:g"),
    )


@pytest.mark.parametrize(
    "value",
    ["session.exported", "session.exported=", "=mod:fn", "session.exported=mod",
     "session.exported=:fn", "session.exported=mod:", "mod:fn",
     "session.exported=a:b,broken"],
)
def test_malformed_agents_refused(tmp_path, value):
    assert "AGENTBOX_AGENTS" in config_error(tmp_path, {"AGENTBOX_AGENTS": value})
    with pytest.raises(ConfigError):
        parse_agents(value)


@pytest.mark.parametrize("toml", ["agents = 5", "[agents]\n'x' = 5", "[agents]\n'x' = 'nocolon'"])
def test_malformed_agents_toml_refused(tmp_path, toml):
    assert "agents" in config_error(tmp_path, toml=toml + "\n")


# -- callback origins -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "normalised"),
    [
        ("https://studio.example", "https://studio.example:443"),
        ("https://studio.example/", "https://studio.example:443"),
        ("https://Studio.Example:8443", "https://studio.example:8443"),
        ("http://localhost:9000", "http://localhost:9000"),
        ("http://127.0.0.1", "http://127.0.0.1:80"),
        ("http://127.1.2.3:8080", "http://127.1.2.3:8080"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ],
)
def test_allowed_origins_accepted(tmp_path, origin, normalised):
    assert check_allowed_origin(origin) == normalised
    s = load(tmp_path, {"AGENTBOX_CALLBACK_ALLOWED": f"{origin}, https://b.example"})
    assert s.callback_allowed == (origin, "https://b.example")


@pytest.mark.parametrize(
    "origin",
    [
        "http://studio.example",  # plain http off loopback
        "http://10.0.0.1",
        "http://localhost.evil.example",
        "ftp://studio.example",
        "studio.example",
        "https://",
        "https://user:pw@studio.example",
        "https://user@studio.example",
        "https://studio.example/webhook-results",
        "https://studio.example?x=1",
        "javascript:alert(1)",
    ],
)
def test_bad_origins_refused(tmp_path, origin):
    with pytest.raises(ConfigError, match="AGENTBOX_CALLBACK_ALLOWED"):
        check_allowed_origin(origin)
    assert "AGENTBOX_CALLBACK_ALLOWED" in config_error(
        tmp_path, {"AGENTBOX_CALLBACK_ALLOWED": origin})


@pytest.mark.parametrize("origin", ["https://studio.example:99999", "https://studio.example:abc"])
def test_bad_origin_port_is_config_error(tmp_path, origin):
    assert "AGENTBOX_CALLBACK_ALLOWED" in config_error(
        tmp_path, {"AGENTBOX_CALLBACK_ALLOWED": origin})


def test_origin_credentials_not_in_config_error(tmp_path):
    msg = config_error(tmp_path, {"AGENTBOX_CALLBACK_ALLOWED": "https://ana:zqx-hunter2@h.example"})
    assert "zqx-hunter2" not in msg


def test_origin_of():
    assert origin_of("https://studio.example/webhook-results?x=1") == "https://studio.example:443"
    assert origin_of("http://[::1]/cb") == "http://[::1]:80"


# -- callbacks ----------------------------------------------------------------------------------


def test_callback_defaults(tmp_path):
    s = load(tmp_path)
    assert s.callback_retry_schedule == (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
    assert s.callback_timeout_seconds == 15 and s.callback_pause_after_failures == 20
    assert s.callback_allowed_local == () and s.callback_secret == ()


@pytest.mark.parametrize(("text", "expected"), [
    ("0,5,300", (0, 5, 300)), ("0.5", (0.5,)), (" 1 , 2.25 ", (1, 2.25)), ("0,0", (0, 0)),
])
def test_callback_retry_schedule_parses_seconds(tmp_path, text, expected):
    s = load(tmp_path, {"AGENTBOX_CALLBACK_RETRY_SCHEDULE": text})
    assert s.callback_retry_schedule == expected


def test_callback_retry_schedule_from_toml_list(tmp_path):
    s = load(tmp_path, toml="callback_retry_schedule = [0, 1.5, 60]\n")
    assert s.callback_retry_schedule == (0, 1.5, 60)


@pytest.mark.parametrize("text", ["", " , ", "-1", "0,-5", "soon", "1,,2", "nan", "inf"])
def test_bad_callback_retry_schedule_refuses_to_start(tmp_path, text):
    message = config_error(tmp_path, {"AGENTBOX_CALLBACK_RETRY_SCHEDULE": text})
    assert "AGENTBOX_CALLBACK_RETRY_SCHEDULE" in message


def test_callback_allowed_local_is_checked_like_the_allowlist(tmp_path):
    s = load(tmp_path, {"AGENTBOX_CALLBACK_ALLOWED_LOCAL": "https://nas.studio.example"})
    assert s.callback_allowed_local == ("https://nas.studio.example",)
    message = config_error(tmp_path, {"AGENTBOX_CALLBACK_ALLOWED_LOCAL": "http://nas.lan"})
    assert "AGENTBOX_CALLBACK_ALLOWED_LOCAL" in message and "plain http" in message


def test_callback_secret_is_never_echoed(tmp_path):
    message = config_error(tmp_path, toml="callback_secret = 918273645546372819\n")
    assert "918273645546372819" not in message and "callback_secret" in message


def test_ensure_callback_secret_makes_a_standard_webhooks_secret(tmp_path):
    cfg = tmp_path / "cfg"
    s = load(tmp_path, overrides={"config_dir": cfg})
    filled, path = ensure_callback_secret(s)
    (secret,) = filled.callback_secret
    assert path == cfg / "callback_secret" and _mode(path) == 0o600
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert ensure_callback_secret(s)[0].callback_secret == (secret,)
    configured = load(tmp_path, {"AGENTBOX_CALLBACK_SECRET": "mine"},
                      overrides={"config_dir": cfg})
    assert ensure_callback_secret(configured) == (configured, None)


def test_the_connections_limits_are_settings_checked_at_start(tmp_path):
    settings = load_settings(environ={"AGENTBOX_HEAD_TIMEOUT_SECONDS": "2.5",
                                      "AGENTBOX_MAX_HEAD_BYTES": "16384",
                                      "AGENTBOX_MAX_IDLE_CONNECTIONS": "100",
                                      "AGENTBOX_SESSION_SECONDS": "60"},
                             overrides={"config_dir": tmp_path})
    assert (settings.head_timeout_seconds, settings.max_head_bytes,
            settings.max_idle_connections, settings.session_seconds) == (2.5, 16384, 100, 60)
    with pytest.raises(ConfigError, match="AGENTBOX_MAX_IDLE_CONNECTIONS must be less than "
                                          "AGENTBOX_MAX_CONNECTIONS"):
        load_settings(environ={"AGENTBOX_MAX_CONNECTIONS": "50"},
                      overrides={"config_dir": tmp_path})
    for name in ("AGENTBOX_HEAD_TIMEOUT_SECONDS", "AGENTBOX_MAX_HEAD_BYTES",
                 "AGENTBOX_SESSION_SECONDS"):
        with pytest.raises(ConfigError, match=name):
            load_settings(environ={name: "0"}, overrides={"config_dir": tmp_path})


def test_trusted_proxies_are_addresses_or_networks(tmp_path):
    """None by default: uvicorn would otherwise believe X-Forwarded-For from loopback."""
    assert load(tmp_path).trusted_proxies == ()
    given = load(tmp_path, environ={"AGENTBOX_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8"})
    assert given.trusted_proxies == ("127.0.0.1", "10.0.0.0/8")
    with pytest.raises(ConfigError, match="AGENTBOX_TRUSTED_PROXIES"):
        load(tmp_path, environ={"AGENTBOX_TRUSTED_PROXIES": "proxy.example"})
