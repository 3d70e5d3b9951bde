"""The review's real-music corpus: recordings nobody on the project made, taken
from the distribution's packages, and derivatives of them with a known defect.

- Released music: game and free-culture soundtracks shipped as Ogg Vorbis
  (frozen-bubble-data, singularity-music), decoded to WAV. A track longer than
  EXCERPT_SECONDS is kept as its first EXCERPT_SECONDS, faded out over
  FADE_SECONDS as a preview is (the review then hears a start and an end the
  musicians made, not one this module cut).
- Renders: real General MIDI files (openttd-openmsx) rendered whole, release tail
  included, by fluidsynth with a General MIDI soundfont (timgm6mb-soundfont).
- Derivatives, each with one defect made here on an untouched file: clipped by
  gain, cut mid-phrase, a channel's polarity flipped, 16-bit, MP3.

Everything is decoded or rendered once into a cache folder named after the
packages' versions (a new version of a package makes a new corpus), so a second
test session reads WAV files only.

Without a package the corpus is not there: `missing()` says which, and the
tests skip, or fail under AGENTBOX_TEST_REQUIRE_MUSIC=1 (CI, which installs
them with scripts/test).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile

REQUIRE_ENV = "AGENTBOX_TEST_REQUIRE_MUSIC"
EXCERPT_SECONDS = 60.0
FADE_SECONDS = 3.0
SOUNDFONT = Path("/usr/share/sounds/sf2/TimGM6mb.sf2")
FROZEN_BUBBLE = Path("/usr/share/games/frozen-bubble/snd")
SINGULARITY = Path("/usr/share/games/singularity/music")
OPENMSX = Path("/usr/share/games/openttd/baseset/openmsx")
# Debian package -> a file of it the corpus reads (or the program it runs).
PACKAGES = {"frozen-bubble-data": FROZEN_BUBBLE / "introzik.ogg",
            "singularity-music": SINGULARITY / "Awakening.ogg",
            "openttd-openmsx": OPENMSX / "coconut_run2.mid",
            "timgm6mb-soundfont": SOUNDFONT, "fluidsynth": Path("fluidsynth"),
            "ffmpeg": Path("ffmpeg")}
LICENCES = {"frozen-bubble-data": "GPL-2", "singularity-music": "CC BY-SA 3.0",
            "openttd-openmsx": "GPL-2 (MIDI), timgm6mb-soundfont GPL-2"}
CACHE_ENV = "AGENTBOX_TEST_MUSIC_CACHE"


@dataclass(frozen=True)
class Source:
    """One untouched file of the corpus: where it comes from and how it is made."""

    name: str  # the corpus file's name
    package: str
    path: Path  # the packaged file (Ogg or MIDI)
    kind: str  # "released" or "render"

    def make(self, out: Path) -> Path:
        if self.kind == "render":
            return render(self.path, out)
        return decode(self.path, out)


def _released(package: str, folder: Path, names: list[tuple[str, str]]) -> list[Source]:
    return [Source(name, package, folder / f, "released") for name, f in names]


def _renders(names: list[str]) -> list[Source]:
    return [Source(f"{n.replace('_', '-')}.wav", "openttd-openmsx", OPENMSX / f"{n}.mid",
                   "render") for n in names]


SOURCES = [
    *_released("frozen-bubble-data", FROZEN_BUBBLE, [
        ("fb-intro.wav", "introzik.ogg"), ("fb-main-1p.wav", "frozen-mainzik-1p.ogg"),
        ("fb-main-2p.wav", "frozen-mainzik-2p.ogg")]),
    *_released("singularity-music", SINGULARITY, [
        ("sing-chimes.wav", "lose/Chimes They Fade.ogg"),
        ("sing-march.wav", "lose/March Thee to Dis.ogg"),
        ("sing-apex.wav", "win/Apex Aleph.ogg"),
        ("sing-awakening.wav", "Awakening.ogg"), ("sing-coherence.wav", "Coherence.ogg"),
        ("sing-through-space.wav", "Through Space.ogg"), ("sing-nebula.wav", "Nebula.ogg")]),
    *_renders(["5432gone_redfarn", "coconut_run2", "train_filled_with_cash", "ultimate_run",
               "chuggachugga", "ttsong_iii_imuh3", "city_blues_redfarn"]),
]
SOURCES_BY_NAME = {s.name: s for s in SOURCES}


def missing() -> list[str]:
    """The Debian packages the corpus needs that are not installed."""
    return [package for package, path in PACKAGES.items()
            if not (path.exists() if path.is_absolute() else shutil.which(str(path)))]


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def need_corpus() -> None:
    """Skip the test for want of a package, or fail it under
    AGENTBOX_TEST_REQUIRE_MUSIC=1 (CI: a corpus that is not there proves nothing)."""
    _need("real-music", missing())


def _need(corpus: str, absent: list[str]) -> None:
    if not absent:
        return
    message = (f"the {corpus} corpus needs the Debian packages {', '.join(absent)} "
               "(scripts/test installs them)")
    if required():
        pytest.fail(message)
    pytest.skip(message)


def cache_folder() -> Path:
    """Where the decoded corpus is kept: named after the packages' versions."""
    return _kept_in("real-music", PACKAGES, EXCERPT_SECONDS)


