"""agentbox.jsontext: the encoder made once writes exactly what json's own writes,
with each set of options the engine uses, and refuses what json's refuses."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbox.jsontext import encoder

# The options of each encoder the engine makes (logs, http/errors, store/outcomes,
# events), and json.dumps's defaults.
OPTIONS: list[dict[str, Any]] = [
    {},
    {"default": str, "ensure_ascii": True},
    {"ensure_ascii": False, "allow_nan": False, "separators": (",", ":")},
    {"separators": (",", ":"), "sort_keys": True},
]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(),
                    st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


def as_json_writes(options: dict[str, Any], value: Any) -> str | type[Exception]:
    try:
        return json.JSONEncoder(**options).encode(value)
    except ValueError:
        return ValueError


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
@given(value=values)
def test_it_writes_what_json_writes(options: dict[str, Any], value: Any) -> None:
    expected = as_json_writes(options, value)
    encode = encoder(**options)
    if expected is ValueError:  # NaN or an infinity where allow_nan is False
        with pytest.raises(ValueError):
            encode(value)
    else:
        assert encode(value) == expected


def test_an_object_json_cannot_write_is_said_as_json_says_it() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        encoder()({"at": object()})
    assert (encoder(default=str)({"n": math.pi, "at": b"x"})
            == '{"n": 3.141592653589793, "at": "b\'x\'"}')
