"""The review's corpus: test material made with numpy (and ffmpeg for the MP3), no
recordings. A "song" is noise shaped to a genre's tonal curve, in sections of
different loudness, with transients that set its crest factor, a fade-in from a
moment of silence and a natural decay at the end; each defect is made alone on
such a song, and masters are the same song through a limiter to a target.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyloudnorm
import soundfile
from scipy.fft import next_fast_len
from scipy.ndimage import minimum_filter1d, uniform_filter1d

from agentbox.review.profiles import MUSIC_CURVE
from agentbox.review.tonal import OCTAVES_HZ

RATE = 44_100
SECONDS = 10.5  # long enough for the tonal and dynamics notes (10 s), short to make
OLD = time.time() - 3600  # written an hour ago: settled
SAMPLE_MARGIN_DB = 1.0  # a limiter without true-peak mode: the peaks between samples


@dataclass(frozen=True)
class Song:
    """How to make one: its tonal curve, loudness, crest, sections and edges."""

    curve: Sequence[float] = MUSIC_CURVE
    boost: tuple[tuple[float, float], ...] = ()  # (octave, dB) on the curve
    lufs: float = -18.0
    transients_db: float = 6.0  # bursts this much over the song: the crest factor
    sections_db: float = 4.0  # quiet sections this much under the loud ones
    correlation: float = 0.6  # between the sides (above the low end, which is mono)
    seed: int = 1


def curve_gain(freqs: np.ndarray, curve: Sequence[float],
               boost: tuple[tuple[float, float], ...]) -> np.ndarray:
    """The amplitude per FFT bin that gives white noise each octave's share of
    `curve` (+ `boost`): an octave holds bins in proportion to its frequency."""
    extra = dict(boost)
    levels = [db + extra.get(hz, 0.0) for hz, db in zip(OCTAVES_HZ, curve, strict=True)]
    octave = np.log2(np.maximum(freqs, 1.0) / OCTAVES_HZ[0])
    db = np.interp(octave, np.arange(len(levels)), levels)
    power = 10 ** (db / 10) / np.maximum(freqs, 1.0)
    power[freqs < 20] = 0.0
    return np.sqrt(power)


def shaped(length: int, song: Song, rng: np.random.Generator) -> np.ndarray:
    """Stereo noise with the song's tonal curve; below 120 Hz the same on both sides."""
    n = next_fast_len(length)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    gain = curve_gain(freqs, song.curve, song.boost)
    common, left, right = (np.fft.rfft(rng.normal(size=n)) * gain for _ in range(3))
    side = math.sqrt(max(0.0, 1 - song.correlation))
    mid = math.sqrt(song.correlation)
    low = freqs < 120
    channels = []
    for own in (left, right):
        spectrum = mid * common + side * own
        spectrum[low] = common[low]
        channels.append(np.fft.irfft(spectrum, n)[:length])
    out = np.stack(channels, axis=1)
    return out / np.abs(out).max()


@functools.lru_cache(maxsize=16)
def song_audio(song: Song) -> np.ndarray:
    """The song (the same array for the same song: treat it as read-only)."""
    rng = np.random.default_rng(song.seed)
    n = round(SECONDS * RATE)
    body = shaped(n, song, rng)
    t = np.arange(n) / RATE
    # sections: loud, quiet, loud, ... every 2.5 s, with 50 ms ramps
    loud = (np.floor(t / 2.5) % 2 == 0).astype(float)
    loud = uniform_filter1d(loud, int(0.05 * RATE))
    envelope = 10 ** (-song.sections_db * (1 - loud) / 20)
    # transients: 15 ms bursts four times a second, `transients_db` over the song
    bursts = np.zeros(n)
    for start in np.arange(0.3, SECONDS - 2, 0.25):
        i = int(start * RATE)
        bursts[i:i + int(0.015 * RATE)] = 1.0
    envelope = envelope * (1 + (10 ** (song.transients_db / 20) - 1) * bursts)
    # edges: 20 ms of silence, a 0.3 s fade-in; the last 1.5 s decays to silence
    edge = np.ones(n)
    edge[:int(0.02 * RATE)] = 0.0
    ramp = slice(int(0.02 * RATE), int(0.32 * RATE))
    edge[ramp] = np.linspace(0, 1, ramp.stop - ramp.start) ** 2
    tail = int(1.5 * RATE)
    edge[-tail:] *= np.exp(-np.linspace(0, 12, tail))
    edge[-int(0.2 * RATE):] = 0.0
    return loudness(body * (envelope * edge)[:, None], song.lufs)


def loudness(audio: np.ndarray, lufs: float) -> np.ndarray:
    """`audio` turned to `lufs` integrated (gain only)."""
    measured = pyloudnorm.Meter(RATE).integrated_loudness(audio)
    return audio * 10 ** ((lufs - measured) / 20)


def limited(audio: np.ndarray, lufs: float, ceiling_dbtp: float) -> np.ndarray:
    """A master: `audio` through a look-ahead limiter at `ceiling_dbtp` (its sample
    peak a dB under it, for the peaks between samples), driven until it reads
    `lufs`."""
    ceiling = 10 ** ((ceiling_dbtp - SAMPLE_MARGIN_DB) / 20)
    meter = pyloudnorm.Meter(RATE)
    out = audio
    for window in (0.01, 0.003, 0.001):  # shorter: harder limiting, for the loudest
        drive = lufs - meter.integrated_loudness(audio)
        for _ in range(8):
            out = limit(audio * 10 ** (drive / 20), ceiling, window)
            miss = lufs - meter.integrated_loudness(out)
            if abs(miss) < 0.05:
                return out
            drive += miss * 1.5 if miss > 0 else miss
    return out


def limit(audio: np.ndarray, ceiling: float, window: float = 0.01) -> np.ndarray:
    """Gain held under what each sample allows over a window around it, smoothed
    over the same window: no sample over `ceiling`."""
    level = np.abs(audio).max(axis=1)
    gain = np.minimum(1.0, ceiling / np.maximum(level, 1e-12))
    size = int(window * RATE) | 1
    return audio * uniform_filter1d(minimum_filter1d(gain, size), size)[:, None]


def write(path: Path, audio: np.ndarray, subtype: str = "PCM_24") -> Path:
    soundfile.write(path, audio, RATE, subtype=subtype)
    os.utime(path, (OLD, OLD))
    return path


def mp3(path: Path, audio: np.ndarray) -> Path:
    """The song as an MP3 (192 kbit/s, LAME through ffmpeg)."""
    ffmpeg = shutil.which("ffmpeg")
    assert ffmpeg, "ffmpeg makes the corpus's MP3 (scripts/test installs it)"
    wav = write(path.with_suffix(".source.wav"), audio)
    subprocess.run([ffmpeg, "-loglevel", "error", "-y", "-i", str(wav), "-b:a", "192k",
                    str(path)], check=True, timeout=60)
    os.utime(path, (OLD, OLD))
    return path


Maker = Callable[[Path], Path]
