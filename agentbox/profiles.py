"""The targets a mix is judged against. Choose one per event (`payload.profile`)
or for the whole server (AGENTBOX_MIX_PROFILE)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROFILE = "streaming"


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    target_lufs: float
    tolerance_lu: float  # within target ± this is on target
    max_true_peak_dbtp: float


PROFILES = {
    p.name: p for p in (
        Profile("streaming", "streaming (Spotify, YouTube, Tidal)", -14.0, 1.0, -1.0),
        Profile("apple_music", "Apple Music", -16.0, 1.0, -1.0),
        Profile("ebu_r128", "EBU R 128 broadcast", -23.0, 1.0, -1.0),
        Profile("club", "club / DJ", -8.0, 2.0, -0.3),
    )
}
