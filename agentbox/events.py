"""The versioned event contract: the envelope and the payload model of each event type.

Validation is strict: unknown fields, wrong JSON types, naive timestamps, an
unknown `schema_version` or `event_type`, and an `idempotency_key` other than
``source:event_type:event_id`` are refused with field-level errors.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import PurePath
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from agentbox.jsontext import encoder

SCHEMA_VERSION = "v1"
MAX_HOPS_FIELD = 1000

# Identifiers are joined with ":" into the idempotency key, so the parts that
# precede event_id may not contain it. No whitespace or control characters:
# they end up in logs and on pages.
_TOKEN = r"^[A-Za-z0-9][A-Za-z0-9._\-]*$"
_ID = r"^[A-Za-z0-9][A-Za-z0-9._:\-~/+=@]*$"

Token = Annotated[str, Field(min_length=1, max_length=128, pattern=_TOKEN)]
MAX_ID_LENGTH = 256  # identifiers and names (project_id): what a search may ask for
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=_ID)]


# The joiners: emoji sequences and Persian words need them.
_JOINERS = frozenset("\u200c\u200d")


def unfit_for_a_name(char: str) -> bool:
    """Control characters (newlines, tabs, NUL), line and paragraph separators,
    lone surrogates, and invisible format characters but the joiners (direction
    marks and overrides, zero-width space, soft hyphen, byte-order mark, tag
    characters that hide text from people but not from a language model): what
    a log line, a page or a prompt could be fooled by. Unassigned code points
    pass, so the answer does not depend on the running Python's Unicode tables."""
    category = unicodedata.category(char)
    return category in ("Cc", "Cs", "Zl", "Zp") or (category == "Cf"
                                                   and char not in _JOINERS)


def _a_name(value: str) -> str:
    if value != value.strip() or any(unfit_for_a_name(c) for c in value):
        raise PydanticCustomError(
            "name_invalid", "must be text without control or invisible characters "
            "(newlines, tabs, direction marks), not starting or ending with a space")
    return value


def nfc_name(text: str) -> str:
    """A name in the one form agentbox keeps it: Unicode NFC. A Mac's file system
    hands out "Über" decomposed (U+0055 U+0308), a typed one is usually composed
    (U+00DC): both are the same name (the review's projects are named so)."""
    return unicodedata.normalize("NFC", text)


def name_of_file(path: PurePath, fallback: str) -> str:
    """A name from a file's: its stem as written, in Unicode NFC, characters a name
    cannot hold (control and invisible ones) replaced by a space; `fallback` when
    nothing is left (the review's project of a file: agentbox.review.contract)."""
    cleaned = "".join(" " if unfit_for_a_name(c) else c for c in nfc_name(path.stem))
    return cleaned.strip()[:MAX_ID_LENGTH].strip() or fallback


# What people call things (a DAW's project "Night Drive (final)", "Über Nacht"):
# any text, spaces inside it included.
Name = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_a_name)]
# A Name, NFC-normalised, so that one thing has one name whichever way it arrived (a
# file from macOS, a typed flag). (The length is checked as written: NFC rarely
# lengthens a text, by 3 times at most.)
NfcName = Annotated[Name, AfterValidator(nfc_name)]
Text = Annotated[str, Field(min_length=1, max_length=2048)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# Event types are brought by apps (the review's: agentbox.review.contract), each
# with its payload model, through register_event_type.
PAYLOAD_MODELS: dict[str, type[BaseModel]] = {}


_REGISTERED: dict[str, type[BaseModel]] = {}  # event type -> the model as its author wrote it
_EVENT_TYPE = re.compile(_TOKEN)
_PAYLOAD_JSON = encoder()  # json.dumps, for the payload's strict check (parse_event)


def _nested_models(model: type[BaseModel], seen: set[type] | None = None) -> list[type[BaseModel]]:
    """The models used inside `model`'s fields, at any depth (in lists, unions, ...)."""
    seen = set() if seen is None else seen
    found: list[type[BaseModel]] = []
    pending = [f.annotation for f in model.model_fields.values()]
    while pending:
        hint = pending.pop()
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            if hint not in seen:
                seen.add(hint)
                found.append(hint)
                found += _nested_models(hint, seen)
        else:
            pending.extend(get_args(hint))
    return found


def is_event_type_name(name: str) -> bool:
    """Whether `name` could name an event type (letters, digits, '.', '_', '-')."""
    return bool(_EVENT_TYPE.match(name)) and len(name) <= 128


def register_event_type(event_type: str, payload_model: type[BaseModel]) -> None:
    """Add an event type whose payloads `payload_model` validates.

    The receiver holds it to the same rules as the built-in types: unknown
    fields and wrong JSON types are refused, whatever the model's own config
    says (a strict subclass is registered). Registering the same model again is
    harmless; another model for a taken type is a ValueError.
    """
    if not is_event_type_name(event_type):
        raise ValueError(f"{event_type!r} is not an event type (letters, digits, '.', '_', '-')")
    if not (isinstance(payload_model, type) and issubclass(payload_model, BaseModel)):
        raise ValueError(f"the payload model of {event_type} must be a pydantic model")
    taken = _REGISTERED.get(event_type) or PAYLOAD_MODELS.get(event_type)
    if taken is not None:
        if taken is payload_model:
            return
        raise ValueError(f"event type {event_type} is already registered with {taken.__name__}")
    for nested in _nested_models(payload_model):
        if nested.model_config.get("extra") != "forbid":
            raise ValueError(f"{nested.__name__}, inside the payload of {event_type}, must "
                             "refuse unknown fields: model_config = ConfigDict(extra='forbid')")
    config = ConfigDict(**{**payload_model.model_config, "extra": "forbid", "strict": True})
    strict = type(payload_model.__name__, (payload_model,),
                  {"model_config": config, "__module__": payload_model.__module__,
                   "__doc__": payload_model.__doc__})
    _REGISTERED[event_type] = payload_model
    PAYLOAD_MODELS[event_type] = strict


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 2.0 is one as 2 is (a sender's JSON library may write
    either); 2.5, true and "2" are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class Envelope(Strict):
    schema_version: Literal["v1"]  # SCHEMA_VERSION (a Literal needs it written out)
    event_id: Identifier
    idempotency_key: Annotated[str, Field(min_length=1, max_length=600)]
    event_type: Token
    source: Token
    timestamp: AwareDatetime
    callback_url: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    correlation_id: Identifier | None = None
    causation_id: Identifier | None = None
    hop: Annotated[int, BeforeValidator(_whole_number), Field(ge=0, le=MAX_HOPS_FIELD)] = 0
    payload: dict[str, Any]


class Event:
    """A validated event: the envelope plus its typed payload."""

    __slots__ = ("envelope", "payload")

    def __init__(self, envelope: Envelope, payload: BaseModel) -> None:
        self.envelope = envelope
        self.payload = payload

    def __getattr__(self, name: str) -> Any:
        return getattr(self.envelope, name)

    def __repr__(self) -> str:
        return f"Event({self.envelope.event_type} {self.envelope.event_id})"


class InvalidEvent(Exception):
    """Field-level errors, each {loc, msg, type}, ready for the 422 body."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def parse_event(body: bytes) -> Event:
    """Validate a raw request body into an Event, or raise InvalidEvent."""
    try:
        envelope = Envelope.model_validate_json(body)
    except ValidationError as exc:
        # The payload's errors too (one round of fixes, not two), the most useful first.
        raise InvalidEvent(_most_useful_first(_field_errors(exc) + _payload_errors(body))
                           ) from None
    if envelope.idempotency_key != (
        f"{envelope.source}:{envelope.event_type}:{envelope.event_id}"
    ):
        raise InvalidEvent([{"loc": ["idempotency_key"], "type": "idempotency_key_mismatch",
                             "msg": "must equal source:event_type:event_id"}])
    model = PAYLOAD_MODELS.get(envelope.event_type)
    if model is None:
        known = ", ".join(sorted(PAYLOAD_MODELS))
        raise InvalidEvent(
            [{"loc": ["event_type"], "msg": f"unknown event type; known: {known}",
              "type": "unknown_event_type"}]
        )
    try:
        # Round-trip through JSON so that strict mode judges JSON types, not Python ones.
        payload = model.model_validate_json(_PAYLOAD_JSON(envelope.payload), strict=True)
    except ValidationError as exc:
        raise InvalidEvent(_field_errors(exc, prefix=("payload",))) from None
    return Event(envelope, payload)


def _payload_errors(body: bytes) -> list[dict[str, Any]]:
    """The payload's field errors in a body whose envelope is refused, when its
    event type is known and its payload an object (else none: the envelope's say it)."""
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        return []
    if not isinstance(found, dict) or not isinstance(found.get("payload"), dict):
        return []
    event_type = found.get("event_type")
    model = PAYLOAD_MODELS.get(event_type) if isinstance(event_type, str) else None
    if model is None:
        return []
    try:
        model.model_validate_json(json.dumps(found["payload"]), strict=True)
    except ValidationError as exc:
        return _field_errors(exc, prefix=("payload",))
    except (ValueError, RecursionError):
        return []
    return []


# What a person fixes first: a field that is missing, then a value that is wrong, then
# a field that does not belong (often the misspelling of a missing one, listed above it).
_ERROR_RANK = {"missing": 0, "extra_forbidden": 2}


def _most_useful_first(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(errors, key=lambda e: _ERROR_RANK.get(e["type"], 1))


def _field_errors(exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    # `input` and `ctx` can echo the sender's data back; keep location, message and kind.
    return [
        {"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
