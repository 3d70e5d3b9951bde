"""How the review page reads a review document: every field the mix review writes
(verdict, file, targets, comparison, the loudness curve, clipping, octave bands,
ordered notes) is drawn when present, and a review stored before those fields
existed still renders. The page's own templates, rendered here without a server:
the documents are written out by hand so that each field is certain to be there."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentbox.http.pages import add_app_files, page_templates
from agentbox.review import charts, digest, present
from agentbox.review.app import ReviewApp
from agentbox.review.judge import judge
from agentbox.review.model import as_review
from agentbox.review.profiles import PROFILES
from agentbox.review.view import Compared, Review, signed
from agentbox.review.web.pages import add_templates

RUN_ID = "run_0123456789abcdef"


def old_review(**metrics: Any) -> dict[str, Any]:
    """A review as stored before the verdict, targets and curves existed."""
    return {
        "project_id": "night-drive", "summary": "Integrated -9.0 LUFS.",
        "review_notes": ["Turn it down.", "Mind the peaks."], "notes_source": "rules",
        "mix_url": "file:///home/me/Exports/night%20drive.wav",
        "profile": {"name": "streaming", "title": "streaming", "target_lufs": -14.0,
                    "tolerance_lu": 1.0, "max_true_peak_dbtp": -1.0},
        "metrics": {"integrated_lufs": -14.2, "loudness_range_lu": 6.5, "true_peak_dbtp": -1.5,
                    "sample_peak_dbfs": -1.6, "clipped_samples": 0, "clipped_runs": 0,
                    "dc_offset": 0.0, "stereo_correlation": 0.4, "mono_loudness_drop_lu": 1.2,
                    "duration_seconds": 95.0, "sample_rate": 48000, "channels": 2,
                    "bit_depth": 24, "sample_format": "PCM_24", "file_format": "WAV",
                    "short_term_lufs": [None, None] + [-14.0 + (i % 5) for i in range(93)],
                    **metrics},
    }


def new_review() -> dict[str, Any]:
    doc = old_review(
        momentary_max_lufs=-8.1, short_term_max_lufs=-10.2, plr_db=12.7, headroom_db=0.5,
        dual_mono=True, mono=False,
        clipping_ranges=[{"start": 12.2, "end": 13.4}, {"start": 61.0, "end": 61.0}],
        octave_bands=[{"hz": hz, "db": -20 + i, "reference_db": -18.0}
                      for i, hz in enumerate((31.5, 63, 125, 250, 500, 1000, 2000, 4000,
                                              8000, 16000))],
        loudness_curve={"step_seconds": 0.5,
                        "momentary": [-13.0 + (i % 7) for i in range(190)],
                        "short_term": [-14.0 + (i % 5) / 2 for i in range(190)]})
    doc.update(
        verdict="warn",
        file={"name": "night drive (final).wav", "format": "WAV", "sample_rate": 48000,
              "bit_depth": 24, "channels": 2, "duration_seconds": 95.0,
              "frames_declared": 4560000, "frames_read": 4560000},
        targets=[{"name": name, "title": name.title(), "integrated_target_lufs": target,
                  "true_peak_max_dbtp": -1.0,
                  "gain_db": target + 14.2, "result_true_peak_dbtp": -1.5 + target + 14.2,
                  "verdict": "pass", "note": f"{name} note"}
                 for name, target in (("streaming", -14), ("apple_music", -16),
                                      ("broadcast", -23), ("club", -8), ("podcast", -16))],
        comparison={"previous_run_id": "run_previous", "previous_accepted_at":
                    "2026-12-04T14:02:00.000Z", "deltas": {"integrated_lufs": 1.2},
                    "note": "1.2 LU louder than the 14:02 export."},
        notes=[{"severity": "info", "code": "a", "text": "Mono compatible."},
               {"severity": "fix", "code": "b", "text": "Lower the ceiling."},
               {"severity": "consider", "code": "c", "text": "Let the verse breathe."}],
        review_notes=["Mono compatible.", "Lower the ceiling.", "Let the verse breathe."])
    return doc


def render(doc: dict[str, Any], previous: Compared | None = None,
           review: Review | None = None) -> str:
    review = review or Review.of(doc)
    assert review is not None
    run = {"run_id": RUN_ID, "status": "succeeded", "event_type": "session.exported",
           "source": "studio", "agent": "agentbox.review.agent:mix_review", "attempt": 1,
           "accepted_at": "2026-12-04T15:00:00.000Z", "error_code": None, "callbacks": [],
           "correlation_id": None, "causation_id": None, "hop": 0, "result": doc}
    env = page_templates()
    add_app_files(env, "review", ReviewApp.templates, ReviewApp.static)
    return add_templates(env).get_template("review/review_run.html").render(
        run=run, event={"event_id": "e1", "payload": {"project_id": "night-drive"}},
        review=review, chain=[], project="night-drive", history=[], attempts=[],
        discarded=None, previous=previous, audio_type="audio/wav", csrf="x", alerts=[])


def test_every_field_of_a_new_review_is_drawn() -> None:
    doc = new_review()
    review = Review.of(doc)
    assert review is not None
    earlier = old_review(integrated_lufs=-15.4)
    html = render(doc, Compared("run_previous", "2026-12-04T14:02:00.000Z",
                                Review.of(earlier), review))
    assert '<span class="verdict warn big"' in html  # the review's, not worked out here
    assert "<h1" in html and "night drive (final).wav" in html
    assert "WAV · 48 kHz · 24-bit · stereo (both channels identical: dual mono) · 1:35" in html
    # platforms, each with the gain its normalisation applies
    assert re.search(r'<tr data-target="apple_music"><td[^>]*>Apple_Music</td>', html)  # its title
    rows = re.findall(r'<tr data-target="(\w+)">.*?class="num gain"[^>]*>([^<]+)</td>', html, re.S)
    assert rows == [("streaming", "+0.2 dB"), ("apple_music", "\N{MINUS SIGN}1.8 dB"),
                    ("broadcast", "\N{MINUS SIGN}8.8 dB"), ("club", "+6.2 dB"),
                    ("podcast", "\N{MINUS SIGN}1.8 dB")]
    # what every row shares, said once below the table; a review from before has none
    doc["targets_note"] = "Lower it with gain alone where a row says so."
    said = render(doc)
    assert re.search(r'</table>\s*<p id="targets-note">Lower it with gain alone where a row '
                     r"says so\.</p>", said)
    assert 'id="targets-note"' not in html
    # notes: what to fix first
    notes = re.findall(r'<span class="severity (\w+)">', html)
    assert notes == ["fix", "consider", "info"]
    # loudness: both curves, both clipping places, marked and listed
    assert 'class="momentary"' in html and 'class="short-term"' in html
    wide = html[html.index('id="loudness-plot"'):html.index('id="loudness-plot-phone"')]
    assert wide.count('class="clip-marker"') == 2  # and again in the phone's chart
    assert html.count('class="clip-marker"') == 4
    assert "clipping at 0:12\N{EN DASH}0:13" in html and "clipping at 1:01<" in html
    assert "at 0:12\N{EN DASH}0:13, 1:01." in html
    # tonal balance, octave by octave against the reference
    tonal = html[html.index('id="tonal-balance"'):]
    assert re.findall(r'class="x-tick"[^>]*>([^<]+)<', tonal)[:10] == [
        "31.5", "63", "125", "250", "500", "1k", "2k", "4k", "8k", "16k"]
    assert 'class="reference"' in tonal and 'class="measured"' in tonal
    # its shading has a key: which colour says the mix is louder, which quieter
    keys = re.findall(r'<rect class="key"[^>]*fill="(#\w+)"[^>]*/><text class="legend"[^>]*>'
                      r'([^<]+)<', tonal[:tonal.index("</svg>")])
    shaded = set(re.findall(r'class="band-delta"[^>]*fill="(#\w+)"', tonal[:tonal.index("</svg>")]))
    assert {colour for colour, _ in keys} == shaded and len(keys) >= 1, (keys, shaded)
    assert {label for _, label in keys} <= {"mix louder than reference",
                                            "mix quieter than reference"}
    # the comparison: the review's own delta and note win
    previous = html[html.index('id="previous"'):]
    assert "1.2 LU louder than the 14:02 export." in previous
    row = re.search(r'data-figure="integrated_lufs">(.*?)</tr>', previous, re.S)
    assert row is not None and "+1.2" in row.group(1)
    assert 'href="/ui/runs/run_previous"' in previous
    assert '<audio id="mix-audio"' in html and f'src="/runs/{RUN_ID}/audio"' in html


def test_a_review_stored_before_the_new_fields_still_renders() -> None:
    doc = old_review()
    html = render(doc, Compared(None, None, None, Review.of(doc)))  # type: ignore[arg-type]
    assert 'id="loudness-plot"' in html and 'class="short-term"' in html
    assert 'class="momentary"' not in html and 'clip-marker' not in html
    assert 'id="targets"' not in html and 'id="tonal-balance"' not in html
    assert "night drive.wav" in html  # from the mix_url
    assert '<span class="verdict pass big"' in html  # on target, under the ceiling
    assert "first export" in html
    assert [n.text for n in Review.of(doc).notes] == doc["review_notes"]  # type: ignore[union-attr]


def test_an_old_review_without_a_verdict_is_given_the_judges() -> None:
    """Not a rule of the page's own: the judge's verdict on the stored measurements,
    against the stored profile, the same for every reader."""
    def verdict(**metrics: Any) -> str | None:
        doc = old_review(**metrics)
        found = Review.of(doc)
        assert found is not None and "verdict" not in doc
        model = as_review(doc)
        assert model is not None
        judged = judge(model.metrics, PROFILES[model.profile.name]).verdict
        assert found.verdict == judged == present.read(doc).verdict  # type: ignore[union-attr]
        assert digest.run_verdict({"status": "succeeded", "result": doc}) == judged
        return found.verdict

    assert verdict() == "pass"
    assert verdict(true_peak_dbtp=0.3) == "fail"
    assert verdict(clipped_runs=4, clipped_samples=40) == "fail"
    assert verdict(integrated_lufs=None) == "fail"


def test_fields_of_the_wrong_shape_are_left_out_not_a_crash() -> None:
    """However strictly the review's model checks a document, the page's reading
    of it does not trust it (a model may let more through than the page expects)."""
    model = Review.of(old_review())
    assert model is not None
    doc = new_review()
    doc.update(verdict="great", targets=[1, {"name": 3}, {"name": "club", "gain_db": "x"}],
               notes="no", comparison=[], file={"name": 7})
    doc["metrics"].update(clipping_ranges=[{"start": "a"}, 5], octave_bands=[{"hz": -1}],
                          loudness_curve={"step_seconds": "x", "short_term": "no"})
    shared = present.read(doc)
    assert shared is not None and shared.verdict is None  # "great" is no verdict
    html = render(doc, None, Review(doc, {**model.metrics, **doc["metrics"]}, None,
                                    shared.notes, model.model))
    assert '<tr data-target="club">' in html and "—" in html
    assert 'clip-marker' not in html and 'id="tonal-balance"' not in html
    assert 'id="loudness-plot"' in html  # from short_term_lufs
    assert "night drive.wav" in html


@given(st.floats(min_value=1, max_value=4 * 3600))
def test_time_ticks_are_mm_ss_in_order_and_few(duration: float) -> None:
    svg = charts.loudness_chart(duration=duration, short_term=charts.Curve(1.0, [-14.0, -13.0]),
                                momentary=None, target=-14, tolerance=1)
    ticks = re.findall(r'class="x-tick"[^>]*>([^<]+)<', svg)
    assert ticks[0] == "0:00" and 1 <= len(ticks) <= 10
    seconds = []
    for tick in ticks:
        assert re.fullmatch(r"(\d+:)?\d{1,2}:\d\d", tick), tick
        parts = [int(p) for p in tick.split(":")]
        seconds.append(sum(p * 60 ** i for i, p in enumerate(reversed(parts))))
    assert seconds == sorted(seconds) and seconds[-1] <= max(duration, 2.0) + 0.5  # the curve: 2 s


def test_changes_read_as_people_write_them() -> None:
    assert signed(1.234) == "+1.2" and signed(-0.04) == "0.0" and signed(-0.0) == "0.0"
    assert signed(-2.5) == "\N{MINUS SIGN}2.5" and signed(None) == "\N{EM DASH}"
    assert charts.mmss(65) == "1:05" and charts.mmss(3725) == "1:02:05"


def test_without_a_note_of_its_own_the_comparison_says_what_changed() -> None:
    def note(before: dict[str, Any], after: dict[str, Any]) -> str:
        this = Review.of(after)
        assert this is not None
        return Compared("run_previous", None, Review.of(before), this).note

    assert note(old_review(integrated_lufs=-15.4), old_review()) == \
        "1.2 LU louder than the previous export."
    assert note(old_review(), old_review(integrated_lufs=-16.0, true_peak_dbtp=0.3)) == \
        "1.8 LU quieter than the previous export; true peak now over the -1 dBTP ceiling."
    assert note(old_review(), old_review()) == "About the same as the previous export."


def test_an_hour_of_momentary_loudness_is_drawn_with_a_few_hundred_points() -> None:
    hour = [-20.0 + (i % 50) / 10 for i in range(36_000)]
    hour[12_345] = -3.0  # one loud moment must survive the thinning
    svg = charts.loudness_chart(duration=3600, short_term=None,
                                momentary=charts.Curve(0.1, hour), target=-14, tolerance=1)
    points = sum(len(line.split()) for line in re.findall(r'points="([^"]+)"', svg))
    assert 100 <= points <= 900 and len(svg) < 40_000
    assert re.findall(r'class="y-tick"[^>]*>([^<]+)<', svg)[-1] in ("0", "-3")
    assert re.findall(r'class="x-tick"[^>]*>([^<]+)<', svg)[-1] == "1:00:00"


def test_clipping_is_listed_as_a_few_places() -> None:
    doc = old_review(clipping_ranges=[{"start": 10.0, "end": 10.2}, {"start": 10.5, "end": 11.4}]
                     + [{"start": 20.0 + 3 * i, "end": 20.4 + 3 * i} for i in range(12)])
    review = Review.of(doc)
    assert review is not None
    assert review.clipping_text == ("0:10\N{EN DASH}0:11, 0:20, 0:23, 0:26, 0:29, 0:32, 0:35, "
                                    "0:38 and 5 more")
    assert str(review.loudness_chart()).count('class="clip-marker"') == 14


def test_a_trend_points_tooltip_reads_as_the_pages_do() -> None:
    points = [charts.TrendPoint("2026-12-05T00:00:00Z", 1.84, "run_a", "clip.wav"),
              charts.TrendPoint("2026-12-05T00:01:00Z", -1.04, "run_b", "fixed.wav"),
              charts.TrendPoint("2026-12-05T00:02:00Z", 0.02, "run_c", "edge.wav")]
    svg = charts.trend_chart("trend-true-peak", "True peak", "dBTP", points)
    titles = re.findall(r"<circle[^>]*><title>([^<]*)</title>", svg)
    assert titles == ["clip.wav: +1.8 dBTP", "fixed.wav: -1.0 dBTP", "edge.wav: 0.0 dBTP"]
    loudness = charts.trend_chart("trend-integrated", "Integrated", "LUFS", [
        charts.TrendPoint("2026-12-05T00:00:00Z", -14.234, "run_a", "a.wav")])
    assert "<title>a.wav: -14.2 LUFS</title>" in loudness


def test_compared_exports_show_a_peak_with_its_sign() -> None:
    from agentbox.review.view import deltas

    before, after = (Review.of(old_review(true_peak_dbtp=tp, integrated_lufs=lufs))
                     for tp, lufs in ((-1.5, -14.2), (0.4, -9.0)))
    assert before is not None and after is not None
    rows = {d.key: d for d in deltas(before, after)}
    assert (rows["true_peak_dbtp"].before, rows["true_peak_dbtp"].after) == (
        "\N{MINUS SIGN}1.5", "+0.4")  # over full scale, and reads so
    assert (rows["integrated_lufs"].before, rows["integrated_lufs"].after) == (
        "\N{MINUS SIGN}14.2", "\N{MINUS SIGN}9.0")  # a loudness is not signed


@given(st.text(alphabet="abc deft()", min_size=1, max_size=80))
def test_a_phones_tonal_legend_stays_inside_the_chart_above_the_plot(name: str) -> None:
    """However long the reference's name, the legend wraps into rows inside the
    chart's width and the plot moves down to make room for them."""
    bands = [charts.Band(hz, db, db + (2 if i % 2 else -2))
             for i, (hz, db) in enumerate(zip((63, 125, 250, 500, 1000), (-8, -9, -10, -12, -14),
                                              strict=True))]
    frame = charts.Frame(charts.PHONE_WIDTH, 300, left=46, right=12)
    svg = charts.tonal_chart(bands, f"the reference track {name}", frame)
    keys = [key for key in (charts.Key("this mix", ""), charts.Key(f"reference track {name}", ""),
                            charts.Key("mix louder than reference", "", 0.18),
                            charts.Key("mix quieter than reference", "", 0.18))]
    rows = charts._legend_rows(frame, keys)
    for row in rows:
        x, last = row[-1]
        assert len(row) == 1 or x + last.width - 6 <= frame.width - frame.right
    baselines = sorted({float(y) for y in re.findall(r'class="legend" x="[\d.]+" y="([\d.]+)"',
                                                     svg)})
    assert len(baselines) == len(rows) and baselines[0] >= 10
    plot_top = float(re.search(r'<rect x="[\d.]+" y="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    assert baselines[-1] < plot_top


def test_a_reading_that_rounds_to_zero_is_never_minus_zero() -> None:
    line = digest.headline(old_review(integrated_lufs=-0.04, true_peak_dbtp=-0.04))
    assert "-0.0" not in line and "true peak 0.0 dBTP" in line
    assert signed(-0.04) == "0.0"


def test_a_rejudgment_takes_its_export_s_number_and_renders_alone_are_counted() -> None:
    from agentbox.review.view import numbers

    # newest first: a re-judgment of #1, #3 (the audio of #1 again), #2, #1
    exports = [("r4", "r1"), ("r3", None), ("r2", None), ("r1", None)]
    hashes = [None, "a", "b", "a"]
    assert numbers(exports, hashes) == [(1, None), (3, 1), (2, None), (1, None)]
    assert numbers([("r9", "gone")], [None]) == [(None, None)]  # its export not among them
