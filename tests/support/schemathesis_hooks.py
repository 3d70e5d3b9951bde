"""Schemathesis hooks for tests/test_openapi.py's run of its CLI: the receiver's
requests are signed as a sender signs them, so that the events Schemathesis makes
reach the contract's checks instead of stopping at 401.

Every case is signed (by one scheme or the other, by turns) over the bytes
Schemathesis sends for its body, overwriting whatever signature headers
Schemathesis filled in from the security schemes, except a case whose only
invalid part is its headers: 401 is that one's refusal. What Schemathesis sends
past this hook (its `ignored_auth` check) goes unsigned and must get 401. At exit
the run says on stderr how many receiver cases reached the contract checks (an
answer other than 401)."""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from typing import Any

import schemathesis

from agentbox.signing import RECEIVER_PATH, sign_headers, standard_headers

SECRET = os.environ.get("AGENTBOX_TEST_SIGNING_SECRET", "")
# Every header a signature scheme reads: Schemathesis fills some in (they are the
# document's security schemes); a signed case carries only this hook's.
SIGNATURE_HEADERS = frozenset({
    "x-webhook-timestamp", "x-webhook-signature", "webhook-id", "webhook-timestamp",
    "webhook-signature", "svix-id", "svix-timestamp", "svix-signature"})
COUNT_LINE = "receiver cases: {reached} of {sent} reached the contract checks"


class Counts:
    def __init__(self) -> None:
        self.sent = self.reached = 0
        self.lock = threading.Lock()

    def add(self, status_code: int) -> None:
        with self.lock:
            self.sent += 1
            self.reached += status_code != 401

    def say(self) -> None:
        if self.sent:
            print(COUNT_LINE.format(reached=self.reached, sent=self.sent), file=sys.stderr)


COUNTS = Counts()
SIGNED: set[str] = set()  # the signatures this hook wrote
atexit.register(COUNTS.say)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path != RECEIVER_PATH or not SECRET or _invalid_only_in_headers(case):
        return  # a case whose headers are what is wrong goes unsigned: 401 refuses it
    case.headers = {name: value for name, value in (case.headers or {}).items()
                    if name.lower() not in SIGNATURE_HEADERS}
    raw = _as_sent(case.body)
    now = int(time.time())
    if len(raw) % 2:  # the two schemes by turns
        signed = standard_headers(SECRET, "msg_schemathesis", raw, now)
    else:
        signed = sign_headers(SECRET, raw, now)
    case.headers.update(signed)
    SIGNED.update(value for name, value in signed.items() if name.lower().endswith("signature"))


def _as_sent(body: Any) -> bytes:
    """The bytes Schemathesis sends for a JSON body (its serializer: bytes as they are,
    None as null, anything else as requests' json=, json.dumps). The body itself is
    left as Schemathesis made it: replaced by bytes, its checks judged the bytes
    against the schema (an object), and a valid event as schema-violating."""
    if type(body).__name__ == "NotSet":  # no body at all: the empty one is signed
        return b""
    if isinstance(body, bytes):
        return body
    if body is None:
        return b"null"
    if type(body).__name__ == "Binary":
        body = str(body)
    return json.dumps(body, allow_nan=False).encode()


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if case.operation.path == RECEIVER_PATH:
        COUNTS.add(response.status_code)



def _invalid_only_in_headers(case: Any) -> bool:
    """Whether Schemathesis made the case to be refused, and not for its body (for
    its headers, the receiver's only other part)."""
    meta = getattr(case, "meta", None)
    if meta is None or _mode(meta.generation.mode) != "negative":
        return False
    # The coverage phase names the part it made invalid (and may call the body,
    # its example, negative beside it).
    where = getattr(getattr(meta.phase, "data", None), "parameter_location", None)
    if where is not None:
        return str(getattr(where, "value", where)) == "header"
    body = next((component for where, component in meta.components.items()
                 if str(getattr(where, "value", where)) == "body"), None)
    return body is None or _mode(body.mode) != "negative"


def _mode(mode: Any) -> str:
    return str(getattr(mode, "value", mode))


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but NOT_INVALID's: the receiver's signature headers are named
    in its security schemes, and Schemathesis then counts any other header
    (x-schemathesis-unknown-property: 42, or the headers this hook signed with, in
    place of the ones it made) as invalid data the server must refuse, where HTTP
    lets a request carry headers the server does not know. A case this hook signed
    and the server took, invalid in its headers only, is a valid event, signed (an
    invalid body it signed would be refused by the contract's checks, and kept)."""
    if case.operation.path != RECEIVER_PATH or getattr(failure, "code", "") != "ST201":
        return True
    message = str(failure.message)
    signed = "in header" in message and not SIGNED.isdisjoint((case.headers or {}).values())
    return not (signed or any(reason in message for reason in NOT_INVALID))


# ST201 for the receiver where the request was not invalid: an unknown header (HTTP
# allows it), and the document's own example, which Schemathesis now and then reports
# as "Schema-violating request accepted" while naming it a "positive test case".
NOT_INVALID = ("in header - object with unexpected properties", "positive test case")
