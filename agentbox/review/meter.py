"""Measuring a mix in one streaming pass: loudness (ITU-R BS.1770-4 / EBU R 128),
momentary and short-term maxima, loudness range (EBU Tech 3342), true peak and
where the overs are, sample peak and where the clipping is, DC offset, stereo
and low-end correlation, what folding to mono costs, tonal balance in octave
bands, leading and trailing silence, and whether the file holds what its header
promises.

The file is read in blocks (soundfile, float32: it holds 24-bit samples
exactly), so an hour-long mix never sits in memory whole. The K-weighting
filter is pyloudnorm's (the BS.1770 shelving and high-pass stages, for any
sample rate), run with scipy keeping its state from block to block, on the
channels only: the filter is linear, so the mono fold's weighted signal is the
mean of the weighted channels. True peak is the peak of the signal oversampled
4x with scipy's polyphase filter (81 Kaiser-windowed taps, as
`resample_poly(x, 4, 1)`), computing only the three fractional phases (the
fourth is the samples themselves) as banded matrix products, sixteen positions
a row (true_peak_matrix). The gating, the loudness range and the loudness
curves are computed from 100 ms mean squares, which is all BS.1770 and Tech
3342 need: 400 ms blocks are four of them (75 % overlap), 3 s windows thirty.

This module runs in an analysis process: it takes a path and returns plain data.
The file is opened once, as itself (never through a symbolic link swapped in,
never blocking on a FIFO: portable.open_unfollowed), and everything is read from
that one open file. Its channels, sample rate and declared length are held to
the limits below before a sample is decoded: a file made to exhaust the analysis
(a thousand channels, an hour declared in a header) is refused, naming the limit.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import soundfile
from numpy.lib.stride_tricks import sliding_window_view

from agentbox import portable
from agentbox.review.containers import declared_frames
from agentbox.review.figures import mmss, rounded, tenths

SUB_BLOCK_SECONDS = 0.1
READ_SECONDS = 2.0  # decoded at a time: memory does not grow with the file
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0  # integrated loudness
LRA_RELATIVE_GATE_LU = -20.0  # loudness range
CLIP_LEVEL = 0.9999  # |sample| at or above this is at full scale
CLIP_RUN = 3  # consecutive full-scale samples that count as clipping
OVERSAMPLING = 4
TRUE_PEAK_HALF_TAPS = 10  # input samples each side of an interpolated one (81 taps at 4x)
TRUE_PEAK_CHUNK = 512  # stretches checked against the bound (see _Meter._true_peak)
# positions interpolated by one row of the product (true_peak_matrix); a divisor of
# TRUE_PEAK_CHUNK, so that a stretch starts on a row
TRUE_PEAK_ROW = 16
SILENCE_DBFS = -60.0  # quieter than this at the start or the end is silence
DUAL_MONO_DIFFERENCE = 1e-6  # |L - R| below this everywhere: the same signal twice
LOW_END_HZ = 120.0  # below this, left and right should agree (mono compatibility)
# A DC offset is held through the whole file: the offset is the mean that even the
# most balanced stretches keep (this quantile of the read blocks' means, by size).
# Music's own asymmetry moves a block's mean both ways and leaves the file's mean
# off zero without any offset in it.
DC_QUANTILE = 10
# What a mix may be (beyond them a review would cost minutes and gigabytes): a 7.1.4
# bed has 12 channels; DXD is 352.8 kHz; a DJ set or a live recording a few hours.
MAX_CHANNELS = 16
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 384_000
MAX_DURATION_SECONDS = 4 * 3600.0
ONSET_SECONDS = 0.001  # the first millisecond: silent before an attack, loud in a cut
SPECTRUM_FRAME = 8192  # samples per spectrum frame; a few frames per read block
SPECTRUM_FRAMES_PER_BLOCK = 4
OCTAVE_BANDS_HZ = (31.5, 63.0, 125.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0)
RANGE_GAP_SECONDS = 0.5  # clipping events closer than this form one range
MAX_RANGES = 50
# No signal within full scale reads louder than a full-scale square wave on every
# channel lifted by the K-weighting's shelf (+4 dB): data that does is not the
# audio the header describes (say, integers read as floats).
K_WEIGHTING_MAX_GAIN_DB = 4.3
PINNED_DB = 0.5  # a peak this close to the file's sample peak is at its ceiling
PINNED_LOUD_DB = 20.0  # stretches quieter than the loudest by this are not the music
DITHER_STEPS = 8  # a 16-bit stretch that peaks at this many steps or fewer is quiet
RELEASE_TAGS = ("title", "artist", "album")
BIT_DEPTHS = {"PCM_S8": 8, "PCM_U8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32,
              "FLOAT": 32, "DOUBLE": 64}


class AudioError(Exception):
    """The file cannot be measured; `code` says why (a wire error code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # crosses the process boundary intact
        return (AudioError, (self.code, self.message))


@dataclass(frozen=True)
class Measurements:
    integrated_lufs: float | None  # None: silent (nothing above the gates)
    loudness_range_lu: float | None
    true_peak_dbtp: float | None  # None: digital silence
    sample_peak_dbfs: float | None
    clipped_samples: int  # samples in runs of CLIP_RUN or more at full scale
    clipped_runs: int
    dc_offset: float  # the offset held through the file (DC_QUANTILE), of full scale
    stereo_correlation: float | None  # L/R; None for mono, or with a silent side
    mono_loudness_drop_lu: float | None  # stereo minus its mono fold; None if not stereo
    duration_seconds: float
    sample_rate: int
    channels: int
    bit_depth: int | None
    sample_format: str  # e.g. PCM_24, FLOAT
    file_format: str  # WAV, FLAC, AIFF, ...
    short_term_lufs: list[float | None]  # 3 s windows ending at each whole second
    # the loudest 400 ms window ending in each second (one window a second, taken at
    # the second's end, would fall on the same place of a beat every time)
    momentary_lufs: list[float | None] = field(default_factory=list)
    momentary_max_lufs: float | None = None
    short_term_max_lufs: float | None = None
    plr_db: float | None = None  # true peak minus integrated loudness
    mono: bool = False
    dual_mono: bool = False
    low_end_correlation: float | None = None  # L/R below LOW_END_HZ
    leading_silence_seconds: float = 0.0
    trailing_silence_seconds: float = 0.0
    # Loudness of the first and the last 100 ms: a render that starts or stops while
    # the music plays (a cut-off attack or tail) is loud there.
    start_lufs: float | None = None
    end_lufs: float | None = None
    # The first millisecond's level against the first 100 ms's (RMS, dB): far under
    # it, the sound starts with an attack; close to it, the file starts mid-sound.
    start_onset_db: float | None = None
    clipped_longest_run: int = 0  # samples in the longest run at full scale
    clipping_ranges: list[dict[str, Any]] = field(default_factory=list)
    octave_bands: list[dict[str, float]] = field(default_factory=list)  # hz, db (of total)
    frames_declared: int | None = None  # what the header promises, when it says
    frames_read: int = 0
    # A limiter's signature: the share of the music's 100 ms stretches whose peak
    # reaches within PINNED_DB of the file's sample peak (a ceiling held down on).
    peaks_pinned: float | None = None
    # A 16-bit file's quiet stretches: True when they hold a few steps of noise
    # (dither) and no digital silence, None when it has no quiet stretch or is not 16-bit.
    dithered: bool | None = None
    tags: list[str] = field(default_factory=list)  # which of title, artist, album it names

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def channel_weights(channels: int) -> np.ndarray:
    """BS.1770 channel weights: 1.41 for surrounds, 0 for the LFE of a 5.1 or 7.1
    file (channel order L R C LFE Ls Rs [Lb Rb]), 1 otherwise."""
    if channels == 8:
        return np.array([1.0, 1.0, 1.0, 0.0, 1.41, 1.41, 1.41, 1.41])
    if channels == 6:
        return np.array([1.0, 1.0, 1.0, 0.0, 1.41, 1.41])
    if channels == 5:  # L R C Ls Rs
        return np.array([1.0, 1.0, 1.0, 1.41, 1.41])
    return np.ones(channels)


def k_weighting(rate: int) -> np.ndarray:
    """pyloudnorm's BS.1770 K-weighting stages as second-order sections: its RBJ
    cookbook high shelf (+4 dB, Q 1/sqrt 2, 1500 Hz) and high-pass (Q 0.5, 38 Hz),
    for any sample rate.

    The high-pass numerator is taken as BS.1770 prints it, [1, -2, 1];
    pyloudnorm scales it by about 0.995, which reads every signal 0.04 dB low
    (enough to leave EBU Tech 3341's ±0.1 LU tolerance on its case 4).
    """
    a_gain = 10 ** (4.0 / 40)
    w0 = 2 * math.pi * 1500.0 / rate
    cos, alpha = math.cos(w0), math.sin(w0) / (2 * (1 / math.sqrt(2)))
    root = 2 * math.sqrt(a_gain) * alpha
    shelf_b = [a_gain * ((a_gain + 1) + (a_gain - 1) * cos + root),
               -2 * a_gain * ((a_gain - 1) + (a_gain + 1) * cos),
               a_gain * ((a_gain + 1) + (a_gain - 1) * cos - root)]
    shelf_a = [(a_gain + 1) - (a_gain - 1) * cos + root, 2 * ((a_gain - 1) - (a_gain + 1) * cos),
               (a_gain + 1) - (a_gain - 1) * cos - root]
    w0 = 2 * math.pi * 38.0 / rate
    alpha = math.sin(w0) / (2 * 0.5)
    high_pass_a = [1 + alpha, -2 * math.cos(w0), 1 - alpha]
    return np.array([[*(b / shelf_a[0] for b in shelf_b), *(a / shelf_a[0] for a in shelf_a)],
                     [1.0, -2.0, 1.0, *(a / high_pass_a[0] for a in high_pass_a)]])


def _scipy_extension(*names: str) -> Any:
    """One of scipy's compiled modules (say "signal", "_sosfilt"), loaded on its own,
    without its package: importing a scipy package imports much of scipy."""
    spec = importlib.util.find_spec("scipy")
    assert spec is not None and spec.submodule_search_locations
    *folders, name = names
    folder = Path(next(iter(spec.submodule_search_locations)), *folders)
    found = next(folder / f"{name}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if (folder / f"{name}{suffix}").is_file())
    loader = importlib.machinery.ExtensionFileLoader(".".join(("scipy", *names)), str(found))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _load_sosfilt() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """scipy's compiled second-order-section filter (what scipy.signal.sosfilt
    runs: in place, on C-ordered (signals, samples) float64 with (signals,
    sections, 2) state), loaded on its own: importing scipy.signal imports most of
    scipy (scipy.stats among it), about 1 s of CPU for every analysis process
    started. scipy.signal's own when the module cannot be loaded so."""
    try:
        compiled: Callable[[np.ndarray, np.ndarray, np.ndarray], None] = _scipy_extension(
            "signal", "_sosfilt")._sosfilt
        return compiled
    except Exception:  # another scipy's layout: its public function, slower to import
        from scipy.signal import sosfilt

        def public(sos: np.ndarray, x: np.ndarray, zi: np.ndarray) -> None:
            out, state = sosfilt(sos, x, axis=-1, zi=zi.transpose(1, 0, 2))
            x[:], zi[:] = out, state.transpose(1, 0, 2)
        return public


def _load_rfft() -> Callable[[np.ndarray], np.ndarray]:
    """The spectra of a batch of frames (on the last axis) by scipy's pocketfft (what
    scipy.fft.rfft runs), loaded on its own: it transforms the batch several times
    faster than numpy.fft (it computes several frames at once in the processor's
    vector registers), and importing scipy.fft would import numpy's test and f2py
    packages too (0.2 s of CPU for every analysis process started). numpy's when
    the module cannot be loaded so."""
    try:
        r2c = _scipy_extension("fft", "_pocketfft", "pypocketfft").r2c
    except Exception:  # another scipy's layout
        return lambda frames: np.fft.rfft(frames, axis=-1)

    def pocketfft(frames: np.ndarray) -> np.ndarray:
        spectra: np.ndarray = r2c(frames, axes=(frames.ndim - 1,), forward=True, inorm=0,
                                  nthreads=1)
        return spectra
    return pocketfft


_sosfilt = _load_sosfilt()
_rfft = _load_rfft()


def true_peak_phases() -> np.ndarray:
    """The three fractional phases of scipy's 4x polyphase interpolator
    (`resample_poly(x, 4, 1)`: firwin(81, 1/4, kaiser 5.0) * 4) as columns of a
    (21, 3) matrix: row j weighs the input sample j - 10 places from the output."""
    half = TRUE_PEAK_HALF_TAPS * OVERSAMPLING
    n = np.arange(2 * half + 1) - half
    taps = np.sinc(n / OVERSAMPLING) * np.kaiser(2 * half + 1, 5.0)
    taps = taps / taps.sum() * OVERSAMPLING
    width = 2 * TRUE_PEAK_HALF_TAPS + 1
    phases = np.zeros((width, OVERSAMPLING - 1))
    for j in range(width):
        for p in range(1, OVERSAMPLING):
            index = 2 * half - OVERSAMPLING * j + p
            if 0 <= index <= 2 * half:
                phases[j, p - 1] = taps[index]
    return phases.astype(np.float32)


def true_peak_matrix(phases: np.ndarray, row: int = TRUE_PEAK_ROW) -> np.ndarray:
    """The phases laid out for `row` neighbouring positions at once: a banded
    (row + 20, row * 3) matrix whose columns 3k to 3k + 2 are the phases moved
    down k places. A row of `row + 20` input samples times it is the three
    interpolated samples of each of `row` positions, the same sums of the same
    products as one window at a time, in one product the matrix library runs
    several times faster than a tall (n, 21) by (21, 3) one."""
    width, count = phases.shape
    matrix = np.zeros((row + width - 1, row * count), dtype=phases.dtype)
    for k in range(row):
        matrix[k:k + width, k * count:(k + 1) * count] = phases
    return matrix


def truncated(declared: int, present: int, rate: int) -> AudioError:
    return AudioError("mix_truncated", (
        f"the header promises {mmss(declared / rate, 1)}, the file holds "
        f"{mmss(present / rate, 1)}: the render was cut short (or is still being written); "
        "export it again"))


def measure(path: str) -> Measurements:
    """Measure the audio file at `path` in one pass. Raises AudioError."""
    try:
        fd = portable.open_unfollowed(Path(path))
    except FileNotFoundError:
        raise AudioError("mix_not_found", f"no file at {path}") from None
    except portable.NotTheFile as exc:
        raise AudioError("mix_unreadable", (
            f"{exc}: agentbox reads a regular file itself, never through a link (name "
            "the file a link points to)")) from None
    except OSError as exc:
        raise AudioError("mix_unreadable", (
            f"the file cannot be read: {exc.strerror or exc}")) from None
    with os.fdopen(fd, "rb") as file:
        return _measure(file, path)


def _measure(file: BinaryIO, path: str) -> Measurements:
    try:
        info = soundfile.info(file)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        if os.fstat(file.fileno()).st_size == 0:  # what a render that failed at once leaves
            raise AudioError("mix_unreadable", "the file is empty (0 bytes): nothing was "
                             "rendered into it; export it again") from None
        # libsndfile names what it opened: the descriptor's repr here, the path to people
        reason = str(exc).replace(repr(file), repr(str(path)))
        raise AudioError("mix_unreadable", f"not a readable audio file: {reason}") from None
    within_limits(info.channels, info.samplerate, info.frames)
    file.seek(0)
    header = declared_frames(file)
    if header is not None:
        within_limits(info.channels, info.samplerate, header[0])
    if header is not None and header[1] < header[0]:
        raise truncated(header[0], header[1], info.samplerate)
    if info.frames <= 0 or info.channels <= 0:
        raise AudioError("mix_unreadable", "the file holds no audio")
    file.seek(0)
    tags = release_tags(file)
    file.seek(0)
    meter = _Meter(info.samplerate, info.channels, BIT_DEPTHS.get(info.subtype))
    try:
        # one buffer decoded into again and again (the meter keeps no block it is fed)
        buffer = np.empty((meter.sub * round(READ_SECONDS * 10), info.channels), np.float32)
        for block in soundfile.blocks(file, dtype="float32", always_2d=True, out=buffer):
            meter.feed(block)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        if 0 < meter.frames < info.frames:  # the data stops before the stream's end
            raise truncated(info.frames, meter.frames, info.samplerate) from None
        raise AudioError("mix_unreadable", f"reading the audio failed: {exc}") from None
    if meter.frames < info.frames and str(info.format) not in ("MPEG", "MP3"):
        raise truncated(info.frames, meter.frames, info.samplerate)
    measured = meter.result(info, None if header is None else header[0], tags)
    possible = -0.691 + 10 * math.log10(channel_weights(info.channels).sum()) \
        + K_WEIGHTING_MAX_GAIN_DB
    if measured.integrated_lufs is not None and measured.integrated_lufs > possible:
        raise AudioError("mix_truncated", (
            f"the file reads {tenths(measured.integrated_lufs, True)} LUFS over "
            f"{mmss(measured.duration_seconds, 1)}, louder than any audio can be: its data is "
            "not the audio its header describes (a cut-off or corrupt render); export it "
            "again"))
    return measured


def release_tags(file: BinaryIO) -> list[str]:
    """Which of a release's tags (title, artist, album) the file names: its Vorbis
    comments, its INFO chunk, its ID3 frames, as libsndfile reads them."""
    try:
        with soundfile.SoundFile(file) as opened:
            found = opened.copy_metadata()
    except (soundfile.LibsndfileError, RuntimeError, OSError):
        return []
    return [tag for tag in RELEASE_TAGS if str(found.get(tag, "")).strip()]


def within_limits(channels: int, rate: int, frames: int) -> None:
    """Refuse, before decoding, a file that no mix is (AudioError naming the limit)."""
    if channels > MAX_CHANNELS:
        raise AudioError("mix_out_of_limits", (
            f"the file has {channels} channels; agentbox reviews at most {MAX_CHANNELS}"))
    if rate > 0 and not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError("mix_out_of_limits", (
            f"the file's sample rate is {rate} Hz; agentbox reviews {MIN_SAMPLE_RATE} to "
            f"{MAX_SAMPLE_RATE} Hz"))
    if rate > 0 and frames / rate > MAX_DURATION_SECONDS:
        raise AudioError("mix_out_of_limits", (
            f"the file declares {mmss(frames / rate)} of audio; agentbox reviews at most "
            f"{mmss(MAX_DURATION_SECONDS)}"))


class _Meter:
    """Accumulates everything `measure` reports, block by block."""

    def __init__(self, rate: int, channels: int, bits: int | None = None) -> None:
        self.rate, self.channels = rate, channels
        # Integer formats top out one step below 1.0 (127/128 for 8 bits): that is
        # full scale too.
        self.clip_level = CLIP_LEVEL if bits is None or bits > 16 else min(
            CLIP_LEVEL, (2 ** (bits - 1) - 1) / 2 ** (bits - 1))
        self.sub = max(1, round(rate * SUB_BLOCK_SECONDS))
        self.stereo = channels == 2
        self.sos = k_weighting(rate)
        self.zi = np.zeros((channels, self.sos.shape[0], 2))  # the filter's state
        # weighted samples not yet in a sub-block (only at the end: reads are whole
        # sub-blocks)
        self.pending = np.zeros((0, channels))
        # per sub-block: mean square of each channel (+ L*R for the mono fold)
        self.sub_blocks: list[np.ndarray] = []
        self.frames = 0
        self.peak = 0.0
        self.true_peak = 0.0
        phases = true_peak_phases()
        self.tap_bound = float(np.abs(phases).sum(axis=0).max()) * 1.0001
        self.interpolator = true_peak_matrix(phases)
        # the last samples of each channel, whose interpolation waits for the next block
        self.context = np.zeros((channels, TRUE_PEAK_HALF_TAPS), dtype=np.float32)
        self.sums = np.zeros(channels)
        self.block_means: list[np.ndarray] = []  # per read block, per channel
        self.onset: float | None = None
        self.lr = np.zeros(3)  # sum L*R, sum L*L, sum R*R
        self.side_peak = 0.0  # max |L - R| (until it rules dual mono out)
        self.clipped_samples = 0
        self.clipped_runs = 0
        self.longest_run = 0
        self.run_starts = np.full(channels, -1, dtype=np.int64)  # open full-scale run
        # (first sample, after the last) of each stretch of clipping / overs
        self.events: dict[str, list[tuple[int, int]]] = {"clipping": [], "over": []}
        self.first_loud: int | None = None
        self.last_loud = -1
        self.silence = 10 ** (SILENCE_DBFS / 20)
        self.window = np.hanning(SPECTRUM_FRAME).astype(np.float32)
        self.spectrum = np.zeros(SPECTRUM_FRAME // 2 + 1)
        self.low_bins = np.fft.rfftfreq(SPECTRUM_FRAME, 1 / rate) < LOW_END_HZ
        self.low = np.zeros(3)  # below LOW_END_HZ: sum Re(L R*), |L|^2, |R|^2
        self.sub_peaks: list[np.ndarray] = []  # each 100 ms stretch's sample peak
        self.step = 2.0 ** -15 if bits == 16 else 0.0  # one 16-bit step (dither's size)

    def feed(self, block: np.ndarray) -> None:
        # One lane per channel, contiguous, in float64: the K-weighting filter's
        # input, and sums without a strided float32 -> float64 reduction.
        lanes = np.array(block.T, dtype=np.float64, order="C")
        sums = lanes.sum(axis=1)
        if not np.isfinite(sums).all():  # NaN or inf somewhere in a float file
            block = np.nan_to_num(block, nan=0.0, posinf=1.0, neginf=-1.0)
            lanes = np.array(block.T, dtype=np.float64, order="C")
            sums = lanes.sum(axis=1)
        offset = self.frames
        self.frames += block.shape[0]
        self.sums += sums
        self.block_means.append(sums / block.shape[0])
        if offset == 0:
            self.onset = _onset(lanes, self.rate)
        block_peak = max(float(block.max()), -float(block.min()))
        self.peak = max(self.peak, block_peak)
        whole = block.shape[0] // self.sub * self.sub
        if whole:
            shaped = block[:whole].reshape(-1, self.sub * self.channels)
            self.sub_peaks.append(np.maximum(shaped.max(axis=1), -shaped.min(axis=1)))
        if self.channels >= 2:
            left, right = block[:, 0], block[:, 1]
            self.lr += (float(left @ right), float(left @ left), float(right @ right))
            if self.side_peak <= DUAL_MONO_DIFFERENCE:  # past it, dual mono is ruled out
                side = left - right
                self.side_peak = max(self.side_peak, float(side.max()), -float(side.min()))
        if block_peak > self.silence:
            self._loud(block, offset)
        if block_peak >= self.clip_level or (self.run_starts >= 0).any():
            self._clipping(np.abs(block) >= self.clip_level, offset)
        self._true_peak(block, offset)
        self._spectrum(block)
        _sosfilt(self.sos, lanes, self.zi)  # in place, state carried to the next block
        self._mean_squares(lanes.T)

    def _loud(self, block: np.ndarray, offset: int) -> None:
        """Where sound starts and stops (above SILENCE_DBFS on any channel)."""
        loudest = np.abs(block[:, 0])
        for ch in range(1, self.channels):
            np.maximum(loudest, np.abs(block[:, ch]), out=loudest)
        loud = loudest > self.silence  # the first and the last: no list of every one
        if self.first_loud is None:
            self.first_loud = offset + int(np.argmax(loud))
        self.last_loud = offset + len(loud) - 1 - int(np.argmax(loud[::-1]))

    def _mean_squares(self, weighted: np.ndarray) -> None:
        if len(self.pending):
            weighted = np.vstack([self.pending, weighted])
        whole = weighted.shape[0] // self.sub * self.sub
        if whole:
            shaped = weighted[:whole].reshape(-1, self.sub, self.channels)
            squares = np.einsum("ksc,ksc->kc", shaped, shaped) / self.sub
            if self.stereo:
                cross = np.einsum("ks,ks->k", shaped[:, :, 0], shaped[:, :, 1]) / self.sub
                squares = np.hstack([squares, cross[:, None]])
            self.sub_blocks.append(squares)
        self.pending = weighted[whole:]

    def _clipping(self, at_full_scale: np.ndarray, offset: int) -> None:
        n = at_full_scale.shape[0]
        for ch in range(self.channels):
            column = at_full_scale[:, ch]
            open_run = int(self.run_starts[ch])
            if not column.any() and open_run < 0:
                continue
            padded = np.concatenate([[False], column, [False]])
            edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
            starts, ends = list(edges[::2] + offset), list(edges[1::2] + offset)
            if open_run >= 0:
                if starts and starts[0] == offset:
                    starts[0] = open_run  # the carried run goes on
                else:
                    self._close_run(open_run, offset)
            self.run_starts[ch] = -1
            if starts and ends[-1] == offset + n:  # still at full scale at the block's end
                self.run_starts[ch] = starts.pop()
                ends.pop()
            for start, end in zip(starts, ends, strict=True):
                self._close_run(int(start), int(end))

    def _close_run(self, start: int, end: int) -> None:
        if end - start >= CLIP_RUN:
            self.clipped_samples += end - start
            self.clipped_runs += 1
            self.longest_run = max(self.longest_run, end - start)
            self._event(start, end, "clipping")

    def _event(self, start: int, end: int, kind: str) -> None:
        """Note a stretch of `kind` (in time order); near ones make one range."""
        events = self.events[kind]
        if events and start - events[-1][1] < RANGE_GAP_SECONDS * self.rate:
            events[-1] = (events[-1][0], max(end, events[-1][1]))
        elif len(events) < MAX_RANGES:
            events.append((start, end))

    def _true_peak(self, block: np.ndarray, offset: int) -> None:
        """The interpolated samples between those with TRUE_PEAK_HALF_TAPS of context
        on each side; the last few wait for the next block (or the zeros past the
        file's end, as the resampler pads it).

        An interpolated sample cannot exceed the largest input sample in its
        window times its phase's sum of absolute taps (the bound): a stretch whose
        bound stays under what is already known (the sample peak, the true peak so
        far, and 0 dBTP, so that overs are still located) cannot change the
        reading, and is skipped. The loudest stretch is taken first (it raises what
        the others must beat); the rest are taken in runs of neighbours, one matrix
        product per run (a limited master: the whole block at once). Short stretches
        (TRUE_PEAK_CHUNK) skip more of dynamic material."""
        half = TRUE_PEAK_HALF_TAPS
        held = self.context.shape[1]
        length = held + len(block)
        stop = length - half  # positions with full context on the right
        base = offset - held + half  # file position of joined[:, half]
        count = max(0, stop - half)
        # each channel's samples in a row of their own, and zeros after them: whole
        # stretches, and a stretch past the last one, to read and take rows of
        joined = np.zeros((self.channels, (-(-count // TRUE_PEAK_CHUNK) + 1) * TRUE_PEAK_CHUNK),
                          dtype=np.float32)
        joined[:, :held] = self.context
        joined[:, held:length] = block.T
        for column in joined if count else ():
            self._true_peak_of(column, count, base)
        self.context = joined[:, max(0, stop - half):length].copy()

    def _true_peak_of(self, column: np.ndarray, count: int, base: int) -> None:
        loudest = np.abs(column).reshape(-1, TRUE_PEAK_CHUNK).max(axis=1)
        # a stretch's windows reach TRUE_PEAK_HALF_TAPS * 2 samples into the next one
        bounds = np.maximum(loudest[:-1], loudest[1:]) * self.tap_bound
        chosen = np.flatnonzero(bounds > self._floor())
        if not len(chosen):
            return  # nothing here can change the reading
        rows = sliding_window_view(column, len(self.interpolator))[::TRUE_PEAK_ROW]
        overs: list[np.ndarray] = []
        first = int(chosen[np.argmax(bounds[chosen])])  # the loudest stretch raises the floor
        self._interpolate(rows, count, (first, first + 1), base, overs)
        chosen = chosen[(bounds[chosen] > self._floor()) & (chosen != first)]
        # what is left, neighbouring stretches in one product (a limited master: the
        # whole block at once)
        breaks = np.flatnonzero(np.diff(chosen) > 1)
        starts = chosen[np.concatenate([[0], breaks + 1])] if len(chosen) else chosen
        ends = chosen[np.concatenate([breaks, [len(chosen) - 1]])] if len(chosen) else chosen
        for start, end in zip(starts, ends, strict=True):
            self._interpolate(rows, count, (int(start), int(end) + 1), base, overs)
        if overs:
            self._overs(np.sort(np.concatenate(overs)))

    def _floor(self) -> float:
        """What a stretch's bound must beat to matter: the reading so far, the sample
        peak, and never more than 0 dBTP (so that overs are still located)."""
        return min(max(self.true_peak, self.peak), 1.0)

    def _interpolate(self, rows: np.ndarray, count: int, stretches: tuple[int, int],
                     base: int, overs: list[np.ndarray]) -> None:
        """The interpolated samples of stretches [first, end) of the `count` positions
        (`rows`: the samples TRUE_PEAK_ROW positions need, for each TRUE_PEAK_ROW
        positions in turn): the true peak; overs."""
        start, stop = stretches[0] * TRUE_PEAK_CHUNK, min(stretches[1] * TRUE_PEAK_CHUNK, count)
        if stop <= start:
            return
        product = rows[start // TRUE_PEAK_ROW:-(-stop // TRUE_PEAK_ROW)] @ self.interpolator
        interpolated = product.reshape(-1, OVERSAMPLING - 1)[:stop - start]
        top = max(float(interpolated.max()), -float(interpolated.min()))
        self.true_peak = max(self.true_peak, top)
        if top > 1.0:  # overs between the samples: where
            overs.append(base + start + np.flatnonzero(np.abs(interpolated).max(axis=1) > 1.0))

    def _overs(self, positions: np.ndarray) -> None:
        gap = RANGE_GAP_SECONDS * self.rate
        breaks = np.flatnonzero(np.diff(positions) > gap)
        for first, last in zip(np.concatenate([[0], breaks + 1]),
                               np.concatenate([breaks, [len(positions) - 1]]), strict=True):
            self._event(int(positions[first]), int(positions[last]) + 1, "over")

    def _spectrum(self, block: np.ndarray) -> None:
        """A few windowed frames of each block: enough for octave bands and the
        low end's correlation at a small part of a full transform's cost. The
        frames are transformed together (frames, channels, samples)."""
        usable = block.shape[0] - SPECTRUM_FRAME
        if usable < 0:
            return
        step = max(1, usable // max(1, SPECTRUM_FRAMES_PER_BLOCK - 1))
        starts = range(0, usable + 1, step)[:SPECTRUM_FRAMES_PER_BLOCK]
        frames = np.empty((len(starts), self.channels, SPECTRUM_FRAME), dtype=np.float32)
        for frame, start in zip(frames, starts, strict=True):
            np.multiply(block[start:start + SPECTRUM_FRAME].T, self.window, out=frame)
        spectra = _rfft(frames)
        power = spectra.real ** 2 + spectra.imag ** 2
        for each in power.sum(axis=1):  # frame by frame, as the file is read
            self.spectrum += each
        if self.channels >= 2:
            left, right = spectra[:, 0, self.low_bins], spectra[:, 1, self.low_bins]
            self.low += (float(np.sum((left * right.conj()).real)),
                         float(power[:, 0, self.low_bins].sum()),
                         float(power[:, 1, self.low_bins].sum()))

    def _pinned(self) -> float | None:
        """The share of the music's stretches (within PINNED_LOUD_DB of the loudest)
        whose peak sits within PINNED_DB of the sample peak."""
        if not self.sub_peaks or self.peak <= 0:
            return None
        peaks = np.concatenate(self.sub_peaks)
        music = peaks[peaks >= self.peak * 10 ** (-PINNED_LOUD_DB / 20)]
        pinned = music >= self.peak * 10 ** (-PINNED_DB / 20)
        return round(float(pinned.mean()), 3) if len(music) else None

    def _dithered(self) -> bool | None:
        """In a 16-bit file: its quiet stretches hold a few steps of noise (True) or
        digital silence (False); None with no quiet stretch."""
        if not self.step or not self.sub_peaks:
            return None
        peaks = np.concatenate(self.sub_peaks)
        quiet = peaks[peaks <= DITHER_STEPS * self.step]
        return None if not len(quiet) else bool((quiet > 0).all())

    def result(self, info: Any, declared: int | None, tags: list[str] | None = None
               ) -> Measurements:
        self._true_peak(np.zeros((TRUE_PEAK_HALF_TAPS, self.channels), dtype=np.float32),
                        self.frames)
        for ch in range(self.channels):  # runs still open at the end of the file
            if self.run_starts[ch] >= 0:
                self._close_run(int(self.run_starts[ch]), self.frames)
        self._mean_squares(np.zeros((0, self.channels)))
        self.pending = np.zeros((0, self.channels))
        lanes = self.channels + (1 if self.stereo else 0)
        subs = np.vstack(self.sub_blocks) if self.sub_blocks else np.zeros((0, lanes))
        weights = channel_weights(self.channels)
        programme = subs[:, :self.channels] @ weights if len(subs) else np.zeros(0)
        momentary = _windows(programme, 4)
        integrated = gated_loudness(momentary, RELATIVE_GATE_LU)
        drop = None
        if self.stereo:
            # the fold (L + R) / 2, played on both channels: 2 * mean square of the fold
            mono = (subs[:, 0] + subs[:, 1] + 2 * subs[:, 2]) / 2
            folded = gated_loudness(_windows(mono, 4), RELATIVE_GATE_LU)
            if integrated is not None:
                drop = None if folded is None else rounded(integrated - folded, 2)
        correlation = None
        if self.channels >= 2:
            product, ll, rr = self.lr
            # A silent side correlates with nothing: undefined, not "uncorrelated" (0).
            correlation = rounded(product / math.sqrt(ll * rr), 4) if ll > 0 and rr > 0 else None
        short_term = _windows(programme, 30)
        seconds = range(10, len(programme) + 1, 10)
        true_peak = _db(max(self.true_peak, self.peak))
        return Measurements(
            integrated_lufs=_round(integrated),
            loudness_range_lu=_round(loudness_range(short_term)),
            true_peak_dbtp=_round(true_peak),
            sample_peak_dbfs=_round(_db(self.peak)),
            clipped_samples=self.clipped_samples,
            clipped_runs=self.clipped_runs,
            dc_offset=_dc(np.array(self.block_means) if self.block_means
                          else np.zeros((1, self.channels))),
            stereo_correlation=correlation,
            mono_loudness_drop_lu=drop,
            duration_seconds=round(self.frames / self.rate, 3),
            sample_rate=self.rate,
            channels=self.channels,
            bit_depth=BIT_DEPTHS.get(info.subtype),
            sample_format=str(info.subtype),
            file_format=str(info.format),
            short_term_lufs=[_round(_lufs(window_at(programme, end, 30))) for end in seconds],
            momentary_lufs=[_round(_lufs(loudest_momentary(momentary, programme, end)))
                            for end in seconds],
            momentary_max_lufs=_round(_lufs(float(momentary.max()))) if len(momentary) else None,
            short_term_max_lufs=_round(_lufs(float(short_term.max())))
            if len(short_term) else None,
            plr_db=None if true_peak is None or integrated is None
            else _round(true_peak - integrated),
            mono=self.channels == 1,
            dual_mono=self.channels == 2 and self.peak > 0
            and self.side_peak <= DUAL_MONO_DIFFERENCE,
            low_end_correlation=self._low_end_correlation(),
            leading_silence_seconds=round((self.frames if self.first_loud is None
                                           else self.first_loud) / self.rate, 2),
            trailing_silence_seconds=round((self.frames - 1 - self.last_loud) / self.rate, 2)
            if self.first_loud is not None else round(self.frames / self.rate, 2),
            start_lufs=_edge(programme[:1]), end_lufs=_edge(programme[-1:]),
            start_onset_db=_round(self.onset, 1), clipped_longest_run=self.longest_run,
            clipping_ranges=[{"start": round(a / self.rate, 2), "end": round(b / self.rate, 2),
                              "kind": kind} for kind, events in self.events.items()
                             for a, b in events],
            octave_bands=self._octave_bands(),
            frames_declared=declared,
            frames_read=self.frames,
            peaks_pinned=self._pinned(),
            dithered=self._dithered(),
            tags=tags or [],
        )

    def _low_end_correlation(self) -> float | None:
        product, ll, rr = self.low
        total = float(self.spectrum.sum())
        # nothing down there (or one side silent): no verdict on the low end
        if self.channels < 2 or ll <= 0 or rr <= 0 or (ll + rr) < total * 1e-6:
            return None
        return rounded(product / math.sqrt(ll * rr), 3)

    def _octave_bands(self) -> list[dict[str, float]]:
        freqs = np.fft.rfftfreq(SPECTRUM_FRAME, 1 / self.rate)
        bands = []
        for centre in OCTAVE_BANDS_HZ:
            low, high = centre / math.sqrt(2), centre * math.sqrt(2)
            if high > self.rate / 2:
                break
            bands.append((centre, float(self.spectrum[(freqs >= low) & (freqs < high)].sum())))
        total = sum(power for _, power in bands)
        if total <= 0:
            return []
        return [{"hz": centre, "db": round(10 * math.log10(power / total), 1) if power > 0
                 else -120.0} for centre, power in bands]


def _windows(powers: np.ndarray, size: int) -> np.ndarray:
    """Mean power of every run of `size` consecutive sub-blocks (step: one sub-block)."""
    if len(powers) < size:
        return np.zeros(0)
    sums = np.convolve(powers, np.ones(size), mode="valid")
    return np.asarray(sums / size)


def window_at(powers: np.ndarray, end: int, size: int) -> float:
    """Mean power of the `size` sub-blocks ending at sub-block `end` (shorter at the
    start)."""
    window = powers[max(0, end - size):end]
    return float(window.mean()) if len(window) else 0.0


def loudest_momentary(momentary: np.ndarray, powers: np.ndarray, end: int) -> float:
    """The loudest 400 ms window (of `_windows(powers, 4)`) ending in the second that
    ends at sub-block `end`; before the first whole window, the shorter one there."""
    found = momentary[max(0, end - 13):max(0, end - 3)]  # windows ending in (end-10, end]
    return float(found.max()) if len(found) else window_at(powers, end, 4)


def short_term_at(powers: np.ndarray, end: int) -> float:
    """Mean power of the 3 s window ending at sub-block `end` (shorter at the start)."""
    return window_at(powers, end, 30)


def _lufs(power: float) -> float | None:
    return -0.691 + 10 * math.log10(power) if power > 0 else None


def _gate(powers: np.ndarray, relative_gate: float) -> tuple[np.ndarray, np.ndarray] | None:
    """BS.1770 gating of block powers: above -70 LUFS, then above the mean of those
    plus `relative_gate` LU. Returns each block's loudness and the mask of those
    kept, or None when nothing passes the absolute gate."""
    with np.errstate(divide="ignore"):
        loudness = -0.691 + 10 * np.log10(powers)
    audible = loudness > ABSOLUTE_GATE_LUFS
    if not audible.any():
        return None
    threshold = _lufs(float(powers[audible].mean()))
    assert threshold is not None
    return loudness, audible & (loudness > threshold + relative_gate)


def gated_loudness(blocks: np.ndarray, relative_gate: float) -> float | None:
    """Integrated loudness (BS.1770) of 400 ms block powers."""
    gated = _gate(blocks, relative_gate)
    if gated is None or not gated[1].any():
        return None
    return _lufs(float(blocks[gated[1]].mean()))


def loudness_range(short_term: np.ndarray) -> float | None:
    """EBU Tech 3342: the spread (10th to 95th percentile) of gated 3 s loudness."""
    gated = _gate(short_term, LRA_RELATIVE_GATE_LU)
    if gated is None or not gated[1].any():
        return None
    kept = gated[0][gated[1]]
    return float(np.percentile(kept, 95) - np.percentile(kept, 10))


def _edge(powers: np.ndarray) -> float | None:
    """The loudness of one 100 ms sub-block; None when there is none, or it is below
    the absolute gate (silence)."""
    loudness = _lufs(float(powers[0])) if len(powers) else None
    return None if loudness is None or loudness < ABSOLUTE_GATE_LUFS else _round(loudness)


def _db(linear: float) -> float | None:
    return 20 * math.log10(linear) if linear > 0 else None


def _dc(means: np.ndarray) -> float:
    """The offset held through the file, of the channel with the largest: each
    channel's DC_QUANTILE of its blocks' means by size, with their usual sign."""
    held = np.percentile(np.abs(means), DC_QUANTILE, axis=0) * np.sign(np.median(means, axis=0))
    worst = int(np.argmax(np.abs(held)))
    return rounded(float(held[worst]), 6)


def _onset(lanes: np.ndarray, rate: int) -> float | None:
    """The first ONSET_SECONDS's RMS against the first 100 ms's, in dB (loudest
    channel each); None when the start is silent or the file shorter."""
    first, window = max(1, round(rate * ONSET_SECONDS)), round(rate * SUB_BLOCK_SECONDS)
    if lanes.shape[1] < window:
        return None
    start = float(np.sqrt((lanes[:, :first] ** 2).mean(axis=1)).max())
    whole = float(np.sqrt((lanes[:, :window] ** 2).mean(axis=1)).max())
    if whole <= 10 ** (ABSOLUTE_GATE_LUFS / 20):
        return None
    return 20 * math.log10(max(start, 1e-12) / whole)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or not math.isfinite(value) else rounded(value, digits)
