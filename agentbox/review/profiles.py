"""The targets a mix is judged against. Choose one per event (`payload.profile`)
or for the whole server (AGENTBOX_MIX_PROFILE). Every review also shows every
delivery target side by side (TARGETS), with what each platform's loudness
normalisation would do to the mix."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROFILE = "streaming"

# Tonal balance references: each octave band's share of the mix's power, in dB
# (bands: 31.5 Hz ... 16 kHz). Averages of released material in each genre
# family, smoothed; a mix within a few dB of its curve is balanced, one far above
# it in the low octaves has low-end build-up, in the 2-4 kHz octaves is harsh.
MUSIC_CURVE = (-12.0, -6.0, -5.0, -6.5, -8.0, -10.0, -12.0, -14.0, -17.0, -24.0)
CLUB_CURVE = (-9.0, -4.0, -5.0, -7.5, -9.5, -11.5, -13.0, -15.0, -17.5, -24.0)
SPEECH_CURVE = (-24.0, -14.0, -8.0, -6.0, -6.0, -7.0, -9.0, -12.0, -16.0, -24.0)


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    target_lufs: float
    tolerance_lu: float  # within target ± this is on target
    max_true_peak_dbtp: float
    reference_curve: tuple[float, ...] = MUSIC_CURVE


PROFILES = {
    p.name: p for p in (
        Profile("streaming", "streaming (Spotify, YouTube, Tidal)", -14.0, 1.0, -1.0),
        Profile("apple_music", "Apple Music", -16.0, 1.0, -1.0),
        Profile("ebu_r128", "EBU R 128 broadcast", -23.0, 1.0, -1.0),
        Profile("club", "club / DJ", -8.0, 2.0, -0.3, CLUB_CURVE),
        Profile("podcast", "podcast", -16.0, 1.0, -1.0, SPEECH_CURVE),
    )
}


@dataclass(frozen=True)
class Target:
    """A delivery target and how its playback normalises loudness.

    normalisation: "both" turns loud and quiet mixes to the target; "up_to_peak"
    turns loud ones down but quiet ones up only until the true peak reaches the
    ceiling (no limiter); "none" plays the file as it is (club systems, DJs)."""

    name: str
    title: str
    integrated_lufs: float
    true_peak_max_dbtp: float
    tolerance_lu: float
    normalisation: str


TARGETS = (
    Target("streaming", "Streaming (Spotify, YouTube, Tidal)", -14.0, -1.0, 1.0, "up_to_peak"),
    Target("apple_music", "Apple Music (Sound Check)", -16.0, -1.0, 1.0, "up_to_peak"),
    Target("broadcast", "Broadcast (EBU R 128)", -23.0, -1.0, 0.5, "both"),
    Target("club", "Club / DJ", -8.0, -0.3, 2.0, "none"),
    Target("podcast", "Podcast (Apple, Spotify)", -16.0, -1.0, 1.0, "both"),
)
