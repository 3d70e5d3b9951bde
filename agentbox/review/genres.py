"""The genres a review can be told (`payload.genre`): each one's tonal curve, the
parts of its arrangement the tonal advice names, and whether its low end is
expected in mono.

A genre's curve replaces the profile's as the tonal reference (a reference track,
when there is one, still wins over both), and its notes are held to the usual
margins (agentbox.review.tonal). With no genre given, the review does not know
what the track should sound like: only extreme departures from the average curve
are noted, in words that name no instrument.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentbox.review.profiles import CLUB_CURVE, MUSIC_CURVE, SPEECH_CURVE

# Octave shares (31.5 Hz ... 16 kHz, dB), as agentbox.review.profiles has them:
# an orchestra, a small acoustic group and ambient music hold less deep bass and
# much less top than a produced pop record; hip-hop more sub-bass.
ORCHESTRAL_CURVE = (-17.0, -10.0, -6.5, -5.5, -6.5, -8.5, -12.0, -16.5, -22.0, -31.0)
ACOUSTIC_CURVE = (-18.0, -10.0, -6.0, -5.5, -6.5, -8.5, -11.0, -14.5, -19.0, -27.0)
AMBIENT_CURVE = (-11.0, -7.0, -5.5, -6.0, -7.5, -9.5, -12.5, -16.0, -19.5, -26.0)
HIP_HOP_CURVE = (-7.5, -3.5, -5.5, -8.0, -9.5, -11.5, -12.5, -14.5, -17.5, -24.0)


@dataclass(frozen=True)
class Parts:
    """What the tonal advice names in each region of the spectrum."""

    low: str  # 60-125 Hz
    low_mids: str  # 250-500 Hz
    presence: str  # 2-4 kHz
    top: str  # 8-16 kHz


# With no genre: nothing named that the track may not have.
NO_PARTS = Parts(low="the bass instruments", low_mids="the parts that crowd there",
                 presence="the lead parts", top="the brightest sources")


@dataclass(frozen=True)
class Genre:
    name: str  # as `payload.genre` says it
    title: str  # as the notes say it
    curve: tuple[float, ...]
    parts: Parts
    mono_low_end: bool  # False: a room's recording, whose low end is wide by nature


BAND = Parts(low="the bass and the kick", low_mids="guitars, keys and pads",
             presence="vocals and guitars", top="vocals and cymbals")
GENRES = {
    g.name: g for g in (
        Genre("pop", "pop", MUSIC_CURVE, BAND, True),
        Genre("rock", "rock", MUSIC_CURVE, Parts(
            "the bass guitar and the kick", "rhythm guitars and keys",
            "vocals and lead guitars", "vocals and cymbals"), True),
        Genre("electronic", "electronic music", CLUB_CURVE, Parts(
            "the kick and the bass", "pads and synths", "leads and vocals",
            "hats and cymbals"), True),
        Genre("hip_hop", "hip-hop", HIP_HOP_CURVE, Parts(
            "the 808 and the kick", "samples and keys", "the vocals", "hats and the vocals"),
            True),
        Genre("orchestral", "orchestral music", ORCHESTRAL_CURVE, Parts(
            "the double basses, cellos and timpani", "low strings, horns and the hall's build-up",
            "violins and woodwinds", "the violins and the room"), False),
        Genre("acoustic", "acoustic music", ACOUSTIC_CURVE, Parts(
            "the double bass or the bass guitar", "guitars, piano and the room",
            "voices and guitars", "strings' and cymbals' air"), False),
        Genre("jazz", "jazz", ACOUSTIC_CURVE, Parts(
            "the double bass and the kick", "piano, horns and the room",
            "horns and the voice", "cymbals"), False),
        Genre("ambient", "ambient music", AMBIENT_CURVE, Parts(
            "drones and the bass", "pads and drones", "leads and textures", "the air"),
            False),
        Genre("speech", "speech", SPEECH_CURVE, Parts(
            "the voice's rumble", "the voice's boxiness", "the voice's consonants",
            "sibilance"), True),
    )
}
