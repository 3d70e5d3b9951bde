"""The result of a mix review, as the agent returns it and the store keeps it.

Every field added since the first review has a default, so that reviews stored
by older versions still validate (`as_review`); readers go through
agentbox.review.present, which reads what a stored document holds.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentbox.review.stage import StageName
from agentbox.review.words import SEVERITIES as SEVERITIES  # named here as before
from agentbox.review.words import VERDICTS as VERDICTS


class Model(BaseModel):
    """A part of the review. Its validator is built when it first reads one, not when
    the module is imported (the CLI tells runs without reading a review)."""

    model_config = ConfigDict(defer_build=True)


class ProfileView(Model):
    name: str
    title: str
    target_lufs: float
    tolerance_lu: float
    max_true_peak_dbtp: float


class ClippingRange(Model):
    start: float  # seconds
    end: float
    kind: str = "clipping"  # "clipping": samples at full scale; "over": above 0 dBTP between


class OctaveBand(Model):
    hz: float
    db: float  # the band's share of the mix's power
    reference_db: float | None = None  # the profile's reference curve


class LoudnessCurve(Model):
    step_seconds: float
    momentary: list[float | None]
    short_term: list[float | None]


class MixMetrics(Model):
    integrated_lufs: float | None
    loudness_range_lu: float | None
    true_peak_dbtp: float | None
    sample_peak_dbfs: float | None
    clipped_samples: int
    clipped_runs: int
    dc_offset: float
    stereo_correlation: float | None
    mono_loudness_drop_lu: float | None
    duration_seconds: float
    sample_rate: int
    channels: int
    bit_depth: int | None
    sample_format: str
    file_format: str
    short_term_lufs: list[float | None]
    momentary_max_lufs: float | None = None
    short_term_max_lufs: float | None = None
    plr_db: float | None = None
    mono: bool = False
    dual_mono: bool = False
    headroom_db: float | None = None  # the profile's ceiling minus the true peak
    low_end_correlation: float | None = None
    leading_silence_seconds: float = 0.0
    trailing_silence_seconds: float = 0.0
    start_lufs: float | None = None  # loudness of the first 100 ms
    end_lufs: float | None = None  # loudness of the last 100 ms
    start_onset_db: float | None = None  # the first ms against the first 100 ms (RMS)
    clipped_longest_run: int = 0  # samples in the longest run at full scale
    tonal_reference: str | None = None  # what octave_bands' reference_db are: a curve, a track
    clipping_ranges: list[ClippingRange] = []
    octave_bands: list[OctaveBand] = []
    loudness_curve: LoudnessCurve | None = None
    # The stage's evidence (agentbox.review.stage): a limiter's ceiling, dither, tags.
    peaks_pinned: float | None = None
    dithered: bool | None = None
    tags: list[str] = []


class FileInfo(Model):
    name: str
    format: str
    sample_rate: int
    bit_depth: int | None  # None for lossy formats
    channels: int
    duration_seconds: float
    frames_declared: int | None
    frames_read: int
    size_bytes: int | None = None  # the file's size as reviewed (None in older results)
    # What was reviewed, to know it again (None in older results): the SHA-256 of the
    # bytes measured (the archive's name for them) and the file's modification time.
    sha256: str | None = None
    modified_ns: int | None = None


class TargetView(Model):
    name: str
    title: str
    integrated_target_lufs: float
    true_peak_max_dbtp: float
    # What the platform's normalisation applies; None: silent, or a mix (not played yet)
    gain_db: float | None
    result_true_peak_dbtp: float | None
    verdict: str | None = None  # None for a mix: what a master would need, not a verdict
    note: str = ""


class Comparison(Model):
    previous_run_id: str | None  # None: the project's first export
    previous_accepted_at: str | None = None
    deltas: dict[str, float] = {}  # figure -> this export minus the previous one
    note: str = ""


class ReferenceView(Model):
    file: str
    integrated_lufs: float | None = None
    true_peak_dbtp: float | None = None
    loudness_range_lu: float | None = None
    plr_db: float | None = None
    stereo_correlation: float | None = None
    octave_bands: list[OctaveBand] = []
    deltas: dict[str, float] = {}  # figure -> the mix minus the reference
    note: str
    error: str | None = None
    # "project": the project's reference track; "event": the event's reference_url
    # (which wins for that event). None in reviews from before projects had one.
    source: str | None = None


class Note(Model):
    severity: str  # "fix", "consider" or "info"
    code: str
    text: str


class StageReadings(Model):
    """The first fix under each reading, when the evidence of the stage is split."""

    mix: str
    master: str


class MixReview(Model):
    """A mix review: the `result` of a review's run (GET /runs/{run_id}, GET /exports)."""

    project_id: str
    summary: str
    review_notes: list[str]
    profile: ProfileView
    metrics: MixMetrics
    notes_source: str  # "rules", or "llm" when the configured model wrote the notes
    mix_url: str
    verdict: str = "pass"  # "pass", "warn" or "fail" for the stage, against the profile
    # "mix" (judged as a mix going to mastering) or "master" (against the profile);
    # a review stored before stages was judged as a master.
    stage: StageName = StageName.MASTER
    stage_reason: str = ""  # which stage was judged, why, and how to change it
    stage_source: str | None = None  # where the stage came from (review/stage.py's Stage)
    # The evidence of the stage was split (inferred, "auto"): the page asks which it is,
    # with the first fix under each reading (absent from reviews stored before it).
    stage_split: bool = False
    stage_readings: StageReadings | None = None
    # The stage the project remembers after this export (the musician said so for the
    # project: payload.project_stage), or None: later exports read it from here.
    project_stage: str | None = None
    rejudge_of: str | None = None  # the run whose audio this review judged again
    file: FileInfo | None = None
    targets: list[TargetView] = []
    # Absent from reviews stored before it: their rows' notes each say it all.
    targets_note: str = Field("", description=(
        "What every platform row (targets) shares, said once beside them: each row's "
        "note says only what differs there. \"\" when they share nothing; absent from "
        "reviews stored before it, whose rows' notes each say it all."))
    comparison: Comparison = Comparison(previous_run_id=None)
    reference: ReferenceView | None = None
    notes: list[Note] = []  # the rule-based notes, in review_notes' order when "rules"
    # The genre the tonal balance was judged for (agentbox.review.genres): the event's,
    # else the last one given for the project; None for none.
    genre: str | None = None


def as_review(result: Any) -> MixReview | None:
    """A stored result as a mix review, if it is one: another agent's result may use
    the same key names (and a review is drawn from its fields, so they must hold)."""
    if not (isinstance(result, dict) and "metrics" in result and "profile" in result):
        return None
    try:
        return MixReview.model_validate(result)
    except ValidationError:
        return None