def _kept_in(name: str, packages: Iterable[str], seconds: float) -> Path:
    """A decoded corpus's folder, named after its packages' versions and excerpts."""
    versions = []
    for package in sorted(packages):
        found = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                               capture_output=True, text=True, check=False)
        versions.append(f"{package}={found.stdout.strip()}")
    key = hashlib.sha256(("\n".join(versions) + f"\n{seconds}").encode()).hexdigest()
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "agentbox-tests")
    return root / name / key[:16]


def ffmpeg() -> str:
    found = shutil.which("ffmpeg")
    assert found, "ffmpeg decodes the corpus (scripts/test installs it)"
    return found


def decode(path: Path, out: Path) -> Path:
    """A released track as a 24-bit WAV at its own rate: whole, or its first
    EXCERPT_SECONDS faded out over FADE_SECONDS."""
    raw = out.with_name(f"{out.stem}.decoded{out.suffix}")
    subprocess.run([ffmpeg(), "-loglevel", "error", "-y", "-i", str(path), "-t",
                    str(EXCERPT_SECONDS + FADE_SECONDS + 1), "-c:a", "pcm_f32le", str(raw)],
                   check=True, timeout=120)
    audio, rate = soundfile.read(raw, dtype="float64", always_2d=True)
    raw.unlink()
    full = soundfile.info(path).duration
    if full > EXCERPT_SECONDS + FADE_SECONDS + 1:
        end = int((EXCERPT_SECONDS + FADE_SECONDS) * rate)
        fade = int(FADE_SECONDS * rate)
        audio = audio[:end]
        audio[-fade:] *= np.linspace(1.0, 0.0, fade)[:, None] ** 2
    return write(out, audio, rate)


