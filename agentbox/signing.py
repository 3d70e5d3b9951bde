"""Webhook signatures: agentbox's hex HMAC scheme and Standard Webhooks.

Which bytes are the HMAC key, for a secret as it is written (in the secret
file, AGENTBOX_WEBHOOK_SECRET, AGENTBOX_CALLBACK_SECRET):

- agentbox's hex scheme (``X-Webhook-*`` in, ``X-Agent-*`` out):
  ``hex(HMAC-SHA256(key, ts + "." + body))`` where the key is the secret's
  text, UTF-8, whatever its form (a ``whsec_…`` secret too, prefix and all),
  as in the reference design.
- Standard Webhooks (``webhook-*``): ``"v1," + base64(HMAC-SHA256(key, id +
  "." + ts + "." + body))`` where a ``whsec_`` secret's key is its
  base64-decoded tail (what every Standard Webhooks library does with it) and
  any other secret's key is its text, UTF-8.

Svix, which wrote Standard Webhooks, sends the same headers under its own names
(``svix-id``, ``svix-timestamp``, ``svix-signature``): a request is taken when
either complete set verifies (the ``webhook-*`` one is tried first, as the
Standard Webhooks libraries read it; the Svix libraries read ``svix-*`` first),
each within the same replay window.

Verifying is lenient where it costs nothing: a ``whsec_`` secret's decoded
key and its text both verify either scheme. Several signatures (space
separated) and several secrets (rotation) may be in play. An incoming event
that carries an X-Webhook-Signature is judged by it alone; a callback verifies
when any set it carries does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

# Where signed events are POSTed: the receiver's route and every sender's target.
RECEIVER_PATH = "/webhooks/events"
HEX_TIMESTAMP_HEADER = "x-webhook-timestamp"
HEX_SIGNATURE_HEADER = "x-webhook-signature"
SW_ID_HEADER = "webhook-id"
SW_TIMESTAMP_HEADER = "webhook-timestamp"
SW_SIGNATURE_HEADER = "webhook-signature"
# Svix's names for the Standard Webhooks headers, each read as the standard's own.
SVIX_HEADERS = {"svix-id": SW_ID_HEADER, "svix-timestamp": SW_TIMESTAMP_HEADER,
                "svix-signature": SW_SIGNATURE_HEADER}
# The Standard Webhooks header sets, by their prefix, in the order they are tried.
STANDARD_PREFIXES = ("webhook", "svix")
AGENT_TIMESTAMP_HEADER = "x-agent-timestamp"
AGENT_SIGNATURE_HEADER = "x-agent-signature"
MAX_SIGNATURE_HEADER_CHARS = 4096
WHSEC_PREFIX = "whsec_"


class SignatureError(Exception):
    """Why a request's signature was refused; `code` is the wire error_code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def hex_key(secret: str) -> bytes:
    """The HMAC key of the hex scheme: the secret's text."""
    return secret.encode()


def standard_key(secret: str) -> bytes:
    """The HMAC key of Standard Webhooks: a ``whsec_`` secret's base64-decoded tail
    (padding may be left out, as the libraries allow), else the secret's text."""
    if secret.startswith(WHSEC_PREFIX):
        tail = secret[len(WHSEC_PREFIX):]
        try:
            return base64.b64decode(tail + "=" * (-len(tail) % 4), validate=True)
        except (binascii.Error, ValueError):
            pass
    return secret.encode()


def secret_keys(secret: str) -> tuple[bytes, ...]:
    """Every HMAC key one configured secret verifies with: a ``whsec_`` secret's
    decoded key and then its text; any other secret's text alone."""
    keys = (standard_key(secret), hex_key(secret))
    return keys if keys[0] != keys[1] else keys[:1]


