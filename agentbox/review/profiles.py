"""What a master is judged against: the delivery targets (every review shows each
of them, with what its platform does to the file) and the profiles (the one target
a master is judged by: the event's `payload.profile`, else AGENTBOX_MIX_PROFILE,
else streaming).

What each platform does with a file's loudness, as it documents or is measured
to do:
- Spotify plays at -14 LUFS: it turns louder tracks down, and quieter ones up only
  until their true peak reaches -1 dBTP ("we leave 1 dB headroom"; its Loud
  setting, -11 LUFS, adds a limiter). It asks for masters at -14 LUFS under
  -1 dBTP.
- Apple Music's Sound Check plays at -16 LUFS, down and, as far as the peaks
  allow, up, with no limiter; Apple asks for -1 dBTP at most (the AAC encode
  raises peaks).
- YouTube and Tidal play at -14 LUFS and only turn tracks down: a quieter one
  plays quieter.
- Amazon Music plays at -14 LUFS, turning louder tracks down, and asks for true
  peaks under -2 dBTP.
- A podcast is delivered at its loudness: Apple Podcasts asks for -16 LUFS ±1
  under -1 dBTP, and most podcast players play the file as it is.
- Broadcast is delivered to its specification: EBU R 128, -23 LUFS ±0.5 under
  -1 dBTP; ATSC A/85 (US), -24 LKFS ±2 under -2 dBTP.
- Club systems and DJ software play the file as it is; -8 LUFS is a convention of
  club masters, not a specification.
"""

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
CURVE_NAMES: dict[tuple[float, ...], str] = {MUSIC_CURVE: "music", CLUB_CURVE: "club music",
                                             SPEECH_CURVE: "speech"}

# How a target's playback treats a file's loudness.
UP_TO_PEAK = "up_to_peak"  # down to the target; up only until the true peak reaches the ceiling
DOWN_ONLY = "down_only"  # down to the target; a quieter file plays quieter
DELIVER = "deliver"  # nobody turns it: the file must meet the specification itself
AS_IS = "as_is"  # plays as it is; the loudness is a convention of the format


@dataclass(frozen=True)
class Target:
    """A delivery target and what its playback does to a file's loudness."""

    name: str
    title: str
    integrated_lufs: float
    true_peak_max_dbtp: float
    tolerance_lu: float
    normalisation: str  # UP_TO_PEAK, DOWN_ONLY, DELIVER or AS_IS
    platform: str  # what the notes call it: "Spotify", "the broadcaster"


TARGETS = (
    Target("spotify", "Spotify", -14.0, -1.0, 1.0, UP_TO_PEAK, "Spotify"),
    Target("apple_music", "Apple Music (Sound Check)", -16.0, -1.0, 1.0, UP_TO_PEAK,
           "Apple Music"),
    Target("youtube", "YouTube, Tidal", -14.0, -1.0, 1.0, DOWN_ONLY, "YouTube"),
    Target("amazon_music", "Amazon Music", -14.0, -2.0, 1.0, DOWN_ONLY, "Amazon Music"),
    Target("podcast", "Podcast (Apple Podcasts)", -16.0, -1.0, 1.0, DELIVER,
           "a podcast player"),
    Target("broadcast", "Broadcast (EBU R 128)", -23.0, -1.0, 0.5, DELIVER,
           "the broadcaster"),
    Target("broadcast_us", "US broadcast (ATSC A/85)", -24.0, -2.0, 2.0, DELIVER,
           "the broadcaster"),
    Target("club", "Club / DJ", -8.0, -0.3, 2.0, AS_IS, "a club system"),
)
TARGETS_BY_NAME = {t.name: t for t in TARGETS}


@dataclass(frozen=True)
class Profile:
    """The target a master is judged by, under a name an event can give."""

    name: str
    title: str
    target_lufs: float
    tolerance_lu: float  # within target ± this is on target
    max_true_peak_dbtp: float
    reference_curve: tuple[float, ...] = MUSIC_CURVE
    target: str = "spotify"  # the delivery target whose playback it follows

    @property
    def delivery(self) -> Target:
        """The delivery target this profile follows, with the profile's own figures."""
        row = TARGETS_BY_NAME[self.target]
        return Target(row.name, row.title, self.target_lufs, self.max_true_peak_dbtp,
                      self.tolerance_lu, row.normalisation, row.platform)


def _profile(name: str, title: str, target: str, curve: tuple[float, ...] = MUSIC_CURVE
             ) -> Profile:
    row = TARGETS_BY_NAME[target]
    return Profile(name, title, row.integrated_lufs, row.tolerance_lu,
                   row.true_peak_max_dbtp, curve, target)


PROFILES = {
    p.name: p for p in (
        _profile("streaming", "streaming (Spotify, YouTube, Tidal)", "spotify"),
        _profile("spotify", "Spotify", "spotify"),
        _profile("apple_music", "Apple Music", "apple_music"),
        _profile("youtube", "YouTube and Tidal", "youtube"),
        _profile("amazon_music", "Amazon Music", "amazon_music"),
        _profile("ebu_r128", "EBU R 128 broadcast", "broadcast"),
        _profile("atsc_a85", "ATSC A/85 (US broadcast)", "broadcast_us"),
        _profile("club", "club / DJ", "club", CLUB_CURVE),
        _profile("podcast", "podcast", "podcast", SPEECH_CURVE),
    )
}
