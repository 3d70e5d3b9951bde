"""JSON text as `json.JSONEncoder(**options).encode` writes it, for what each event
writes several times (its log lines, its HTTP answer, its payload's strict check,
its result): `encoder(**options)`.

`JSONEncoder.encode` makes json's C encoder afresh at each call, through a Python
wrapper, and the making costs about a third of encoding a log line. Here it is made
once (`json.encoder.c_make_encoder`: the maker `encode` itself calls; where a Python
has none, or one that takes other arguments, `encode` as it is).

For acyclic values, as the engine's own are (built by it, or read from JSON): the
encoder made once keeps no record of the containers it is inside (one record shared
by every thread would see one thread's value in another's), so a value that holds
itself ends in RecursionError where json's check would say ValueError. An agent's
result is checked by an encoder of json's own (engine/agents.py) before it is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Encode = Callable[[Any], str]


def encoder(**options: Any) -> Encode:
    """`json.JSONEncoder(**options).encode`, its C encoder made once (no check for a
    value that holds itself: `check_circular` is not an option here)."""
    plain = json.JSONEncoder(**options, check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or plain.indent is not None:
        return plain.encode
    strings = (json.encoder.encode_basestring_ascii if plain.ensure_ascii
               else json.encoder.encode_basestring)
    try:
        chunks = make(None, plain.default, strings, None, plain.key_separator,
                      plain.item_separator, plain.sort_keys, plain.skipkeys, plain.allow_nan)
    except TypeError:  # a maker that takes other arguments
        return plain.encode

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode
