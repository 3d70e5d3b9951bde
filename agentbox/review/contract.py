"""The review's event contract: the payloads of `session.exported` (a DAW finished a
render) and `mix.review_requested` (somebody asks for a review), registered with
the engine's contract (agentbox.events) when this module is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import PurePath
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field
from pydantic_core import PydanticCustomError

from agentbox.engine.agents import rename_agent
from agentbox.events import (
    Name,
    NfcName,
    Strict,
    Text,
    name_of_file,
    nfc_name,
    register_event_type,
)
from agentbox.review.genres import GENRES
from agentbox.review.names import FORMER_MIX_REVIEW
from agentbox.review.names import MIX_REVIEW as MIX_REVIEW  # its agent, named here as before
from agentbox.review.profiles import PROFILES
from agentbox.review.settings import ReviewSettings

# A project's name: a Name, NFC-normalised, so that one project has one name
# whichever way its export arrived (a watched folder on macOS, a typed --project).
ProjectName = NfcName
project_name = nfc_name  # a project's name in the one form agentbox keeps it
DEFAULT_PROJECT = "mix"  # a file's project when its name leaves nothing to call it


def project_of_file(path: PurePath) -> str:
    """A project's name from a file's: its stem as written, in Unicode NFC (as
    `send --project` and the event contract keep names), characters a project
    name cannot hold (control and invisible ones) replaced by a space. What
    `agentbox send FILE` and a file dropped on the page are called."""
    return name_of_file(path, DEFAULT_PROJECT)


def _one_of(known: Collection[str], what: str) -> Callable[[str], str]:
    """A validator that refuses a name not in `known` (error type unknown_WHAT)."""
    def check(value: str) -> str:
        if value not in known:
            raise PydanticCustomError(f"unknown_{what}", f"unknown {what}; use one of {{known}}",
                                      {"known": ", ".join(known)})
        return value
    return check


# A mix review's delivery profile (agentbox.review.profiles): refused at once when
# unknown, rather than accepted and failed when the review starts.
ProfileName = Annotated[str, Field(min_length=1, max_length=128),
                        AfterValidator(_one_of(PROFILES, "profile"))]
# The genre a mix review judges the tonal balance for (agentbox.review.genres).
GenreName = Annotated[str, Field(min_length=1, max_length=64),
                      AfterValidator(_one_of(GENRES, "genre"))]
# The stage of the work (review.stage.StageName's values, written out as a Literal
# must be; tests/test_review_stage.py holds them equal).
StageField = Literal["mix", "master"]
# The stage a project is at from now on (remembered for its later exports); "auto"
# forgets it.
ProjectStageName = Literal["mix", "master", "auto"]


class SessionExported(Strict):
    """A DAW finished rendering a mix; `mix_url` is a local path or file:// URL."""

    project_id: ProjectName
    mix_url: Text
    profile: ProfileName | None = None
    stage: StageField | None = None  # judged as a mix or a master (this file only)
    project_stage: ProjectStageName | None = None  # the project's stage from now on
    default_stage: StageField | None = None  # a watch folder's (beats the project's)
    session_name: Annotated[str, Field(max_length=256)] | None = None
    reference_url: Text | None = None  # a reference track to compare with (path or file://)
    genre: GenreName | None = None  # the tonal curve and words of the review


class MixReviewRequested(Strict):
    """Somebody asks for a (new) review of a rendered mix."""

    project_id: ProjectName
    mix_url: Text
    profile: ProfileName | None = None
    stage: StageField | None = None  # judged as a mix or a master (this file only)
    project_stage: ProjectStageName | None = None  # the project's stage from now on
    default_stage: StageField | None = None  # a watch folder's (beats the project's)
    requested_by: Name  # who asks: required, as in the reference design's contract
    note: Annotated[str, Field(max_length=4096)] | None = None
    reference_url: Text | None = None  # a reference track to compare with (path or file://)
    genre: GenreName | None = None  # the tonal curve and words of the review
    # The review this one judges again, at `stage`, from the bytes it heard (kept by
    # the archive): POST /runs/{run_id}/rejudge sends it.
    rejudge_of: Name | None = None
    # The file's name as the musician knows it, when mix_url is the archive's copy.
    file_name: Name | None = None


EVENT_TYPES: dict[str, type[BaseModel]] = {
    "session.exported": SessionExported,
    "mix.review_requested": MixReviewRequested,
}


def register() -> None:
    """Make the review's event types known to the receiver (again: harmless)."""
    for event_type, model in EVENT_TYPES.items():
        register_event_type(event_type, model)


register()


# The review's settings (its section of agentbox.toml) are known wherever its contract is.
SETTINGS = ReviewSettings


# The review's agent, by import string (what a run stores), for each event type it takes.
AGENTS: dict[str, tuple[str, ...]] = {"session.exported": (MIX_REVIEW,),
                                      "mix.review_requested": (MIX_REVIEW,)}
rename_agent(FORMER_MIX_REVIEW, MIX_REVIEW)