def render(midi: Path, out: Path) -> Path:
    """A MIDI file rendered by fluidsynth with a General MIDI soundfont, to the end
    of its release tail (fluidsynth plays on until the voices have died away)."""
    synth = shutil.which("fluidsynth")
    assert synth, "fluidsynth renders the corpus's MIDI files (scripts/test installs it)"
    subprocess.run([synth, "-ni", "-q", "-F", str(out), "-r", "44100", "-O", "s24",
                    str(SOUNDFONT), str(midi)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def write(path: Path, audio: np.ndarray, rate: int, subtype: str = "PCM_24") -> Path:
    soundfile.write(path, audio, rate, subtype=subtype)
    return path


def source(name: str, folder: Path) -> Path:
    """The untouched corpus file `name`, made into `folder` once."""
    out = folder / name
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = partial_of(out)
        SOURCES_BY_NAME[name].make(partial)
        partial.replace(out)  # whole or not at all: a killed session leaves no half file
        settled(out)
    return out


def made(name: str, folder: Path) -> Path:
    """An untouched file of the corpus, or one already made in `folder`."""
    return source(name, folder) if name in SOURCES_BY_NAME else folder / name


# -- derivatives: one known defect each ------------------------------------------------------------

Change = Callable[[np.ndarray, int], np.ndarray]


def clipped_by(gain_db: float) -> Change:
    """Pushed `gain_db` into full scale and written as fixed point: flat tops."""
    return lambda audio, rate: np.clip(audio * 10 ** (gain_db / 20), -1.0, 1.0)


def cut_mid_phrase(start: float, end: float) -> Change:
    """Only `start` to `end` seconds of the music: the render begins and stops while
    it plays."""
    return lambda audio, rate: audio[int(start * rate):int(end * rate)]


def polarity_flipped(audio: np.ndarray, rate: int) -> np.ndarray:
    flipped = audio.copy()
    flipped[:, 1] *= -1
    return flipped


def unchanged(audio: np.ndarray, rate: int) -> np.ndarray:
    return audio


def derived(name: str, of: str, change: Change, folder: Path, subtype: str = "PCM_24"
            ) -> Path:
    """The corpus file `of`, changed, written as `name` (once)."""
    out = folder / name
    if not out.exists():
        audio, rate = soundfile.read(made(of, folder), dtype="float64", always_2d=True)
        partial = partial_of(out)
        write(partial, change(audio, rate), rate, subtype)
        partial.replace(out)
        settled(out)
    return out


def as_mp3(name: str, of: str, folder: Path) -> Path:
    """The corpus file `of` as a 192 kbit/s MP3 (LAME, through ffmpeg)."""
    out = folder / name
    if not out.exists():
        partial = partial_of(out)
        subprocess.run([ffmpeg(), "-loglevel", "error", "-y", "-i", str(made(of, folder)),
                        "-b:a", "192k", str(partial)], check=True, timeout=120)
        partial.replace(out)
        settled(out)
    return out


def partial_of(out: Path) -> Path:
    """Where `out` is written before it is renamed into place: a name of this process's
    own (two test processes may make the same file at once), with `out`'s suffix (the
    tools choose the format by it)."""
    return out.with_name(f"{out.stem}.{os.getpid()}.partial{out.suffix}")


def settled(path: Path) -> None:
    """Dated an hour back: the review does not wait for a file still being written."""
    old = time.time() - 3600
    os.utime(path, (old, old))


# -- independent measurement ----------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """ffmpeg's ebur128 (libebur128's algorithm) on a file: the yardstick."""

    integrated_lufs: float
    loudness_range_lu: float
    true_peak_dbtp: float


def ffmpeg_reading(path: Path) -> Reading:
    done = subprocess.run([ffmpeg(), "-hide_banner", "-nostats", "-i", str(path), "-filter:a",
                           "ebur128=peak=true", "-f", "null", "-"], capture_output=True,
                          text=True, check=True, timeout=300)
    summary = done.stderr[done.stderr.rindex("Summary:"):]

    def after(label: str) -> float:
        line = next(x for x in summary.splitlines() if x.strip().startswith(label))
        return float(line.split(":")[1].split()[0])

    return Reading(after("I:"), after("LRA:"), after("Peak:"))


def gained(gain_db: float) -> Change:
    """Gain only (a quiet render brought up as a dynamic master would be)."""
    return lambda audio, rate: audio * 10 ** (gain_db / 20)


def decoded_from_mp3(name: str, of: str, folder: Path, gain_db: float = 0.0) -> Path:
    """The corpus file `of` (raised `gain_db`) through a 192 kbit/s MP3 and back to a
    16-bit WAV, as a master is when taken from its lossy copy: the encode's overs
    become short flat runs at full scale."""
    out = folder / name
    if not out.exists():
        derived(f"{name}.source.wav", of, gained(gain_db), folder, "FLOAT")
        lossy = as_mp3(f"{name}.mp3", f"{name}.source.wav", folder)
        partial = partial_of(out)
        subprocess.run([ffmpeg(), "-loglevel", "error", "-y", "-i", str(lossy), "-c:a",
                        "pcm_s16le", str(partial)], check=True, timeout=120)
        partial.replace(out)
        settled(out)
    return out


# -- released tracks, as shipped and as copies: the stage they are heard at -----------------------

# Each track's excerpt: its first RELEASE_SECONDS (its start is the musicians'), enough
# for a stage and cheap to measure. The copies fade out over its last FADE_SECONDS, as
# a preview does; the shipped excerpt's packets are the release's own and stop where
# the excerpt does (a cut tail that is ours, not the release's).
RELEASE_SECONDS = 30.0
DRASCULA = Path("/usr/share/scummvm/drascula/audio")
ASC = Path("/usr/share/games/asc/music")
HEX_A_HOP = Path("/usr/share/games/hex-a-hop/hex-a-hop")
PINGUS = Path("/usr/share/games/pingus/data/music")
TECNOBALLZ = Path("/usr/share/games/tecnoballz/musics")
# Debian package -> a file of it the release corpus reads, as PACKAGES.
RELEASE_PACKAGES = {"frozen-bubble-data": FROZEN_BUBBLE / "introzik.ogg",
                    "singularity-music": SINGULARITY / "Awakening.ogg",
                    "drascula-music": DRASCULA / "track1.ogg",
                    "asc-music": ASC / "frontiers.mp3",
                    "hex-a-hop-data": HEX_A_HOP / "music-game.ogg",
                    "pingus-data": PINGUS / "pingus-1.it",
                    "tecnoballz-data": TECNOBALLZ / "tecnoballz.mod",
                    "fb-music-high": FROZEN_BUBBLE / "frozen-mainzik-2p.xm",
                    "ffmpeg": Path("ffmpeg")}
RELEASE_LICENCES = {"frozen-bubble-data": "GPL-2", "singularity-music": "CC BY-SA 3.0",
                    "drascula-music": "Drascula licence", "asc-music": "GPL-2+",
                    "hex-a-hop-data": "GPL-2+, CC BY-SA 3.0", "pingus-data": "GPL-2+",
                    "tecnoballz-data": "GPL-3+", "fb-music-high": "GPL-2+"}
FORMS = ("shipped", "16-bit", "24-bit")


@dataclass(frozen=True)
class Release:
    """A released track of a package: shipped lossy (Ogg, MP3), or a tracker module
    whose shipped form no review reads (it is played, then: its 16-bit and 24-bit
    renders are its copies)."""

    name: str  # the corpus's name for it
    package: str
    path: Path
    genre: str  # the kind of music, as the package describes its soundtrack

    @property
    def module(self) -> bool:
        return self.path.suffix in (".it", ".mod", ".xm", ".s3m")

    @property
    def forms(self) -> tuple[str, ...]:
        return FORMS[1:] if self.module else FORMS


def missing_releases() -> list[str]:
    return [package for package, path in RELEASE_PACKAGES.items()
            if not (path.exists() if path.is_absolute() else shutil.which(str(path)))]


def need_releases() -> None:
    """Skip for want of a package, or fail under AGENTBOX_TEST_REQUIRE_MUSIC=1."""
    _need("released-music", missing_releases())


def release_folder() -> Path:
    """Where the release corpus is kept: named after its packages' versions."""
    return _kept_in("releases", RELEASE_PACKAGES, RELEASE_SECONDS)


def released(release: Release, form: str, folder: Path) -> Path:
    """The track in `form`: "shipped" (its own codec and tags: the excerpt's packets
    copied as they are), "16-bit" (decoded, dithered to 16-bit PCM, TPDF), "24-bit"
    (decoded, 24-bit PCM); the copies carry no tags, as a file a DAW writes."""
    suffix = release.path.suffix if form == "shipped" else ".wav"
    out = folder / f"{release.name}-{form}{suffix}"
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    partial = partial_of(out)
    head = [ffmpeg(), "-loglevel", "error", "-y", "-t", f"{RELEASE_SECONDS:g}", "-i",
            str(release.path)]
    fade = f"afade=t=out:st={RELEASE_SECONDS - FADE_SECONDS:g}:d={FADE_SECONDS:g}"
    if form == "shipped":
        tail = ["-c", "copy", "-map_metadata", "0"]
    elif form == "16-bit":
        tail = ["-map_metadata", "-1", "-af",
                f"{fade},aresample=osf=s16:dither_method=triangular", "-c:a", "pcm_s16le"]
    else:
        tail = ["-map_metadata", "-1", "-af", fade, "-c:a", "pcm_s24le"]
    subprocess.run([*head, *tail, str(partial)], check=True, timeout=120)
    partial.replace(out)
    settled(out)
    return out


def _tracks(package: str, folder: Path, genre: str, files: list[str], prefix: str
            ) -> list[Release]:
    return [Release(f"{prefix}-{Path(f).stem.lower().replace(' ', '-')}", package, folder / f,
                    genre) for f in files]


RELEASES = [
    *_tracks("frozen-bubble-data", FROZEN_BUBBLE, "electronic",
             ["introzik.ogg", "frozen-mainzik-1p.ogg", "frozen-mainzik-2p.ogg"], "fb"),
    *_tracks("singularity-music", SINGULARITY, "ambient",
             ["Awakening.ogg", "Coherence.ogg", "Nebula.ogg", "Through Space.ogg",
              "Enemy Unknown.ogg", "Inevitable.ogg", "Deprecation.ogg",
              "lose/Chimes They Fade.ogg", "lose/March Thee to Dis.ogg",
              "win/Apex Aleph.ogg"], "sing"),
    *_tracks("drascula-music", DRASCULA, "orchestral",
             [f"track{n}.ogg" for n in (1, 2, 3, 4, 5, 6, 9, 12, 16, 20)], "dras"),
    *_tracks("asc-music", ASC, "rock",
             ["frontiers.mp3", "machine_wars.mp3", "time_to_strike.mp3"], "asc"),
    *_tracks("hex-a-hop-data", HEX_A_HOP, "acoustic",
             ["music-game.ogg", "music-game-1.ogg", "music-ending.ogg"], "hex"),
    *_tracks("pingus-data", PINGUS, "chiptune",
             ["pingus-1.it", "pingus-4.it", "goin_march.it", "pingus-5.it",
              "sorcerer.it", "gd-giirm.s3m"], "pingus"),
    *_tracks("tecnoballz-data", TECNOBALLZ, "chiptune",
             ["tecnoballz.mod", "area1-game.mod", "mon-lapin_reg-zbb.mod",
              "fridge-in-space_from_reg-zbb.mod", "over-theme.mod"], "tecno"),
    *_tracks("fb-music-high", FROZEN_BUBBLE, "chiptune", ["frozen-mainzik-2p.xm"], "fbhi"),
]
