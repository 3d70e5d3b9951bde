"""What a person reads in the terminal: `agentbox send FILE`, `show` by a prefix or a
project, Ctrl-C while waiting, an agentbox that is not running or cannot store."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server, free_port, wait_until
from tests.test_client import agentbox, run_of, tone


def test_send_a_file_reviews_it_and_says_so_for_people(server: Server, tmp_path: Path) -> None:
    env = {**server.env, "AGENTBOX_URL": server.url}
    mix = tmp_path / "Night Drive (v2).wav"
    mix.write_bytes(b"a render (the scripted agent does not read it)")
    sent = agentbox(env, tmp_path, "send", str(mix))
    assert sent.returncode == 0, sent.stderr
    line = sent.stdout.strip()
    assert line.startswith("Night Drive (v2).wav: sent for review: run run_"), line
    run_id = line.split("run ", 1)[1].split(";")[0]
    assert line.endswith(f"see it with: agentbox show {run_id}")
    run = server.wait_terminal(run_id)
    assert run["project"] == "Night Drive (v2)" and run["file"] == "Night Drive (v2).wav"
    assert run["event_type"] == "session.exported"
    again = agentbox(env, tmp_path, "send", str(mix))  # the same file: its first run
    assert again.stdout.startswith(f"Night Drive (v2).wav: sent before: its review is run "
                                   f"{run_id};")
    scripted = json.loads(agentbox(env, tmp_path, "send", str(mix), "--json").stdout)
    assert scripted["duplicate"] is True and scripted["run_id"] == run_id  # for scripts
    waited = agentbox(env, tmp_path, "send", str(mix), "--wait")
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.startswith("Night Drive (v2).wav: succeeded")  # not JSON
    assert f"Night Drive (v2).wav sent before (run {run_id}); reviewing…" in waited.stderr
    # the same file asked another way (a stage): a review of its own, once
    mastered = agentbox(env, tmp_path, "send", str(mix), "--stage", "master", "--json")
    as_master = json.loads(mastered.stdout)
    assert as_master["duplicate"] is False and as_master["run_id"] != run_id
    twice = json.loads(agentbox(env, tmp_path, "send", str(mix), "--stage", "master",
                                "--json").stdout)
    assert twice["duplicate"] is True and twice["run_id"] == as_master["run_id"]
    missing = agentbox(env, tmp_path, "send", str(tmp_path / "not rendered.wav"))
    assert missing.returncode == 2 and "there is no file at" in missing.stderr
    # a song's name typed without its file: no file, not an event type sent to the server
    typed = agentbox(env, tmp_path, "send", "Night Drive", "--wait")
    assert typed.returncode == 2 and "there is no file at Night Drive" in typed.stderr


def test_show_takes_a_prefix_or_a_project(server: Server, tmp_path: Path) -> None:
    env = {**server.env, "AGENTBOX_URL": server.url}
    first = tone(tmp_path / "ok.wav", seconds=0.3)
    ids = []
    for level in (0.1, 0.2):
        tone(first, seconds=0.3, level=level)  # a new export of the same song
        sent = agentbox(env, tmp_path, "send", str(first), "--json")
        ids.append(server.wait_terminal(json.loads(sent.stdout)["run_id"])["run_id"])
    older, latest = ids
    by_project = agentbox(env, tmp_path, "show", "ok", "--json")
    assert json.loads(by_project.stdout)["run_id"] == latest
    common = next(i for i, (a, b) in enumerate(zip(older, latest, strict=True)) if a != b)
    for prefix in (older[:common + 1], older[4:common + 4]):  # with and without run_
        shown = agentbox(env, tmp_path, "show", prefix, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["run_id"] == older
    several = agentbox(env, tmp_path, "show", older[:common])
    assert several.returncode == 1
    assert "starts the ids of several runs" in several.stderr and latest in several.stderr
    shortest = agentbox(env, tmp_path, "show", older[4:5])  # one digit: every run's
    assert shortest.returncode == 1 and "starts the ids of several runs" in shortest.stderr
    nothing = agentbox(env, tmp_path, "show", "never heard of")
    assert nothing.returncode == 1 and "no project has that name" in nothing.stderr
    assert "404" not in nothing.stderr  # a sentence, not an HTTP status
    listed = server.client.get("/runs", params={"prefix": older[:common + 1], "limit": 2})
    assert [r["run_id"] for r in listed.json()["runs"]] == [older]
    refused = server.client.get("/runs", params={"prefix": "run-1"})
    assert refused.status_code == 422 and refused.json()["error_code"] == "invalid_query"
    replayed = agentbox(env, tmp_path, "replay", older[:common + 1])  # not replayable:
    assert replayed.returncode == 1 and "only dead_lettered or failed_permanent" in replayed.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="Ctrl-C is a console event on Windows")
def test_ctrl_c_while_waiting_says_the_review_goes_on(server: Server, tmp_path: Path) -> None:
    mix = tmp_path / "sleep-3.wav"  # the scripted agent takes 3 s for project sleep-3
    mix.write_bytes(b"a render")
    with subprocess.Popen([sys.executable, "-m", "agentbox", "send", str(mix), "--wait",
                           "--url", server.url], env=server.env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as waiting:
        assert waiting.stderr is not None
        said = waiting.stderr.readline()  # `sleep-3.wav sent (run ...); reviewing…`
        run_id = run_of(said)
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 130, err
    assert "stopped waiting. The review goes on in agentbox; see it with: agentbox show " \
           f"{run_id}" in err
    assert "Aborted" not in err and "Traceback" not in err and out == ""
    assert server.wait_terminal(run_id)["status"] == "succeeded"  # it went on


def test_an_agentbox_that_is_not_running_says_how_to_start_it(tmp_path: Path) -> None:
    mix = tone(tmp_path / "mix.wav", seconds=0.2)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "AGENTBOX_WEBHOOK_SECRET": "s",
           "AGENTBOX_URL": f"http://127.0.0.1:{free_port()}"}
    sent = agentbox(env, tmp_path, "send", str(mix), "--retries", "0")
    assert sent.returncode == 3
    assert sent.stderr.startswith("agentbox: giving up: cannot reach agentbox at ")
    assert "(nothing answers there)" in sent.stderr
    assert "Start it with: agentbox serve" in sent.stderr and "Traceback" not in sent.stderr
    retried = subprocess.Popen(  # the hint comes with the first retry, not after them all
        [sys.executable, "-m", "agentbox", "send", str(mix), "--retries", "5"], env=env,
        cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        first = retried.stderr.readline() if retried.stderr else ""
        assert "trying again in" in first and "Start it with: agentbox serve" in first
    finally:
        retried.kill()
        retried.communicate()  # and its stderr closed


def test_the_server_s_own_reason_reaches_the_sender(server_factory: Any,
                                                    tmp_path: Path) -> None:
    server = server_factory().start()
    mix = tmp_path / "ok.wav"
    mix.write_bytes(b"a render")
    data = server.home / "data"
    shutil.move(data, server.home / "data.gone")  # the data directory removed under it
    wait_until(lambda: server.client.get("/healthz").status_code == 503, 30,
               "agentbox to notice")
    sent = agentbox({**server.env, "AGENTBOX_URL": server.url}, tmp_path, "send", str(mix),
                    "--retries", "0")
    assert sent.returncode == 3
    reason = (f"the database file {data / 'agentbox.sqlite3'} was removed or replaced; "
              "restart agentbox")
    assert sent.stderr.strip() == (
        f"agentbox: giving up: agentbox at {server.url} is unavailable (503 "
        f"storage_unavailable): The event store cannot take writes: {reason}. Nothing was "
        "stored.")


# -- the tables, on runs made up for them ----------------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentbox.models import RunDetail  # noqa: E402
from agentbox.review.figures import local_time  # noqa: E402
from agentbox.terminal import (  # noqa: E402
    columns,
    runs_table,
    short_ids,
    terminal_width,
    why_table,
)
from tests.support.runs import made_run  # noqa: E402

REVIEW_AGENT = "agentbox.review.agent:mix_review"


def made_up(run_id: str, status: str = "succeeded", project: str = "Night Drive",
            result: Any = None, **fields: Any) -> RunDetail:
    return made_run(**{"run_id": run_id, "status": status, "agent": REVIEW_AGENT,
                       "project": project, "file": f"{project}.wav", "result": result,
                       **fields})


def test_runs_fit_a_hundred_columns_with_people_s_words() -> None:
    review = {"verdict": "warn", "profile": {"name": "streaming"},
              "metrics": {"integrated_lufs": -9.84, "true_peak_dbtp": 0.42,
                          "loudness_range_lu": 5.16}}
    long = "A Very Long Project Name That Goes On (final final mix, v12)"
    found = [made_up("run_01a244c7add23235bf0f74bd7ba92cfb", result=review, project=long),
             made_up("run_01a244c7add2ffffbf0f74bd7ba92cfb", status="processing"),
             made_up("run_01a244c79900aaaabf0f74bd7ba92cfb", status="failed_retryable",
                     error_code="mix_truncated"),
             made_up("run_01a244c70000aaaabf0f74bd7ba92cfb", status="failed_permanent",
                     error_code="mix_unreadable", error_message="the file is empty (0 bytes)"),
             made_up("run_01a244c60000aaaabf0f74bd7ba92cfb", status="dead_lettered",
                     agent="tests.support.agents:scripted", error_code="boom",
                     error_message="it broke")]
    lines = runs_table(found)
    assert max(map(len, lines)) <= 100
    assert [line.split("  ")[0] for line in lines[1:]] == [
        local_time("2026-07-27T14:02:00Z")] * 5
    words = [line[lines[0].index("REVIEW"):].split("  ")[0].strip() for line in lines[1:]]
    assert words == ["warn", "reviewing…", "render unfinished", "couldn't review", "gave up"]
    assert "-9.8  +0.4  5.2" in lines[1] and "A Very" in lines[1] and "v12)  " in lines[1]
    assert lines[1].endswith(" 01a244c7add23") and lines[2].endswith(" 01a244c7add2f")
    assert lines[3].endswith(" 01a244c799")  # ten digits, where they tell it apart
    assert not any(word in line for line in lines for word in ("succeeded", "failed_"))
    why = why_table(found[3:])
    assert "couldn't review: the file is empty — export" in why[1]
    assert "boom: it broke" in why[2] and max(map(len, why)) <= 100


def test_a_terminal_of_eighty_columns_gets_a_table_of_eighty() -> None:
    """macOS's and Windows' terminals open 80 columns wide: the names are cut to fit
    (in the middle, so a name's end still tells it apart), the figures are whole."""
    review = {"verdict": "pass", "metrics": {"integrated_lufs": -14.04,
                                             "true_peak_dbtp": -1.2, "loudness_range_lu": 6.0}}
    long = "A Very Long Project Name That Goes On (final final mix, v12)"
    found = [made_up("run_01a244c7add23235bf0f74bd7ba92cfb", result=review, project=long),
             made_up("run_01a244c70000aaaabf0f74bd7ba92cfb", status="failed_permanent",
                     error_code="mix_unreadable", error_message="the file is empty (0 bytes)")]
    lines = runs_table(found, width=80)
    assert max(map(columns, lines)) <= 80, lines
    assert "-14.0  -1.2  6.0" in lines[1] and "v12)" in lines[1] and "…" in lines[1]
    assert max(map(columns, why_table(found, width=80))) <= 80


def test_the_width_is_the_terminal_s_and_a_pipe_s_stays_put(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_width(False) == 100  # into a pipe or a file: what a script reads
    monkeypatch.setenv("COLUMNS", "72")
    assert terminal_width(False) == terminal_width(True) == 72
    monkeypatch.setenv("COLUMNS", "200")
    assert terminal_width(True) == 100  # never wider than the table needs


def test_a_name_with_wide_characters_keeps_the_columns_in_line() -> None:
    """An emoji or a CJK character takes two columns of a terminal: the table counts
    columns, not characters, so the lines stay within 100 and the columns aligned."""
    wide = "Night Drive (final mix v2) — Ünïcødé 🎸 夜のドライブ and more words"
    found = [made_up("run_01a244c7add23235bf0f74bd7ba92cfb", project=wide),
             made_up("run_01a244c7add2ffffbf0f74bd7ba92cfb", project="short")]
    lines = runs_table(found)
    assert max(map(columns, lines)) <= 100
    ids = [columns(line[:line.rindex(" ") + 1]) for line in lines]
    assert ids[0] == ids[1] == ids[2]  # the last column starts at the same place


@given(st.lists(st.text("0123456789abcdef", min_size=32, max_size=32), min_size=1,
                max_size=30))
def test_a_short_id_is_the_start_of_its_run_id_and_of_no_other(bodies: list[str]) -> None:
    ids = [f"run_{body}" for body in bodies]
    short = short_ids(ids)
    for run_id, shown in short.items():
        assert run_id.removeprefix("run_").startswith(shown) and len(shown) >= 10
        assert [other for other in short if other.startswith("run_" + shown)] == [run_id]


def test_show_wraps_at_word_boundaries_and_pages_only_when_longer_than_the_terminal(
        ) -> None:
    from agentbox import terminal

    note = ("  Integrated -21.7 LUFS is 7.7 LU below the streaming (Spotify, YouTube, "
            "Tidal) target of -14 LUFS: Spotify turns it up only 5.0 dB")
    lines = terminal.wrapped(["mix.wav: fail", note], 40)
    assert all(len(line) <= 40 for line in lines) and len(lines) > 3
    assert " ".join(" ".join(lines).split()) == " ".join(f"mix.wav: fail {note}".split())
    assert all(line.startswith("  ") for line in lines[1:])  # under its indentation
    assert not terminal.needs_pager(lines, 50, interactive=True)
    assert terminal.needs_pager(lines * 20, 50, interactive=True)
    assert not terminal.needs_pager(lines * 20, 50, interactive=False)  # piped: never


def test_a_platform_row_wraps_under_its_note_and_a_sentence_under_its_indentation() -> None:
    from agentbox import terminal

    row = ("  Podcast (Apple Podcasts)     0.0 dB  fail: plays as it is, 7.2 LU louder than "
           "-16 LUFS: lower it that much; over its -1 dBTP ceiling")
    said = ("  The file's true peak, +0.2 dBTP, is over every platform's upload ceiling: the "
            "encode, before any turning down, may clip it.")
    lines = terminal.wrapped([row, said], 100)
    assert [len(line) <= 100 for line in lines] == [True] * 4
    column = lines[0].index("fail")
    assert lines[1].startswith(" " * column + "that much") and lines[1][column - 1] == " "
    assert lines[3].startswith("    ") and not lines[3].startswith("     ")  # a sentence


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal: POSIX's pty")
def test_send_wait_in_a_terminal_wraps_at_word_boundaries(server_factory: Any,
                                                         tmp_path: Path) -> None:
    """`send --wait` in an 80-column terminal: the review's long sentences wrap between
    words, as `show`'s do, where the terminal cut them mid-word."""
    import os
    import pty

    from tests.support.corpus import Song, song_audio, write

    server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    mix = write(tmp_path / "mix.wav", song_audio(Song(lufs=-20.0)))
    ours, theirs = pty.openpty()
    env = {**server.env, "AGENTBOX_URL": server.url, "COLUMNS": "80", "LINES": "200"}
    process = subprocess.Popen([sys.executable, "-m", "agentbox", "send", str(mix), "--wait"],
                               env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=theirs,
                               stderr=subprocess.PIPE)
    os.close(theirs)
    out = b""
    while True:
        try:
            chunk = os.read(ours, 65536)
        except OSError:  # the other end closed: the command finished
            break
        if not chunk:
            break
        out += chunk
    os.close(ours)
    assert process.stderr is not None
    with process.stderr:
        said = process.stderr.read().decode()
    assert process.wait(timeout=180) == 0, said
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert lines and lines[0].startswith("mix.wav: "), lines
    assert max(len(line) for line in lines) <= 80, lines
    text = " ".join(line.strip() for line in lines)
    assert "Judged as a mix going to mastering" in text  # a long sentence, whole again


@pytest.mark.parametrize(("value", "signed", "said"), [
    (-0.04, False, "0.0"), (-0.04, True, "0.0"), (0.04, True, "0.0"), (-1.25, False, "-1.2"),
    (0.36, True, "+0.4"), (-7.96, True, "-8.0"), (13.0, False, "13.0")])
def test_a_reading_to_a_tenth_never_says_minus_zero(value: float, signed: bool,
                                                    said: str) -> None:
    """figures.tenths: how every reading to 0.1 is written (the notes, the platform rows,
    the headline, the terminal's tables)."""
    from agentbox.review.figures import tenths

    assert tenths(value, signed) == said
