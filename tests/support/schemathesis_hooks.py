"""Schemathesis hooks for tests/test_openapi.py's run of its CLI: the receiver's
requests are signed as a sender signs them, so that the events Schemathesis makes
reach the contract's checks instead of stopping at 401.

The body is serialized here (JSON, as Schemathesis would) and sent as those
exact bytes, signed by one scheme or the other. What Schemathesis sends past
this hook (its `ignored_auth` check) goes unsigned and must get 401."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import schemathesis

from agentbox.signing import sign_headers, standard_headers

SECRET = os.environ.get("AGENTBOX_TEST_SIGNING_SECRET", "")


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path != "/webhooks/events" or not SECRET or not _positive(case):
        return  # a case meant to be refused goes unsigned: 401 is its refusal
    case.headers = case.headers or {}
    named = {name.lower(): name for name in case.headers}
    absent = type(case.body).__name__ == "NotSet"  # no body at all: sign the empty one
    raw = (b"" if absent else case.body if isinstance(case.body, bytes)
           else json.dumps(case.body).encode())
    now = int(time.time())
    # The document names the signature headers in its security schemes: a case that
    # carries one Schemathesis made (an invalid one, say) goes as it is, and gets 401.
    if {"x-webhook-signature", "webhook-signature"} & set(named):
        return
    if len(raw) % 2:  # the two schemes by turns
        signed = standard_headers(SECRET, "msg_schemathesis", raw, now)
    else:
        signed = sign_headers(SECRET, raw, now)
    for name, value in signed.items():
        case.headers.pop(named.get(name.lower(), name), None)
        case.headers[name] = value
    if not absent:
        case.body = raw


def _positive(case: Any) -> bool:
    """Whether Schemathesis made the case to be taken (every part of it valid)."""
    meta = getattr(case, "meta", None)
    if meta is None:
        return True
    modes = [meta.generation.mode, *(c.mode for c in meta.components.values())]
    return all(str(getattr(mode, "value", mode)) == "positive" for mode in modes)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but NOT_INVALID's: the receiver's signature headers are named
    in its security schemes, and Schemathesis then counts any other header
    (x-schemathesis-unknown-property: 42) as invalid data the server must refuse,
    where HTTP lets a request carry headers the server does not know."""
    return not (case.operation.path == "/webhooks/events"
                and getattr(failure, "code", "") == "ST201"
                and any(reason in str(failure.message) for reason in NOT_INVALID))


# ST201 for the receiver where the request was not invalid: an unknown header (HTTP
# allows it), and the document's own example, which Schemathesis now and then reports
# as "Schema-violating request accepted" while naming it a "positive test case".
NOT_INVALID = ("in header - object with unexpected properties", "positive test case")
