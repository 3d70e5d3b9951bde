"""The event contract (agentbox.events): parse_event and its field-level errors."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentbox.events import InvalidEvent, parse_event
from agentbox.review.contract import MixReviewRequested, SessionExported
from tests.vectors import VECTORS_PATH

VECTOR_BODY = base64.b64decode(
    json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["hmac_hex"][0]["body_base64"]
)
REQUIRED = ["schema_version", "event_id", "idempotency_key", "event_type", "source",
            "timestamp", "payload"]


def base_event() -> dict:
    return json.loads(VECTOR_BODY)


def review_event() -> dict:
    return {
        "schema_version": "v1",
        "event_id": "review-1",
        "idempotency_key": "studio-api:mix.review_requested:review-1",
        "event_type": "mix.review_requested",
        "source": "studio-api",
        "timestamp": "2026-07-27T15:42:00+02:00",
        "payload": {"project_id": "night-drive", "mix_url": "file:///tmp/mix.wav",
                    "profile": "club", "requested_by": "ana", "note": "vocals louder?"},
    }


def encode(obj) -> bytes:
    return json.dumps(obj).encode()


def errors_of(body: bytes) -> list[dict]:
    with pytest.raises(InvalidEvent) as info:
        parse_event(body)
    errors = info.value.errors
    assert errors, "InvalidEvent without errors"
    for e in errors:
        assert set(e) == {"loc", "msg", "type"}
        assert isinstance(e["loc"], list) and isinstance(e["msg"], str) and e["msg"]
        assert isinstance(e["type"], str) and e["type"]
    assert str(info.value)
    return errors


def locs(errors: list[dict]) -> list[tuple]:
    return [tuple(e["loc"]) for e in errors]


def one_error(obj_or_body) -> dict:
    body = obj_or_body if isinstance(obj_or_body, bytes) else encode(obj_or_body)
    errors = errors_of(body)
    assert len(errors) == 1, errors
    return errors[0]


# -- valid events ---------------------------------------------------------------------------


def test_vector_body_is_a_valid_session_exported():
    event = parse_event(VECTOR_BODY)
    assert event.event_type == "session.exported"
    assert event.event_id == "export-a81f"
    assert event.source == "studio-api"
    assert event.idempotency_key == "studio-api:session.exported:export-a81f"
    assert event.callback_url == "https://studio.example/webhook-results"
    assert event.timestamp == dt.datetime(2026, 7, 27, 15, 42, tzinfo=dt.UTC)
    assert event.hop == 0 and event.correlation_id is None
    assert isinstance(event.payload, SessionExported)
    assert event.payload.project_id == "night-drive"
    assert event.payload.mix_url == "s3://music-projects/night-drive/mix.wav"
    assert "export-a81f" in repr(event)


def test_mix_review_requested_is_valid():
    event = parse_event(encode(review_event()))
    assert isinstance(event.payload, MixReviewRequested)
    assert event.payload.note == "vocals louder?"
    assert event.payload.requested_by == "ana"
    assert event.timestamp.utcoffset() == dt.timedelta(hours=2)


def test_optional_chain_fields_are_accepted():
    obj = base_event()
    obj.update(correlation_id="chain-1", causation_id="export-a80f", hop=3)
    obj.pop("callback_url")
    event = parse_event(encode(obj))
    assert (event.correlation_id, event.causation_id, event.hop) == ("chain-1", "export-a80f", 3)
    assert event.callback_url is None


def test_optional_payload_fields_may_be_null():
    obj = base_event()
    obj["payload"].update(profile=None, session_name=None)
    assert parse_event(encode(obj)).payload.profile is None


def test_event_type_is_tied_to_payload_model():
    # A session.exported payload with a review-only field is refused.
    obj = base_event()
    obj["payload"]["note"] = "hello"
    assert locs(errors_of(encode(obj))) == [("payload", "note")]
    # And the same payload under mix.review_requested is fine.
    obj["event_type"] = "mix.review_requested"
    obj["idempotency_key"] = "studio-api:mix.review_requested:export-a81f"
    obj["payload"]["requested_by"] = "ana"
    assert isinstance(parse_event(encode(obj)).payload, MixReviewRequested)


# -- refusals with field-level loc ----------------------------------------------------------


def test_extra_top_level_field():
    obj = base_event()
    obj["surprise"] = 1
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("surprise",), "extra_forbidden")


@pytest.mark.parametrize("make", [base_event, review_event], ids=["exported", "review"])
def test_extra_payload_field(make):
    obj = make()
    obj["payload"]["surprise"] = "x"
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("payload", "surprise"), "extra_forbidden")


@pytest.mark.parametrize(
    ("path", "value", "type_"),
    [
        (("payload", "project_id"), 42, "string_type"),
        (("payload", "mix_url"), ["a"], "string_type"),
        (("payload", "profile"), True, "string_type"),
        (("hop",), "1", "int_type"),
        (("hop",), 1.5, "int_type"),  # 1.0 is an integer (JSON Schema), 1.5 is not
        (("hop",), True, "int_type"),
        (("hop",), -1, "greater_than_equal"),
        (("hop",), 1001, "less_than_equal"),
        (("event_id",), 7, "string_type"),
        (("source",), None, "string_type"),
        (("timestamp",), 1785166920, "datetime_type"),
        (("payload",), [], "dict_type"),
        (("payload",), "x", "dict_type"),
        (("callback_url",), 5, "string_type"),
    ],
)
def test_wrong_json_types(path, value, type_):
    obj = base_event()
    target = obj
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (path, type_)


def test_naive_timestamp():
    obj = base_event()
    obj["timestamp"] = "2026-07-27T15:42:00"
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("timestamp",), "timezone_aware")


def test_schema_version_v2():
    obj = base_event()
    obj["schema_version"] = "v2"
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("schema_version",), "literal_error")


def test_unknown_event_type():
    obj = base_event()
    obj["event_type"] = "session.deleted"
    obj["idempotency_key"] = "studio-api:session.deleted:export-a81f"
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("event_type",), "unknown_event_type")
    assert "session.exported" in e["msg"] and "mix.review_requested" in e["msg"]


@pytest.mark.parametrize(
    "key",
    [
        "studio-api:session.exported:export-a81g",
        "studio-api:session.exported",
        "export-a81f",
        "other:session.exported:export-a81f",
        "studio-api:mix.review_requested:export-a81f",
        " studio-api:session.exported:export-a81f",
    ],
)
def test_idempotency_key_mismatch_is_refused(key):
    obj = base_event()
    obj["idempotency_key"] = key
    errors_of(encode(obj))


def test_idempotency_key_mismatch_has_field_loc():
    obj = base_event()
    obj["idempotency_key"] = "studio-api:session.exported:other"
    assert locs(errors_of(encode(obj))) == [("idempotency_key",)]


def test_idempotency_key_mismatch_does_not_echo_input():
    obj = base_event()
    obj["source"] = "zqxsourcemarker"
    obj["event_id"] = "zqxidmarker"
    dumped = json.dumps(errors_of(encode(obj)))
    assert "zqxsourcemarker" not in dumped and "zqxidmarker" not in dumped


@pytest.mark.parametrize(("field", "value"), [("source", "studio:api"), ("event_type", "a:b"),
                                              ("event_id", "has space"), ("event_id", "")])
def test_identifier_patterns(field, value):
    obj = base_event()
    obj[field] = value
    assert (field,) in locs(errors_of(encode(obj)))


@pytest.mark.parametrize("make", [base_event, review_event], ids=["exported", "review"])
@pytest.mark.parametrize("name", ["Night Drive (final mix)", "Über Nacht", "夜のドライブ",
                                  "a", "x" * 256, "it's 50% done", "👨\u200d👩\u200d👧 tour",
                                  "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # ZWNJ
                                  "\U0001fa77 pink", "no\u00a0break"])
def test_project_names_are_what_people_call_their_projects(make, name):
    obj = make()
    obj["payload"]["project_id"] = name
    assert parse_event(encode(obj)).payload.project_id == name


@pytest.mark.parametrize(("name", "type_"), [
    ("", "string_too_short"), ("x" * 257, "string_too_long"), (" lead", "name_invalid"),
    ("trail ", "name_invalid"), ("two\nlines", "name_invalid"), ("tab\there", "name_invalid"),
    ("nul\x00", "name_invalid"), ("zero\u200bwidth", "name_invalid"),
    ("right\u202eleft", "name_invalid"), ("line\u2028sep", "name_invalid"),
    ("mark\u200fhere", "name_invalid"), ("\ufeffbom", "name_invalid"),
    ("soft\u00adhyphen", "name_invalid"), ("word\u2060joiner", "name_invalid"),
    ("tag\U000e0041hidden", "name_invalid"),
])
def test_project_names_refuse_what_would_fool_a_log_or_a_page(name, type_):
    obj = base_event()
    obj["payload"]["project_id"] = name
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("payload", "project_id"), type_)


@settings(max_examples=300, deadline=None)
@given(name=st.text(min_size=1, max_size=256))
def test_a_project_name_is_accepted_exactly_when_fit_and_trimmed(name):
    obj = base_event()
    obj["payload"]["project_id"] = name
    body = encode(obj)
    unfit = {c for c in name if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")
             or (unicodedata.category(c) == "Cf" and c not in "\u200c\u200d")}
    if not unfit and name == name.strip():  # kept as written, in its NFC form
        assert parse_event(body).payload.project_id == unicodedata.normalize("NFC", name)
    else:
        assert [tuple(e["loc"]) for e in errors_of(body)] == [("payload", "project_id")]


@pytest.mark.parametrize("field", REQUIRED)
def test_missing_envelope_field(field):
    obj = base_event()
    del obj[field]
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == ((field,), "missing")


@pytest.mark.parametrize("make", [base_event, review_event], ids=["exported", "review"])
@pytest.mark.parametrize("field", ["project_id", "mix_url"])
def test_missing_payload_field(make, field):
    obj = make()
    del obj["payload"][field]
    e = one_error(obj)
    assert (tuple(e["loc"]), e["type"]) == (("payload", field), "missing")


def test_several_errors_reported_together():
    obj = base_event()
    del obj["source"]
    obj["hop"] = "x"
    obj["extra"] = 1
    assert set(locs(errors_of(encode(obj)))) == {("source",), ("hop",), ("extra",)}


@pytest.mark.parametrize(
    ("body", "type_"),
    [
        (b"", "json_invalid"),
        (b"{", "json_invalid"),
        (b"{'a': 1}", "json_invalid"),
        (b"\xff\xfe\x00", "json_invalid"),
        (VECTOR_BODY + b"garbage", "json_invalid"),
        (b"[]", "model_type"),
        (b"[1, 2]", "model_type"),
        (b'"text"', "model_type"),
        (b"42", "model_type"),
        (b"null", "model_type"),
        (b"true", "model_type"),
    ],
)
def test_not_a_json_object(body, type_):
    e = one_error(body)
    assert (e["loc"], e["type"]) == ([], type_)


def test_deeply_nested_json_is_refused_cleanly():
    body = encode(base_event())[:-1] + b',"deep":' + b"[" * 5000 + b'"x"' + b"]" * 5000 + b"}"
    assert [e["type"] for e in errors_of(body)] == ["json_invalid"]


# -- properties -----------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids,
                                                               max_size=4),
    max_leaves=20,
)


def parse_outcome(body: bytes):
    try:
        return parse_event(body)
    except InvalidEvent as exc:
        assert exc.errors
        for e in exc.errors:
            assert set(e) == {"loc", "msg", "type"}
        return exc


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(body):
    parse_outcome(body)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_arbitrary_json_never_crashes(value):
    assert isinstance(parse_outcome(encode(value)), InvalidEvent)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(
        st.sampled_from([*REQUIRED, "callback_url", "hop", "correlation_id", "causation_id",
                         "extra"]),
        json_values, max_size=3),
    payload_changes=st.dictionaries(
        st.sampled_from(["project_id", "mix_url", "profile", "session_name", "note", "x"]),
        json_values, max_size=3),
)
def test_mutated_envelopes_never_crash(changes, payload_changes):
    obj = base_event()
    obj["payload"].update(payload_changes)
    obj.update(changes)
    parse_outcome(encode(obj))


@settings(max_examples=100, deadline=None)
@given(payload=st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_arbitrary_payload_never_crashes(payload):
    obj = base_event()
    obj["payload"] = payload
    parse_outcome(encode(obj))


MARKER = "zqxMARK"
marker_values = st.text(alphabet="abcdefghij0123456789", min_size=6, max_size=12).map(
    lambda s: MARKER + s
)


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from([("schema_version",), ("event_id",), ("idempotency_key",),
                           ("event_type",), ("source",), ("timestamp",), ("callback_url",),
                           ("correlation_id",), ("hop",), ("payload",), ("extra",),
                           ("payload", "project_id"), ("payload", "mix_url"),
                           ("payload", "profile"), ("payload", "session_name"),
                           ("payload", "x")]),
    marker=marker_values,
    shape=st.sampled_from(["plain", "spaced", "list", "dict", "long"]),
)
def test_errors_never_echo_input_values(field, marker, shape):
    value = {
        "plain": marker,
        "spaced": marker + " !",  # breaks identifier patterns
        "list": [marker],
        "dict": {"k": marker},
        "long": marker * 400,  # breaks max_length
    }[shape]
    obj = base_event()
    target = obj
    for part in field[:-1]:
        target = target[part]
    target[field[-1]] = value
    if field[-1] in ("source", "event_type", "event_id") and isinstance(value, str):
        # Keep the key consistent: the mismatch message is covered by its own test.
        obj["idempotency_key"] = f"{obj['source']}:{obj['event_type']}:{obj['event_id']}"
    outcome = parse_outcome(encode(obj))
    if isinstance(outcome, InvalidEvent):
        assert MARKER not in json.dumps(outcome.errors)
        assert MARKER not in str(outcome)


def test_event_is_frozen():
    event = parse_event(VECTOR_BODY)
    with pytest.raises(ValidationError):
        event.envelope.source = "other"
    assert copy.copy(event.envelope).source == "studio-api"


def test_registered_event_types_are_strict_at_every_depth() -> None:
    from pydantic import BaseModel, ConfigDict

    from agentbox.events import register_event_type

    class Loose(BaseModel):
        gain_db: float

    class WithLoose(BaseModel):
        stem: Loose

    with pytest.raises(ValueError, match=r"Loose.*must refuse unknown fields"):
        register_event_type("test.loose", WithLoose)

    class Tight(BaseModel):
        model_config = ConfigDict(extra="forbid")
        gain_db: float

    class WithTight(BaseModel):
        stems: list[Tight]

    register_event_type("test.tight", WithTight)
    body = {"schema_version": "v1", "event_id": "e1", "idempotency_key": "s:test.tight:e1",
            "event_type": "test.tight", "source": "s", "timestamp": "2026-07-27T15:42:00Z"}
    ok = parse_event(json.dumps({**body, "payload": {"stems": [{"gain_db": 3}]}}).encode())
    assert ok.payload.stems[0].gain_db == 3
    for stems in ([{"gain_db": "3"}], [{"gain_db": 3, "typo": 1}]):
        with pytest.raises(InvalidEvent):
            parse_event(json.dumps({**body, "payload": {"stems": stems}}).encode())
    with pytest.raises(ValueError, match="already registered"):
        register_event_type("test.tight", WithLoose)


# -- one project, one name; who asked for a review -------------------------------------------


@pytest.mark.parametrize("model_event", [base_event, review_event])
def test_project_id_is_nfc_normalised(model_event) -> None:
    # "Über Nacht" as a Mac's file system spells a file name (decomposed), and as typed.
    decomposed, composed = "U\u0308ber Nacht", "\u00dcber Nacht"
    obj = model_event()
    obj["payload"]["project_id"] = decomposed
    assert parse_event(encode(obj)).payload.project_id == composed
    obj["payload"]["project_id"] = composed
    assert parse_event(encode(obj)).payload.project_id == composed


@given(st.text(min_size=1, max_size=40))
@settings(max_examples=200)
def test_a_project_name_has_one_form_whatever_its_spelling(name: str) -> None:
    obj = base_event()
    for form in ("NFC", "NFD"):
        obj["payload"]["project_id"] = unicodedata.normalize(form, name)
        try:
            found = parse_event(encode(obj)).payload.project_id
        except InvalidEvent:
            continue  # a name that cannot be one (control characters, edge spaces)
        assert found == unicodedata.normalize("NFC", name)


def test_review_requested_needs_requested_by() -> None:
    obj = review_event()
    del obj["payload"]["requested_by"]
    error = one_error(obj)
    assert error["loc"] == ["payload", "requested_by"] and error["type"] == "missing"
    obj["payload"]["requested_by"] = ""
    assert one_error(obj)["loc"] == ["payload", "requested_by"]
    obj["payload"]["requested_by"] = None
    assert one_error(obj)["loc"] == ["payload", "requested_by"]


def test_a_refused_envelope_lists_the_payload_errors_too_most_useful_first():
    """One round of fixes, not two: with the envelope's errors come the payload's, a
    missing field before a wrong value before a field that does not belong."""
    obj = base_event()
    obj["schema_version"] = "v0"
    obj["extra"] = 1
    del obj["payload"]["mix_url"]
    errors = errors_of(encode(obj))
    assert locs(errors) == [("payload", "mix_url"), ("schema_version",), ("extra",)]
    assert [e["type"] for e in errors] == ["missing", "literal_error", "extra_forbidden"]
    # An unknown event type or a payload that is no object: the envelope's errors alone.
    obj["event_type"] = "no.such_type"
    assert ("payload", "mix_url") not in locs(errors_of(encode(obj)))
    obj["event_type"], obj["payload"] = "session.exported", [1]
    assert locs(errors_of(encode(obj))) == [("schema_version",), ("payload",), ("extra",)]
