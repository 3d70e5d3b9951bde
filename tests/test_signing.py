"""Webhook signatures (agentbox.signing): hex HMAC scheme, Standard Webhooks, rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from agentbox.config import secrets_in_file
from agentbox.signing import (
    MAX_SIGNATURE_HEADER_CHARS,
    SignatureError,
    Verifier,
    callback_headers,
    hex_signature,
    secret_keys,
    sender_message_id,
    sign_headers,
    standard_headers,
    standard_key,
    standard_signature,
    verify_callback,
)
from tests.vectors import VECTORS_PATH

VECTORS = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
HEX_CASES = VECTORS["hmac_hex"]
HEX_FAIL_CASES = VECTORS["hmac_hex_must_fail"]
SW_CASES = VECTORS["standard_webhooks"]
CODES = {"signature_missing", "signature_invalid", "signature_expired", "timestamp_invalid"}
MAX_AGE = 300


def _body(case: dict) -> bytes:
    return base64.b64decode(case["body_base64"])


def _hex_headers(ts: str, sig: str) -> Headers:
    # Starlette's case-insensitive Headers, as the receiver passes them.
    return Headers(headers={"X-Webhook-Timestamp": ts, "X-Webhook-Signature": sig})


def _sw_headers(msg_id: str, ts: str, sig: str) -> Headers:
    return Headers(
        headers={"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": sig}
    )


def _code(verifier: Verifier, headers, body: bytes, now: float) -> str | None:
    try:
        verifier.verify(headers, body, now)
    except SignatureError as exc:
        assert exc.code in CODES
        assert exc.message and str(exc) == exc.message
        return exc.code
    return None


def test_vector_file_is_not_empty():
    assert len(HEX_CASES) >= 1 and len(HEX_FAIL_CASES) >= 1 and len(SW_CASES) >= 1


# -- vectors --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", HEX_CASES, ids=lambda c: f"{c['secret'][:8]}-{c['signature'][:8]}")
def test_hex_vectors_pass(case):
    body = _body(case)
    assert hex_signature(case["secret"].encode(), case["timestamp"], body) == case["signature"]
    verifier = Verifier([case["secret"]], MAX_AGE)
    now = float(case["timestamp"])
    verifier.verify(_hex_headers(case["timestamp"], case["signature"]), body, now)
    # sign_headers produces the vector's exact header values.
    assert sign_headers(case["secret"], body, int(case["timestamp"])) == {
        "X-Webhook-Timestamp": case["timestamp"],
        "X-Webhook-Signature": case["signature"],
    }


@pytest.mark.parametrize("case", HEX_CASES, ids=lambda c: f"{c['secret'][:8]}-{c['signature'][:8]}")
def test_hex_vectors_fail_with_another_secret(case):
    verifier = Verifier(["some-other-secret"], MAX_AGE)
    headers = _hex_headers(case["timestamp"], case["signature"])
    assert _code(verifier, headers, _body(case), float(case["timestamp"])) == "signature_invalid"


@pytest.mark.parametrize("case", HEX_FAIL_CASES, ids=lambda c: c["why"])
def test_hex_must_fail_vectors_fail(case):
    verifier = Verifier([case["secret"]], MAX_AGE)
    headers = _hex_headers(case["timestamp"], case["signature"])
    assert _code(verifier, headers, _body(case), float(case["timestamp"])) == "signature_invalid"


@pytest.mark.parametrize("case", SW_CASES, ids=lambda c: f"{c['secret'][:14]}-{c['webhook_id']}")
@pytest.mark.parametrize("header", ["webhook_signature", "webhook_signature_with_rotation"])
def test_standard_webhooks_vectors_pass(case, header):
    body = _body(case)
    key = secret_keys(case["secret"])[0]
    assert key == base64.b64decode(case["secret"][len("whsec_"):])
    expected = standard_signature(key, case["webhook_id"], case["webhook_timestamp"], body)
    assert expected == case["webhook_signature"]
    verifier = Verifier([case["secret"]], MAX_AGE)
    headers = _sw_headers(case["webhook_id"], case["webhook_timestamp"], case[header])
    verifier.verify(headers, body, float(case["webhook_timestamp"]))


@pytest.mark.parametrize("case", SW_CASES, ids=lambda c: f"{c['secret'][:14]}-{c['webhook_id']}")
def test_svix_header_names_are_the_standards_own(case):
    """Svix's libraries send svix-id, svix-timestamp and svix-signature: the same
    scheme under its own names, refused as signature_missing before."""
    body, now = _body(case), float(case["webhook_timestamp"])
    verifier = Verifier([case["secret"]], MAX_AGE)
    svix = Headers(headers={"svix-id": case["webhook_id"],
                            "svix-timestamp": case["webhook_timestamp"],
                            "svix-signature": case["webhook_signature_with_rotation"]})
    verifier.check_headers(svix, now)
    verifier.verify(svix, body, now)
    assert sender_message_id(svix) == case["webhook_id"]
    assert _code(verifier, svix, body + b" ", now) == "signature_invalid"
    stale = Headers(headers={**svix, "svix-timestamp": str(int(now) - MAX_AGE - 1)})
    with pytest.raises(SignatureError) as refused:
        verifier.check_headers(stale, now)
    assert refused.value.code == "signature_expired"


def test_the_headers_alone_refuse_what_no_body_could_save():
    """check_headers: what verify would refuse whatever the body (before it is read)."""
    verifier = Verifier(["s"], MAX_AGE)
    for headers, code in (({}, "signature_missing"),
                          ({"X-Webhook-Signature": "00"}, "signature_missing"),
                          ({"X-Webhook-Signature": "00", "X-Webhook-Timestamp": "1"},
                           "signature_expired"),
                          ({"webhook-signature": "v1,AA", "webhook-timestamp": "1000"},
                           "signature_missing")):
        with pytest.raises(SignatureError) as refused:
            verifier.check_headers(Headers(headers=headers), 1000.0)
        assert refused.value.code == code, headers
    verifier.check_headers(Headers(headers={"X-Webhook-Signature": "00",
                                            "X-Webhook-Timestamp": "1000"}), 1000.0)


@pytest.mark.parametrize("case", SW_CASES, ids=lambda c: f"{c['secret'][:14]}-{c['webhook_id']}")
def test_standard_webhooks_vectors_fail_when_tampered(case):
    body, now = _body(case), float(case["webhook_timestamp"])
    verifier = Verifier([case["secret"]], MAX_AGE)
    sig, ts, msg_id = case["webhook_signature"], case["webhook_timestamp"], case["webhook_id"]
    assert _code(verifier, _sw_headers(msg_id, ts, sig), body + b" ", now) == "signature_invalid"
    assert _code(verifier, _sw_headers(msg_id + "x", ts, sig), body, now) == "signature_invalid"
    assert _code(verifier, _sw_headers(msg_id, str(int(ts) + 1), sig), body, now) == (
        "signature_invalid"
    )
    # Only the decoy of the rotation header: refused.
    decoy = case["webhook_signature_with_rotation"].split()[0]
    assert _code(verifier, _sw_headers(msg_id, ts, decoy), body, now) == "signature_invalid"
    # Another secret: refused.
    other = Verifier(["whsec_" + base64.b64encode(b"x" * 24).decode()], MAX_AGE)
    assert _code(other, _sw_headers(msg_id, ts, sig), body, now) == "signature_invalid"
    # Outside the window: expired.
    assert _code(verifier, _sw_headers(msg_id, ts, sig), body, now + MAX_AGE + 1) == (
        "signature_expired"
    )


@pytest.mark.parametrize("case", SW_CASES, ids=lambda c: f"{c['secret'][:14]}-{c['webhook_id']}")
def test_standard_webhooks_with_rotated_secrets(case):
    verifier = Verifier(["whsec_" + base64.b64encode(b"old" * 10).decode(), case["secret"]], 60)
    headers = _sw_headers(case["webhook_id"], case["webhook_timestamp"], case["webhook_signature"])
    verifier.verify(headers, _body(case), float(case["webhook_timestamp"]))


# -- headers, codes -------------------------------------------------------------------------


def test_no_signature_headers_is_signature_missing():
    verifier = Verifier(["s"], MAX_AGE)
    assert _code(verifier, Headers(headers={}), b"{}", 1000.0) == "signature_missing"
    assert _code(verifier, {"content-type": "application/json"}, b"{}", 1000.0) == (
        "signature_missing"
    )


def test_hex_signature_without_timestamp_is_signature_missing():
    verifier = Verifier(["s"], MAX_AGE)
    sig = hex_signature(b"s", "1000", b"{}")
    headers = Headers(headers={"X-Webhook-Signature": sig})
    assert _code(verifier, headers, b"{}", 1000.0) == "signature_missing"


def test_standard_without_id_or_timestamp_is_signature_missing():
    case = SW_CASES[0]
    verifier = Verifier([case["secret"]], MAX_AGE)
    now = float(case["webhook_timestamp"])
    no_id = Headers(headers={"webhook-timestamp": case["webhook_timestamp"],
                             "webhook-signature": case["webhook_signature"]})
    assert _code(verifier, no_id, _body(case), now) == "signature_missing"
    no_ts = Headers(headers={"webhook-id": case["webhook_id"],
                             "webhook-signature": case["webhook_signature"]})
    assert _code(verifier, no_ts, _body(case), now) == "signature_missing"


@pytest.mark.parametrize(
    "ts", ["", "abc", "12.5", "-5", "1e9", "0x10", "1785166920000", "١٢٣", "+1785166920", "1 2"]
)
def test_malformed_timestamp_is_timestamp_invalid(ts):
    verifier = Verifier(["s"], MAX_AGE)
    headers = {"x-webhook-timestamp": ts, "x-webhook-signature": hex_signature(b"s", ts, b"")}
    assert _code(verifier, headers, b"", 1785166920.0) == "timestamp_invalid"


def test_timestamp_window_boundaries():
    secret, body, ts = "s3cret", b'{"a":1}', 1_700_000_000
    verifier = Verifier([secret], MAX_AGE)
    headers = Headers(headers=sign_headers(secret, body, ts))
    for now in (ts, ts - MAX_AGE, ts + MAX_AGE, ts + 0.5):
        verifier.verify(headers, body, now)
    for now in (ts + MAX_AGE + 1, ts - MAX_AGE - 1, ts + 10**6, 0.0):
        assert _code(verifier, headers, body, now) == "signature_expired"


def test_expired_message_names_the_window():
    verifier = Verifier(["s"], 300)
    headers = Headers(headers=sign_headers("s", b"", 1000))
    with pytest.raises(SignatureError) as info:
        verifier.verify(headers, b"", 5000.0)
    assert "300" in info.value.message


def test_hex_signature_is_lowercase_hex_of_ts_dot_body():
    key, ts, body = b"k", "123", b"hello"
    expected = hmac.new(key, b"123.hello", hashlib.sha256).hexdigest()
    assert hex_signature(key, ts, body) == expected
    assert expected == expected.lower() and len(expected) == 64


def test_sign_headers_with_whsec_secret_verifies():
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()
    verifier = Verifier([secret], MAX_AGE)
    headers = Headers(headers=sign_headers(secret, b"{}", 1000))
    verifier.verify(headers, b"{}", 1000.0)
    # The raw text of a whsec_ secret is accepted by the hex scheme as well.
    raw = Headers(headers={"X-Webhook-Timestamp": "1000",
                           "X-Webhook-Signature": hex_signature(secret.encode(), "1000", b"{}")})
    verifier.verify(raw, b"{}", 1000.0)


def test_secret_keys():
    assert secret_keys("plain") == (b"plain",)
    assert secret_keys("whsec_AAEC") == (b"\x00\x01\x02", b"whsec_AAEC")
    # Not base64: only the raw text.
    assert secret_keys("whsec_not*base64!") == (b"whsec_not*base64!",)


def test_oversized_signature_header_is_invalid():
    verifier = Verifier(["s"], MAX_AGE)
    good = hex_signature(b"s", "1000", b"")
    hex_headers = {"x-webhook-timestamp": "1000",
                   "x-webhook-signature": good + " " * (MAX_SIGNATURE_HEADER_CHARS + 10) + "x"}
    assert _code(verifier, hex_headers, b"", 1000.0) == "signature_invalid"
    sw_good = standard_signature(b"s", "id", "1000", b"")
    sw_headers = {"webhook-id": "id", "webhook-timestamp": "1000",
                  "webhook-signature": "v1,x " * 1000 + sw_good}
    assert _code(verifier, sw_headers, b"", 1000.0) == "signature_invalid"


def test_no_secrets_accepts_nothing():
    verifier = Verifier([], MAX_AGE)
    headers = Headers(headers=sign_headers("s", b"", 1000))
    assert _code(verifier, headers, b"", 1000.0) == "signature_invalid"


# -- properties -----------------------------------------------------------------------------

secrets_st = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=64
)
bodies = st.binary(max_size=512)
timestamps = st.integers(min_value=0, max_value=99_999_999_999)


@settings(max_examples=100, deadline=None)
@given(secret=secrets_st, body=bodies, ts=timestamps,
       skew=st.floats(min_value=-MAX_AGE, max_value=MAX_AGE))
def test_sign_then_verify_roundtrip(secret, body, ts, skew):
    verifier = Verifier([secret], MAX_AGE)
    verifier.verify(Headers(headers=sign_headers(secret, body, ts)), body, ts + skew)


@settings(max_examples=100, deadline=None)
@given(secret=secrets_st, body=st.binary(min_size=1, max_size=256), ts=timestamps,
       data=st.data())
def test_any_single_byte_change_fails(secret, body, ts, data):
    headers = Headers(headers=sign_headers(secret, body, ts))
    i = data.draw(st.integers(min_value=0, max_value=len(body) - 1), label="index")
    new = data.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != body[i]))
    tampered = body[:i] + bytes([new]) + body[i + 1:]
    assert _code(Verifier([secret], MAX_AGE), headers, tampered, ts) == "signature_invalid"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3)
    | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(secret=secrets_st, obj=st.dictionaries(st.text(max_size=8), json_values, min_size=1,
                                               max_size=4), ts=timestamps)
def test_reserialised_json_fails(secret, obj, ts):
    body = json.dumps(obj, separators=(",", ":")).encode()
    headers = Headers(headers=sign_headers(secret, body, ts))
    verifier = Verifier([secret], MAX_AGE)
    verifier.verify(headers, body, ts)
    for other in (json.dumps(obj).encode(), json.dumps(obj, indent=2).encode(), body + b"\n",
                  b" " + body):
        assert other != body
        assert _code(verifier, headers, other, ts) == "signature_invalid"


@settings(max_examples=100, deadline=None)
@given(secret=secrets_st, body=bodies, ts=timestamps,
       offset=st.integers(min_value=MAX_AGE + 1, max_value=10**9), future=st.booleans())
def test_outside_window_is_expired(secret, body, ts, offset, future):
    headers = Headers(headers=sign_headers(secret, body, ts))
    now = ts - offset if future else ts + offset  # future: signed ahead of the server's clock
    assert _code(Verifier([secret], MAX_AGE), headers, body, now) == "signature_expired"


@settings(max_examples=60, deadline=None)
@given(old=secrets_st, new=secrets_st, body=bodies, ts=timestamps)
def test_rotation_accepts_old_and_new(old, new, body, ts):
    verifier = Verifier([old, new], MAX_AGE)
    verifier.verify(Headers(headers=sign_headers(old, body, ts)), body, ts)
    verifier.verify(Headers(headers=sign_headers(new, body, ts)), body, ts)
    if old != new:
        assert _code(Verifier([new], MAX_AGE), Headers(headers=sign_headers(old, body, ts)),
                     body, ts) == "signature_invalid"


header_names = st.sampled_from([
    "x-webhook-timestamp", "x-webhook-signature", "webhook-id", "webhook-timestamp",
    "webhook-signature", "content-type",
])
garbage_text = st.one_of(
    st.text(max_size=50),
    st.text(max_size=20).map(lambda s: s * 500),  # huge
    st.text(alphabet=st.characters(min_codepoint=128), max_size=30),  # non-ascii
    st.from_regex(r"v1,[A-Za-z0-9+/=]{0,60}( v1,[A-Za-z0-9+/=]{0,60}){0,3}", fullmatch=True),
    st.integers(min_value=0, max_value=10**15).map(str),
    st.sampled_from(["", " ", "v1,", "v1", "1785166920", " 1785166920 "]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=st.dictionaries(header_names | st.text(max_size=10), garbage_text, max_size=6),
       body=bodies, now=st.floats(min_value=0, max_value=1e11))
def test_garbage_headers_only_raise_signature_error(headers, body, now):
    verifier = Verifier(["s3cret", "whsec_" + base64.b64encode(b"k" * 24).decode()], MAX_AGE)
    with pytest.raises(SignatureError) as info:
        verifier.verify(headers, body, now)
    assert info.value.code in CODES


def test_vendored_vectors_match_the_shared_ones() -> None:
    from tests.vectors import SHARED_VECTORS_PATH
    if not SHARED_VECTORS_PATH.exists():
        pytest.skip("no shared/ folder beside this clone; the vendored copy is used as is")
    assert json.loads(VECTORS_PATH.read_text()) == json.loads(SHARED_VECTORS_PATH.read_text())


# -- Standard Webhooks' own library (the reference implementation) ------------------------

PLAIN = "replace-with-a-long-random-secret"  # a secret from before whsec_ (still works)


def _now_headers(headers: dict[str, str]) -> float:
    return float(headers.get("webhook-timestamp") or headers["X-Webhook-Timestamp"])


def test_a_new_webhook_secret_loads_in_the_standard_library(tmp_path) -> None:
    """The secret agentbox makes (first start, and each rotation) is in the standard's
    form: its libraries load it, and what they sign with it agentbox verifies."""
    from standardwebhooks.webhooks import Webhook

    from agentbox.config import ensure_webhook_secret, load_settings, rotate_secret

    _, path = ensure_webhook_secret(load_settings(environ={}, overrides={
        "config_dir": tmp_path, "data_dir": tmp_path}))
    assert path is not None
    rotate_secret(path)
    made = secrets_in_file(path)
    assert len(made) == 2
    body = b'{"a":1}'
    for secret in made:
        assert secret.startswith("whsec_")
        assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
        signed = Webhook(secret).sign("msg_1", datetime.now(UTC), body)
        headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(time.time())),
                   "webhook-signature": signed}
        Verifier(made, MAX_AGE).verify(headers, body, time.time())


@pytest.mark.parametrize("secret", [PLAIN, SW_CASES[0]["secret"]], ids=["plain", "whsec"])
def test_senders_sign_with_either_header_set_and_either_form(secret: str) -> None:
    """The docs' rules for a sender: the hex scheme keys with the secret's text; the
    standard's headers with the decoded whsec_ key, or a plain secret's text (handed
    to the library as bytes)."""
    from standardwebhooks.webhooks import Webhook

    body, now = b'{"event":"x"}', time.time()
    verifier = Verifier([secret], MAX_AGE)
    library = Webhook(secret) if secret.startswith("whsec_") else Webhook(secret.encode())
    standard = {"webhook-id": "e1", "webhook-timestamp": str(int(now)),
                "webhook-signature": library.sign("e1", datetime.fromtimestamp(now, UTC), body)}
    assert standard == standard_headers(secret, "e1", body, int(now))
    verifier.verify(standard, body, now)
    text_key = hmac.new(secret.encode(), f"{int(now)}.".encode() + body, hashlib.sha256)
    assert sign_headers(secret, body, int(now))["X-Webhook-Signature"] == text_key.hexdigest()
    verifier.verify(sign_headers(secret, body, int(now)), body, now)


def test_an_unpadded_whsec_secret_verifies_as_the_libraries_read_it() -> None:
    from standardwebhooks.webhooks import Webhook

    secret = "whsec_" + base64.b64encode(b"k" * 25).decode().rstrip("=")
    assert standard_key(secret) == b"k" * 25
    body, now = b"{}", time.time()
    signed = Webhook(secret).sign("m", datetime.fromtimestamp(now, UTC), body)
    Verifier([secret], MAX_AGE).verify(
        {"webhook-id": "m", "webhook-timestamp": str(int(now)), "webhook-signature": signed},
        body, now)


@pytest.mark.parametrize("holder", [0, 1, 2])
def test_a_callback_verifies_with_any_active_secret(holder: int) -> None:
    """During a rotation a receiver may hold any of the active callback secrets: with
    the documented recipe (verify_callback) and with the standard's library, every
    callback verifies, whichever it holds; X-Agent-Signature stays the current one's."""
    from standardwebhooks.webhooks import Webhook

    active = ["whsec_" + base64.b64encode(bytes([i]) * 32).decode() for i in (1, 2)] + [PLAIN]
    body = json.dumps({"notification_id": "run_1:succeeded:0"}).encode()
    now = int(time.time())
    headers = callback_headers(active, "run_1:succeeded:0", body, now)
    held = active[holder]
    assert verify_callback(held, headers, body, now=now)["notification_id"] == "run_1:succeeded:0"
    library = Webhook(held) if held.startswith("whsec_") else Webhook(held.encode())
    assert library.verify(body, headers)["notification_id"] == "run_1:succeeded:0"
    hex_only = {k: v for k, v in headers.items() if k.startswith("X-")}
    if holder == 0:
        verify_callback(held, hex_only, body, now=now)
    else:
        with pytest.raises(SignatureError):
            verify_callback(held, hex_only, body, now=now)


def test_a_callback_with_both_header_sets_verifies_by_either() -> None:
    body, now = b"{}", 1000
    agent = {"X-Agent-Timestamp": str(now),
             "X-Agent-Signature": sign_headers("other", body, now)["X-Webhook-Signature"]}
    both = {**agent, **standard_headers("mine", "m", body, now)}
    assert verify_callback("mine", both, body, now=now) == {}
    with pytest.raises(SignatureError) as refused:
        verify_callback("neither", both, body, now=now)
    assert refused.value.code == "signature_invalid"


def test_an_event_with_both_header_sets_is_judged_by_its_hex_signature() -> None:
    body, now = b"{}", 1000
    both = {**sign_headers("other", body, now), **standard_headers("mine", "m", body, now)}
    with pytest.raises(SignatureError):
        Verifier(["mine"], MAX_AGE).verify(both, body, now)
    Verifier(["other"], MAX_AGE).verify(both, body, now)
