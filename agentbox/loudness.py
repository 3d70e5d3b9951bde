"""Measuring a mix in one streaming pass: loudness (ITU-R BS.1770-4 / EBU R 128),
loudness range (EBU Tech 3342), true peak, sample peak, clipping, DC offset,
stereo correlation and what folding to mono costs.

The file is read in blocks (soundfile), so an hour-long mix never sits in
memory whole. The K-weighting filter is pyloudnorm's (the BS.1770 shelving and
high-pass stages, for any sample rate), run with scipy keeping its state from
block to block; true peak is the peak of the signal oversampled 4x (scipy's
polyphase resampler). The gating, the loudness range and the short-term
series are computed from 100 ms mean squares, which is all BS.1770 and Tech
3342 need: 400 ms blocks are four of them (75 % overlap), 3 s windows thirty.

This module runs in a worker process: it takes a path and returns plain data.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyloudnorm
import soundfile
from scipy import signal

SUB_BLOCK_SECONDS = 0.1
READ_SECONDS = 2.0  # decoded at a time: memory does not grow with the file
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0  # integrated loudness
LRA_RELATIVE_GATE_LU = -20.0  # loudness range
CLIP_LEVEL = 0.9999  # |sample| at or above this is at full scale
CLIP_RUN = 3  # consecutive full-scale samples that count as clipping
OVERSAMPLING = 4
TRUE_PEAK_OVERLAP = 64  # samples carried between blocks so the resampler sees no seam
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
    dc_offset: float  # the largest per-channel mean, as a fraction of full scale
    stereo_correlation: float | None  # L/R; None for mono, or with a silent side
    mono_loudness_drop_lu: float | None  # stereo minus its mono fold; None if not stereo
    duration_seconds: float
    sample_rate: int
    channels: int
    bit_depth: int | None
    sample_format: str  # e.g. PCM_24, FLOAT
    file_format: str  # WAV, FLAC, AIFF, ...
    short_term_lufs: list[float | None]  # 3 s windows ending at each whole second

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
    """pyloudnorm's BS.1770 K-weighting stages as second-order sections.

    The high-pass numerator is taken as BS.1770 prints it, [1, -2, 1];
    pyloudnorm scales it by about 0.995, which reads every signal 0.04 dB low
    (enough to leave EBU Tech 3341's ±0.1 LU tolerance on its case 4).
    """
    stages = pyloudnorm.Meter(rate)._filters  # the shelf, then the high-pass
    sections = []
    for name, stage in stages.items():
        b, a = np.asarray(stage.b, dtype=float), np.asarray(stage.a, dtype=float)
        if name == "high_pass":
            b = b / b[0]
        sections.append(np.concatenate([b / a[0], a / a[0]]))
    return np.vstack(sections)


def measure(path: str) -> Measurements:
    """Measure the audio file at `path` in one pass. Raises AudioError."""
    try:
        info = soundfile.info(path)
    except FileNotFoundError:
        raise AudioError("mix_not_found", f"no file at {path}") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        if not os.path.exists(path):
            raise AudioError("mix_not_found", f"no file at {path}") from None
        raise AudioError("mix_unreadable", f"not a readable audio file: {exc}") from None
    if info.frames <= 0 or info.channels <= 0:
        raise AudioError("mix_unreadable", "the file holds no audio")
    meter = _Meter(info.samplerate, info.channels, BIT_DEPTHS.get(info.subtype))
    try:
        for block in soundfile.blocks(path, blocksize=max(1, int(info.samplerate * READ_SECONDS)),
                                      dtype="float64", always_2d=True):
            meter.feed(block)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        raise AudioError("mix_unreadable", f"reading the audio failed: {exc}") from None
    return meter.result(info)


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
        # the mono fold is filtered as one more channel
        lanes = channels + (1 if self.stereo else 0)
        self.sos = k_weighting(rate)
        self.zi = np.zeros((self.sos.shape[0], 2, lanes))
        self.pending = np.zeros((0, lanes))  # weighted samples not yet in a sub-block
        self.sub_blocks: list[np.ndarray] = []  # per sub-block: mean square of each lane
        self.frames = 0
        self.peak = 0.0
        self.true_peak = 0.0
        self.tail = np.zeros((0, channels))  # last samples of the previous block
        self.unmeasured = 0  # how many of them the true peak has not covered yet
        self.sums = np.zeros(channels)
        self.lr = np.zeros(3)  # sum L*R, sum L*L, sum R*R
        self.clipped_samples = 0
        self.clipped_runs = 0
        self.run_lengths = np.zeros(channels, dtype=np.int64)  # full-scale run so far

    def feed(self, block: np.ndarray) -> None:
        if not np.all(np.isfinite(block)):
            block = np.nan_to_num(block, nan=0.0, posinf=1.0, neginf=-1.0)
        self.frames += block.shape[0]
        self.peak = max(self.peak, float(np.max(np.abs(block))))
        self.sums += block.sum(axis=0)
        if self.channels >= 2:
            left, right = block[:, 0], block[:, 1]
            self.lr += (float(left @ right), float(left @ left), float(right @ right))
        self._clipping(block)
        self._true_peak(block)
        lanes = np.hstack([block, block[:, :2].mean(axis=1, keepdims=True)]) if self.stereo \
            else block
        weighted, self.zi = signal.sosfilt(self.sos, lanes, axis=0, zi=self.zi)
        self.pending = np.vstack([self.pending, weighted])
        whole = self.pending.shape[0] // self.sub * self.sub
        if whole:
            squares = np.square(self.pending[:whole]).reshape(-1, self.sub, lanes.shape[1])
            self.sub_blocks.extend(squares.mean(axis=1))
            self.pending = self.pending[whole:]

    def _clipping(self, block: np.ndarray) -> None:
        at_full_scale = np.abs(block) >= self.clip_level
        for ch in range(self.channels):
            column = at_full_scale[:, ch]
            if not column.any() and self.run_lengths[ch] == 0:
                continue
            # run lengths of consecutive True values, the first continuing the carried run
            padded = np.concatenate([[False], column, [False]])
            edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
            starts, ends = edges[::2], edges[1::2]
            lengths = list(ends - starts)
            if lengths and starts[0] == 0:
                lengths[0] += int(self.run_lengths[ch])
            elif self.run_lengths[ch]:
                self._close_run(int(self.run_lengths[ch]))
            continues = bool(column[-1])
            closed = lengths[:-1] if continues else lengths
            for length in closed:
                self._close_run(int(length))
            self.run_lengths[ch] = lengths[-1] if continues else 0

    def _close_run(self, length: int) -> None:
        if length >= CLIP_RUN:
            self.clipped_samples += length
            self.clipped_runs += 1

    def _true_peak(self, block: np.ndarray, final: bool = False) -> None:
        """Oversample with context on both sides: the resampler sees zeros past the
        ends of what it is given, so the last TRUE_PEAK_OVERLAP samples of a block
        are measured with the next block, and only the file's real end is padded."""
        joined = np.vstack([self.tail, block])
        if not len(joined):
            return
        start = len(self.tail) - self.unmeasured  # where the last measurement stopped
        end = len(joined) if final else max(start, len(joined) - TRUE_PEAK_OVERLAP)
        if end > start:
            upsampled = signal.resample_poly(joined, OVERSAMPLING, 1, axis=0)
            fresh = upsampled[start * OVERSAMPLING:end * OVERSAMPLING]
            if fresh.size:
                self.true_peak = max(self.true_peak, float(np.max(np.abs(fresh))))
        self.unmeasured = len(joined) - end
        self.tail = joined[max(0, end - TRUE_PEAK_OVERLAP):]

    def result(self, info: Any) -> Measurements:
        self._true_peak(np.zeros((0, self.channels)), final=True)
        for ch in range(self.channels):  # runs still open at the end of the file
            if self.run_lengths[ch]:
                self._close_run(int(self.run_lengths[ch]))
        weights = channel_weights(self.channels)
        subs = np.array(self.sub_blocks).reshape(-1, self.pending.shape[1])
        programme = subs[:, :self.channels] @ weights if len(subs) else np.zeros(0)
        integrated = gated_loudness(_windows(programme, 4), RELATIVE_GATE_LU)
        drop = None
        if self.stereo:
            mono = subs[:, -1] * 2.0  # the fold, played on both channels
            folded = gated_loudness(_windows(mono, 4), RELATIVE_GATE_LU)
            if integrated is not None:
                drop = None if folded is None else round(integrated - folded, 2)
        correlation = None
        if self.channels >= 2:
            product, ll, rr = self.lr
            # A silent side correlates with nothing: undefined, not "uncorrelated" (0).
            correlation = round(product / math.sqrt(ll * rr), 4) if ll > 0 and rr > 0 else None
        short_term = _windows(programme, 30)
        per_second = [_lufs(short_term_at(programme, end)) for end in
                      range(10, len(programme) + 1, 10)]
        return Measurements(
            integrated_lufs=_round(integrated),
            loudness_range_lu=_round(loudness_range(short_term)),
            true_peak_dbtp=_round(_db(max(self.true_peak, self.peak))),
            sample_peak_dbfs=_round(_db(self.peak)),
            clipped_samples=self.clipped_samples,
            clipped_runs=self.clipped_runs,
            dc_offset=_dc(self.sums / max(self.frames, 1)),
            stereo_correlation=correlation,
            mono_loudness_drop_lu=drop,
            duration_seconds=round(self.frames / self.rate, 3),
            sample_rate=self.rate,
            channels=self.channels,
            bit_depth=BIT_DEPTHS.get(info.subtype),
            sample_format=str(info.subtype),
            file_format=str(info.format),
            short_term_lufs=[_round(v) for v in per_second],
        )


def _windows(powers: np.ndarray, size: int) -> np.ndarray:
    """Mean power of every run of `size` consecutive sub-blocks (step: one sub-block)."""
    if len(powers) < size:
        return np.zeros(0)
    sums = np.convolve(powers, np.ones(size), mode="valid")
    return np.asarray(sums / size)


def short_term_at(powers: np.ndarray, end: int) -> float:
    """Mean power of the 3 s window ending at sub-block `end` (shorter at the start)."""
    window = powers[max(0, end - 30):end]
    return float(window.mean()) if len(window) else 0.0


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


def _db(linear: float) -> float | None:
    return 20 * math.log10(linear) if linear > 0 else None


def _dc(means: np.ndarray) -> float:
    worst = int(np.argmax(np.abs(means)))
    return round(float(means[worst]), 6)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)