def hex_signature(key: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def standard_signature(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def sign_headers(secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """Headers for agentbox's own scheme (used by `agentbox send`, tests, the benchmark)."""
    ts = str(timestamp)
    return {
        "X-Webhook-Timestamp": ts,
        "X-Webhook-Signature": hex_signature(hex_key(secret), ts, body),
    }


def standard_headers(secret: str, msg_id: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The Standard Webhooks headers of one request signed with `secret`."""
    ts = str(timestamp)
    return {SW_ID_HEADER: msg_id, SW_TIMESTAMP_HEADER: ts,
            SW_SIGNATURE_HEADER: standard_signature(standard_key(secret), msg_id, ts, body)}


def callback_headers(secrets: Sequence[str], notification_id: str, body: bytes,
                     timestamp: int) -> dict[str, str]:
    """The signature headers of one callback delivery.

    ``X-Agent-Signature`` is the hex scheme with the first (current) secret, as the
    reference design has it; ``webhook-signature`` carries one Standard Webhooks
    signature per active secret, so a receiver holding any of them verifies during
    a rotation (`verify_callback` tries it first).
    """
    ts = str(timestamp)
    return {
        "X-Agent-Timestamp": ts,
        "X-Agent-Signature": hex_signature(hex_key(secrets[0]), ts, body),
        "webhook-id": notification_id,
        "webhook-timestamp": ts,
        "webhook-signature": " ".join(
            standard_signature(standard_key(s), notification_id, ts, body) for s in secrets),
    }


def verify_callback(secret: str | Sequence[str], headers: Mapping[str, str], body: bytes,
                    max_age_seconds: float = 300, now: float | None = None) -> dict[str, Any]:
    """Check a callback from agentbox and return its notification.

    `headers` may carry either scheme (``X-Agent-*`` or Standard Webhooks);
    `body` must be the exact raw bytes received. The Standard Webhooks
    signature is checked first: agentbox signs it with every active callback
    secret, so any one of them verifies during a rotation (``X-Agent-Signature``
    carries the current secret's only). Raises SignatureError. Drop
    notifications whose ``notification_id`` you have already handled: a
    callback is delivered at least once.
    """
    secrets = [secret] if isinstance(secret, str) else list(secret)
    verifier = Verifier(secrets, max_age_seconds, AGENT_TIMESTAMP_HEADER, AGENT_SIGNATURE_HEADER,
                        standard_first=True)
    verifier.verify(headers, body, time.time() if now is None else now)
    try:
        notification: dict[str, Any] = json.loads(body)
    except ValueError:
        raise SignatureError("body_invalid", "The signed body is not JSON.") from None
    return notification


class Verifier:
    """Checks a request's signature headers against every active secret."""

    def __init__(self, secrets: Sequence[str], max_age_seconds: float,
                 timestamp_header: str = HEX_TIMESTAMP_HEADER,
                 signature_header: str = HEX_SIGNATURE_HEADER,
                 standard_first: bool = False) -> None:
        self._keys = tuple(k for s in secrets for k in secret_keys(s))
        self.max_age_seconds = max_age_seconds
        self._timestamp_header, self._signature_header = timestamp_header, signature_header
        self._either = standard_first

    def verify(self, headers: Mapping[str, str], body: bytes, now: float,
               present: Sequence[_HeaderSet] | None = None) -> str | None:
        """Raise SignatureError unless some secret signed this exact body recently;
        return the id of the Standard Webhooks set that verified (None for the hex one).
        `present`: what `check_headers` answered for the same headers (read once).

        Incoming events: an X-Webhook-Signature decides alone; without one, either
        complete Standard Webhooks set (``webhook-*`` or Svix's ``svix-*``) may verify,
        as the libraries of each name read their own set first. Callbacks
        (`standard_first`): any set present may verify, the Standard Webhooks ones
        first (they carry every active secret, the hex one the first)."""
        refusal: SignatureError | None = None
        for check in self._present(headers) if present is None else present:
            try:
                return self._check(check, body, now)
            except SignatureError as exc:
                refusal = refusal or exc
                if check.decides:
                    break
        raise refusal or self._missing()

    def check_headers(self, headers: Mapping[str, str], now: float) -> list[_HeaderSet]:
        """Raise SignatureError when the headers alone refuse the request (no signature,
        a stale or malformed timestamp, no webhook-id), before its body is read: a
        sender without the secret cannot make agentbox wait for a body it declared.
        The signature itself is checked by `verify`, on the body, given the header
        sets this answers."""
        refusal: SignatureError | None = None
        present = self._present(headers)
        for check in present:
            try:
                self._fresh(check, now)
            except SignatureError as exc:
                refusal = refusal or exc
                if check.decides:
                    break
            else:
                return present
        raise refusal or self._missing()

    def _present(self, headers: Mapping[str, str]) -> list[_HeaderSet]:
        """The header sets this request carries a signature in, in the order tried."""
        named = {name.lower(): value for name, value in headers.items()}
        found: list[_HeaderSet] = []
        signature = named.get(self._signature_header)
        if signature is not None:
            found.append(_HeaderSet(None, named.get(self._timestamp_header), signature,
                                    not self._either, False))
        for prefix in STANDARD_PREFIXES:
            signature = named.get(f"{prefix}-signature")
            if signature is not None:
                found.append(_HeaderSet(named.get(f"{prefix}-id"),
                                        named.get(f"{prefix}-timestamp"), signature,
                                        False, True))
        if self._either and found and not found[0].is_standard:
            found.append(found.pop(0))  # the Standard Webhooks sets first
        return found

    def _fresh(self, found: _HeaderSet, now: float) -> str:
        """The set's timestamp, if the headers alone do not refuse it."""
        if found.is_standard and not found.msg_id:
            raise _no_webhook_id()
        return self._fresh_timestamp(found.timestamp, now)

    def _check(self, found: _HeaderSet, body: bytes, now: float) -> str | None:
        timestamp = self._fresh(found, now)
        signature = found.signature or ""
        if not found.is_standard or found.msg_id is None:
            self._verify_hex(timestamp, signature, body)
            return None
        self._verify_standard(found.msg_id, timestamp, signature, body)
        return found.msg_id

    def _missing(self) -> SignatureError:
        return SignatureError(
            "signature_missing",
            f"Sign the request: send {self._timestamp_header.title()} and "
            f"{self._signature_header.title()} (or the Standard Webhooks headers).",
        )

    def _verify_hex(self, timestamp: str, signature: str, body: bytes) -> None:
        given = signature.strip().lower()
        if len(given) > MAX_SIGNATURE_HEADER_CHARS:
            raise _invalid()
        given_bytes = given.encode("ascii", "replace")
        for key in self._keys:
            expected = hex_signature(key, timestamp, body).encode()
            if hmac.compare_digest(expected, given_bytes):
                return
        raise _invalid()

    def _verify_standard(self, msg_id: str, timestamp: str, header: str, body: bytes) -> None:
        if len(header) > MAX_SIGNATURE_HEADER_CHARS:
            raise _invalid()
        given = [s.encode("ascii", "replace") for s in header.split() if s.startswith("v1,")]
        for key in self._keys:
            expected = standard_signature(key, msg_id, timestamp, body).encode()
            # Compare against every candidate so timing does not reveal which matched.
            if any(hmac.compare_digest(expected, g) for g in given):
                return
        raise _invalid()

    def _fresh_timestamp(self, value: str | None, now: float) -> str:
        if value is None:
            raise SignatureError("signature_missing", "The signature timestamp header is missing.")
        value = value.strip()
        if not value.isascii() or not value.isdigit() or len(value) > 12:
            raise SignatureError(
                "timestamp_invalid", "The signature timestamp must be integer Unix seconds."
            )
        if abs(now - int(value)) > self.max_age_seconds:
            raise SignatureError(
                "signature_expired",
                f"The signature timestamp is more than {self.max_age_seconds:g} s away from "
                "the server's clock; sign with the current time.",
            )
        return value


class _HeaderSet(NamedTuple):
    """One set of signature headers a request carries: the hex scheme's (no id) or a
    Standard Webhooks one (``webhook-*`` or ``svix-*``). `decides`: a refusal of this
    set refuses the request, whatever other sets it carries."""

    msg_id: str | None
    timestamp: str | None
    signature: str | None
    decides: bool
    is_standard: bool


def standard_names(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` with lower-case names, Svix's names (SVIX_HEADERS) read as the
    Standard Webhooks ones they stand for where those are absent."""
    named = {name.lower(): value for name, value in headers.items()}
    for svix, standard in SVIX_HEADERS.items():
        if svix in named and standard not in named:
            named[standard] = named[svix]
    return named


def sender_message_id(headers: Mapping[str, str]) -> str | None:
    """The sender's own id of the request (`webhook-id`, or Svix's `svix-id`), if any."""
    return standard_names(headers).get(SW_ID_HEADER) or None


def _no_webhook_id() -> SignatureError:
    return SignatureError("signature_missing", "Standard Webhooks requests need webhook-id.")


def _invalid() -> SignatureError:
    return SignatureError(
        "signature_invalid",
        "The signature does not match the body with any active secret; sign the exact "
        "raw bytes you send.",
    )
