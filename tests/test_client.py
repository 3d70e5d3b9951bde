"""The client commands for people: which agentbox they talk to (config file,
AGENTBOX_URL, --url), and what they print (the review, the runs table)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from agentbox.logs import one_line
from agentbox.review import digest
from tests.conftest import Server, free_port, make_event, wait_until


def agentbox(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def run_of(said: str) -> str:
    """The run id `send --wait` names on stderr: `night-drive.wav sent (run run_...)`."""
    found = re.search(r"\(run (run_\w+)\)", said)
    assert found, said
    return found.group(1)


def write_config(server: Server, **values: Any) -> Path:
    """agentbox.toml in the config directory the server's environment names."""
    folder = server.home / "config" / "agentbox"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agentbox.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


def tone(path: Path, seconds: float = 6.0, level: float = 0.25, rate: int = 48_000,
         **options: Any) -> Path:
    """A real render: a 1 kHz stereo sine, its modification time in the past (finished)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = (level * np.sin(2 * np.pi * 1000 * t)).astype("float32")
    sf.write(path, np.column_stack([wave, wave * 0.9]), rate, **options)
    old = time.time() - 60
    os.utime(path, (old, old))
    return path


# -- which agentbox ----------------------------------------------------------------------------


def test_client_commands_use_the_port_of_the_config_file(server: Server) -> None:
    # A non-default port, written only in agentbox.toml (as `serve` would read it).
    assert server.port != 8000
    write_config(server, port=server.port)
    env = {k: v for k, v in server.env.items() if k != "AGENTBOX_URL"}
    sent = agentbox(env, server.home, "send", "session.exported", "project_id=ok",
                    "mix_url=/m.wav", "--wait", "--json", "--retries", "0")
    assert sent.returncode == 0, sent.stderr
    run_id = json.loads(sent.stdout.split("\n", 1)[0])["run_id"]
    listed = agentbox(env, server.home, "runs")
    assert listed.returncode == 0 and run_id[4:14] in listed.stdout, listed.stderr
    shown = agentbox(env, server.home, "show", run_id)
    assert shown.returncode == 0 and f"run {run_id}  succeeded" in shown.stdout
    assert agentbox(env, server.home, "dead-letters").returncode == 0
    assert agentbox(env, server.home, "callbacks", "destinations").returncode == 0
    # A server bound to every address is reached on loopback.
    write_config(server, port=server.port, host="0.0.0.0")
    assert run_id[4:14] in agentbox(env, server.home, "runs").stdout


def test_agentbox_url_overrides_the_config_file_and_url_overrides_both(server: Server) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    write_config(server, port=free_port())  # nothing listens there
    env = {**server.env, "AGENTBOX_URL": server.url}
    assert agentbox(env, server.home, "runs").returncode == 0
    sent = agentbox(env, server.home, "send", "session.exported", "project_id=ok",
                    "mix_url=/m.wav", "--retries", "0")
    assert sent.returncode == 0 and json.loads(sent.stdout)["status"] == "accepted"
    env["AGENTBOX_URL"] = dead
    down = agentbox(env, server.home, "runs")
    assert down.returncode == 1 and f"cannot reach agentbox at {dead}" in down.stderr
    for url in (server.url, server.url + "/", server.url + "/webhooks/events"):
        listed = agentbox(env, server.home, "runs", "--url", url)
        assert listed.returncode == 0, (url, listed.stderr)
        again = agentbox(env, server.home, "send", "--url", url, "session.exported",
                         "project_id=ok", "mix_url=/m.wav", "--retries", "0")
        assert again.returncode == 0, (url, again.stderr)
        assert json.loads(again.stdout)["status"] == "accepted"
    env["AGENTBOX_URL"] = server.url + "/webhooks/events"  # the endpoint form here too
    assert agentbox(env, server.home, "runs").returncode == 0
    bad = agentbox(env, server.home, "runs", "--url", "ftp://127.0.0.1:1")
    assert bad.returncode == 2 and "--url" in bad.stderr and "http://" in bad.stderr


# -- what they print ----------------------------------------------------------------------------


def test_send_wait_prints_the_review_for_people(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    mix = tone(tmp_path / "night-drive.wav", subtype="PCM_24")
    env = {**server.env, "AGENTBOX_URL": server.url}
    empty = agentbox(env, server.home, "runs")
    assert empty.returncode == 0 and empty.stdout.strip() == "no runs yet"
    done = agentbox(env, server.home, "send", "--type", "session.exported", "--project",
                    "Night Drive", "--mix", str(mix), "--wait", "--wait-timeout", "90")
    assert done.returncode == 0, done.stderr
    told = done.stdout.splitlines()  # the review alone: what is waited for on stderr
    run_id = run_of(done.stderr)
    assert "night-drive.wav sent (run " in done.stderr and "reviewing" in done.stderr
    run = server.run(run_id)
    metrics = run["result"]["metrics"]
    assert told[0].startswith("night-drive.wav: ")
    assert f"{metrics['integrated_lufs']:.1f} LUFS" in told[1]
    assert f"true peak {metrics['true_peak_dbtp']:+.1f} dBTP" in told[1]
    assert f"LRA {metrics['loudness_range_lu']:.1f} LU" in told[1] and "PLR" in told[1]
    assert "Notes, what to fix first:" in told
    first_note = run["result"]["review_notes"][0]
    assert any(line.endswith(one_line(first_note)) and line.startswith("  1. ")
               for line in told)
    assert len(done.stdout.splitlines()) < 40  # not the whole document
    # --json: the document
    as_json = agentbox(env, server.home, "send", "--type", "session.exported", "--project",
                       "Night Drive", "--mix", str(mix), "--wait", "--json")
    assert json.loads(as_json.stdout.split("\n", 1)[1])["result"]["metrics"]
    # runs: a header, the project, the verdict, the loudness, a short id
    listed = agentbox(env, server.home, "runs").stdout.splitlines()
    assert listed[0].split() == ["WHEN", "PROJECT", "FILE", "REVIEW", "LUFS", "PEAK", "LRA",
                                 "ID"]
    row = next(line for line in listed if line.endswith(run_id[4:14]))
    assert "Night Drive" in row and "night-drive.wav" in row
    assert f" {run['result']['verdict']} " in row and "succeeded" not in row
    assert f"{metrics['integrated_lufs']:.1f}" in row
    assert f"{metrics['true_peak_dbtp']:+.1f}" in row
    assert max(len(line) for line in listed) <= 100
    # show: the same review, with the run's history
    shown = agentbox(env, server.home, "show", run_id).stdout
    assert "project Night Drive" in shown and "history:" in shown
    assert told[1] in shown.splitlines()
    assert agentbox(env, server.home, "dead-letters").stdout.strip() == (
        "no dead letters waiting for a decision")


def test_runs_that_were_not_reviewed_name_their_file(server_factory: Any,
                                                     tmp_path: Path) -> None:
    """`runs`, `show` and `send --wait` name the export of every run, also one that
    failed or is waiting for its retry: the file its event names."""
    # A run time shorter than the wait for a cut-short render's rest would need: the
    # cut file's attempt hands the wait to its retry at once.
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_RETRY_BASE_SECONDS": "600",
                             "AGENTBOX_RETRY_MAX_SECONDS": "600",
                             "AGENTBOX_RUN_TIMEOUT_SECONDS": "20"}).start()
    env = {**server.env, "AGENTBOX_URL": server.url}
    broken = tmp_path / "gone take.wav"  # there (a file not there is refused at once)
    broken.write_text("not audio")
    gone = agentbox(env, server.home, "send", "--type", "session.exported", "--project",
                    "Lost Song", "--mix", str(broken), "--wait")
    assert gone.returncode == 4, gone.stderr
    failed = run_of(gone.stderr)
    assert gone.stdout.splitlines()[0] == (
        "gone take.wav: couldn't review: it is not audio agentbox can read (whatever its "
        "name says) — export it again as WAV, AIFF or FLAC")
    whole = tone(tmp_path / "whole.wav", seconds=3.0)
    cut = tmp_path / "cut short.wav"  # its header promises more: retried while fresh
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    sent = agentbox(env, server.home, "send", "--type", "session.exported", "--project",
                    "Cut Song", "--mix", str(cut))
    retrying = json.loads(sent.stdout)["run_id"]
    wait_until(lambda: server.run(retrying)["status"] == "failed_retryable", 60,
               "the cut file's run to wait for its retry")
    listed = agentbox(env, server.home, "runs").stdout.splitlines()
    header = listed[0]
    column, verdict = header.index("FILE"), header.index("REVIEW")
    rows = {line.split()[-1]: line for line in listed[1:]}
    assert rows[failed[4:14]][column:].startswith("gone take.wav")
    assert rows[failed[4:14]][verdict:].startswith("couldn't review")
    assert rows[retrying[4:14]][column:].startswith("cut short.wav")
    assert rows[retrying[4:14]][verdict:].startswith("render unfinished")
    as_json = {r["run_id"]: r for r in server.client.get("/runs").json()["runs"]}
    assert as_json[failed]["file"] == "gone take.wav"
    assert as_json[retrying]["file"] == "cut short.wav"
    shown = agentbox(env, server.home, "show", failed).stdout.splitlines()
    assert "project Lost Song · file gone take.wav · sent " in " ".join(shown)
    assert "file cut short.wav" in agentbox(env, server.home, "show", retrying).stdout


def test_a_render_sent_cut_short_fails_for_good_once_left_as_it_is_not_dead_lettered(
        server_factory: Any, tmp_path: Path) -> None:
    """Sent by `send` within the minute a stalled renderer may still finish it, a
    cut-short render is waited for in one attempt (retries, 2 s apart, used to run
    out first and dead-letter a broken file), then fails for good."""
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_MAX_RETRIES": "1"}).start()
    env = {**server.env, "AGENTBOX_URL": server.url}
    whole = tone(tmp_path / "whole.wav", seconds=3.0)
    cut = tmp_path / "stalled.wav"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    stalled_at = time.time() - 54  # the window's last 6 seconds
    os.utime(cut, (stalled_at, stalled_at))
    sent = agentbox(env, server.home, "send", "--type", "session.exported", "--project",
                    "Stalled Song", "--mix", str(cut), "--wait", "--wait-timeout", "60")
    assert sent.returncode == 4, sent.stderr
    run_id = run_of(sent.stderr)
    assert sent.stdout.splitlines()[0] == (
        "stalled.wav: couldn't review: the render was cut short — export it again")
    run = server.run(run_id)
    assert run["status"] == "failed_permanent" and run["attempt"] == 1
    assert time.time() - stalled_at >= 60  # not before the window was over
    said = [json.loads(line) for line in server.log_path.read_text().splitlines()
            if line.startswith("{") and "waiting for the rest" in line]
    assert [line["run_id"] for line in said] == [run_id], said


def test_send_and_watch_name_a_project_alike(server: Server, tmp_path: Path) -> None:
    decomposed = unicodedata.normalize("NFD", "Über Nacht")
    assert decomposed != "Über Nacht"
    env = {**server.env, "AGENTBOX_URL": server.url}
    sent = agentbox(env, server.home, "send", "--type", "session.exported", "--project",
                    decomposed, "--mix", str(tone(tmp_path / "a.wav", seconds=0.5)), "--wait",
                    "--json")
    assert sent.returncode == 0, sent.stderr
    by_send = json.loads(sent.stdout.split("\n", 1)[1])["result"]["project_id"]
    folder = tmp_path / "exports"
    folder.mkdir()
    tone(folder / f"{decomposed}.wav", seconds=0.5)  # as a Mac's file system names it
    watched = agentbox(env, server.home, "watch", str(folder), "--existing", "--once",
                       "--settle", "0.1", "--interval", "0.05")
    assert watched.returncode == 0, watched.stderr
    run = server.wait_terminal(watched.stdout.split()[-1])
    assert by_send == run["result"]["project_id"] == "Über Nacht"  # composed, one project


def test_review_requested_without_requested_by_is_refused(server: Server) -> None:
    event = make_event(event_type="mix.review_requested",
                       payload={"project_id": "night-drive", "mix_url": "/m.wav"})
    refused = server.post(event)
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error_code"] == "invalid_event"
    assert [e["loc"] for e in body["errors"]] == [["payload", "requested_by"]]


# -- the review's fields, as people read them ----------------------------------------------------


REVIEW: dict[str, Any] = {  # a review with the fields of the reference result (all of them)
    "project_id": "night-drive", "summary": "Loud, and over the ceiling.",
    "review_notes": ["Lower the limiter's ceiling.", "Check the low end in mono."],
    "notes": [{"severity": "fix", "code": "true_peak_over", "text": "Lower the limiter's ceiling."},
              {"severity": "consider", "code": "low_end", "text": "Check the low end in mono."}],
    "verdict": "fail", "profile": {"name": "streaming"}, "mix_url": "/m/night-drive.wav",
    "file": {"name": "night-drive (v3).wav", "format": "WAV", "sample_rate": 48000},
    "metrics": {"integrated_lufs": -9.84, "true_peak_dbtp": 0.42, "loudness_range_lu": 5.16,
                "plr_db": 10.26},
    "targets": [{"name": "streaming", "gain_db": -4.2, "verdict": "warn"},
                {"name": "broadcast", "gain_db": -13.2, "verdict": "pass"}],
    "comparison": {"previous_run_id": "run_01", "previous_accepted_at": "2026-07-27T14:02:00Z",
                   "deltas": {"clipped_samples": 120, "true_peak_dbtp": 0.5,
                              "integrated_lufs": 1.2, "sample_peak_dbfs": -0.9},  # keys sorted
                   "note": "1.2 LU louder than the 14:02 export; true peak now over the ceiling."},
}


def test_a_review_is_told_verdict_figures_notes_targets_comparison() -> None:
    run = {"run_id": "run_02", "status": "succeeded", "result": REVIEW}
    lines = digest.review_lines(run)
    assert lines[0] == "night-drive (v3).wav: fail"
    assert lines[1] == "  -9.8 LUFS · true peak +0.4 dBTP · LRA 5.2 LU · PLR 10.3 dB"
    assert lines.index("  1. [fix] Lower the limiter's ceiling.") < lines.index(
        "  2. [consider] Check the low end in mono.")
    assert "  Streaming (Spotify, YouTube, Tidal)   -4.2 dB  warn" in lines  # as wide as needed
    # named and ordered as the page has them; a change of a level in LU or dB, not a level
    assert ("  Integrated loudness +1.2 LU, True peak +0.5 dB, Sample peak -0.9 dB, "
            "Clipped samples +120") in lines  # a count has no decimals
    when = digest.local_time("2026-07-27T14:02:00Z", seconds=True)  # two in a minute
    assert f"Compared with the previous export ({when}, run_01):" in lines
    assert not any("2026-07-27T14:02" in line for line in lines)  # a time people read
    assert lines[-1].endswith("true peak now over the ceiling.")
    assert digest.short(run) == ("night-drive (v3).wav: fail · -9.8 LUFS · true peak +0.4 dBTP"
                                 " · LRA 5.2 LU · PLR 10.3 dB")
    first = {**REVIEW, "comparison": {"previous_run_id": None, "deltas": {}}}
    assert digest.review_lines({**run, "result": first})[-1].startswith("First export")


def test_what_the_platform_rows_share_is_said_once_below_them() -> None:
    """A review's rows say what differs on each platform; what they share is one line
    below them (`targets_note`). A review stored before says it on every row."""
    rows = [{"name": "spotify", "title": "Spotify", "gain_db": -5.0, "verdict": "fail",
             "note": "turned down 5.0 dB; over its -1 dBTP ceiling"},
            {"name": "amazon_music", "title": "Amazon Music", "gain_db": -5.0,
             "verdict": "fail", "note": "turned down 5.0 dB; over its -2 dBTP ceiling"}]
    shared = "The file's true peak, +0.3 dBTP, is over every platform's upload ceiling."
    lines = digest.review_lines({"run_id": "run_04", "status": "succeeded",
                                 "result": {**REVIEW, "targets": rows, "targets_note": shared}})
    first = lines.index("  Spotify        -5.0 dB  fail: turned down 5.0 dB; over its -1 dBTP "
                        "ceiling")
    assert lines[first + 1].startswith("  Amazon Music   -5.0 dB  fail: turned down 5.0 dB")
    assert lines[first + 2] == f"  {shared}" and lines.count(f"  {shared}") == 1
    older = digest.review_lines({"run_id": "run_04", "status": "succeeded",
                                 "result": {**REVIEW, "targets": rows}})
    assert older == [line for line in lines if line != f"  {shared}"]


@pytest.mark.parametrize("result", [
    None, {}, {"metrics": "nonsense"}, {"metrics": {"integrated_lufs": None}},
    {"metrics": {"integrated_lufs": float("nan")}, "notes": [{"severity": 3}]},
    {"metrics": {}, "comparison": "x", "targets": [1, None], "review_notes": "x"},
])
def test_a_review_missing_fields_still_reads(result: Any) -> None:
    run = {"run_id": "run_03", "status": "succeeded", "result": result}
    lines = digest.review_lines(run)
    assert lines and lines[0].startswith("run_03: ")
    assert digest.short(run).startswith("run_03: ")


def test_a_file_name_cannot_forge_a_line() -> None:
    run = {"run_id": "r", "status": "succeeded",
           "result": {**REVIEW, "file": {"name": "a.wav\nagentbox: all good"}}}
    assert all("\n" not in line for line in digest.review_lines(run))
    assert digest.review_lines(run)[0].startswith("a.wav\\nagentbox")


def test_another_program_on_the_address_is_said_not_crashed_on(tmp_path: Path) -> None:
    """A web page where agentbox was expected (another program on the port, or --url
    naming a page): a sentence that says so, never a traceback or the page's HTML."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>something else</title>"
            self.send_response(200 if self.path.startswith("/runs") else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")}
        env["HOME"] = str(tmp_path)
        url = f"http://127.0.0.1:{other.server_address[1]}"
        for args in (("runs",), ("show", "run_x")):
            told = agentbox(env, tmp_path, *args, "--url", url)
            # It cannot prove it is agentbox (agentbox.proof): nothing is sent to it.
            assert told.returncode == 3, told
            assert "Traceback" not in told.stderr and "<title>" not in told.stderr
            assert f"something else listens at {url}, not your agentbox" in told.stderr
    finally:
        other.shutdown()
        other.server_close()
