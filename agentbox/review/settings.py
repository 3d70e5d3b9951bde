"""The review's settings, its section of agentbox.toml (`[review]`), each also read
from its AGENTBOX_* variable as before sections (and at the top of the file): the
default profile and stage, the LLM for prose notes, the folders a mix must be in. The
archive's settings share the section (agentbox.archive.settings)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentbox.archive.settings import ArchiveSettings
from agentbox.config import (
    ConfigError,
    app_settings,
    describe,
    env_name,
    folder_list,
    parse_text,
    setting,
)
from agentbox.review.profiles import DEFAULT_PROFILE, PROFILES
from agentbox.review.stage import AUTO, CONFIG_STAGES

__all__ = ["ArchiveSettings", "ReviewSettings", "parse_mix_roots"]


def parse_stage(value: Any, where: str) -> str:
    """auto, mix or master (checked with the rest, by name); empty is auto."""
    return parse_text(value, where).strip().lower() or AUTO


def parse_mix_roots(value: Any, where: str = env_name("mix_roots")) -> tuple[Path, ...]:
    """The folders a mix_url must be in: a TOML list of paths, or in the environment
    paths separated by the OS's path separator (`:`, on Windows `;`); absolute (or
    `~/...`), each taken as it resolves (its links followed once, here)."""
    roots = []
    for item in folder_list(value):
        if not isinstance(item, str):
            raise ValueError("expected a path")
        path = Path(item.strip()).expanduser()
        if not path.is_absolute():
            raise ConfigError(f"{where}: {item.strip()!r} is not an absolute path")
        roots.append(Path(os.path.realpath(path)))
    return tuple(roots)


DEFAULT_ANALYSIS_PROCESSES = 1


def parse_processes(value: Any, where: str) -> int:
    """How many analyses may run at once: a whole number, 1 or more (empty: the
    default, as the variable always read it)."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a whole number, 1 or more")
    text = str(value).strip()
    if not text:
        return DEFAULT_ANALYSIS_PROCESSES
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{where} must be a whole number, 1 or more")
    return int(text)


def _optional_text(value: Any, where: str) -> str:
    return str(value)  # as before sections: whatever it is, as text (checked by name)


@app_settings("review")
@dataclass(frozen=True)
class ReviewSettings:
    # The profile a master is judged against (an event's own `profile` comes first).
    mix_profile: str | None = setting(DEFAULT_PROFILE, _optional_text)
    # The stage a review judges when neither the event, its project nor its watch folder
    # says: auto (from the file), mix or master.
    mix_stage: str = setting(AUTO, parse_stage)
    llm_base_url: str | None = setting(None, _optional_text)  # OpenAI-compatible, for notes
    llm_model: str | None = setting(None, _optional_text)
    # Folders a mix_url must be in (empty: any file the user can read): a signed
    # sender can otherwise have any such file reviewed, and then played on the page.
    mix_roots: tuple[Path, ...] = setting((), parse_mix_roots)
    # Analyses at once, each in its own low-priority process (AGENTBOX_ANALYSIS_PROCESSES).
    analysis_processes: int = setting(DEFAULT_ANALYSIS_PROCESSES, parse_processes)

    def check(self, named: Callable[[str], str]) -> None:
        if self.mix_profile is not None and self.mix_profile not in PROFILES:
            raise ConfigError(f"{named('mix_profile')}: {describe(self.mix_profile)} is not "
                              f"a profile; use one of {', '.join(PROFILES)}")
        if self.mix_stage not in CONFIG_STAGES:
            raise ConfigError(f"{named('mix_stage')}: {describe(self.mix_stage)} is not a "
                              f"stage; use one of {', '.join(CONFIG_STAGES)}")
        if self.llm_base_url is not None and urlsplit(self.llm_base_url).scheme not in (
                "http", "https"):
            raise ConfigError(f"{named('llm_base_url')} must be an http(s) URL such as "
                              "http://127.0.0.1:11434/v1")
