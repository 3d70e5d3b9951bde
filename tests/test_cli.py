"""The agentbox command against a real server, as an export script would use it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, Server, make_event, wait_until


def agentbox(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=server.env,
                          capture_output=True, text=True, timeout=60, cwd=server.home)


def test_send_then_follow_the_run(server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "--source", "daw", "--event-id",
                    "mix-1", "session.exported", "project_id=ok", "mix_url=/mixes/a.wav")
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert answer["status"] == "accepted"
    run = server.wait_terminal(answer["run_id"])
    assert run["event_id"] == "mix-1" and run["source"] == "daw"
    again = agentbox(server, "send", "--url", server.url, "--source", "daw", "--event-id",
                     "mix-1", "session.exported", "project_id=ok", "mix_url=/mixes/a.wav")
    assert again.returncode == 0 and json.loads(again.stdout)["duplicate"] is True
    listed = agentbox(server, "runs", "--url", server.url).stdout.splitlines()
    assert listed[0].split() == ["WHEN", "PROJECT", "FILE", "REVIEW", "LUFS", "PEAK", "LRA",
                                 "ID"]
    row = listed[1].split()  # a run of another agent than the review: its state in a word
    assert row[1:3] == ["ok", "a.wav"] and row[3] == "done" and answer["run_id"][4:14] in row[-1]
    shown = json.loads(agentbox(server, "show", answer["run_id"], "--url", server.url,
                                "--json").stdout)
    assert [h["status"] for h in shown["history"]] == ["accepted", "processing", "succeeded"]
    readable = agentbox(server, "show", answer["run_id"], "--url", server.url).stdout
    assert f"run {answer['run_id']}  succeeded" in readable and "history:" in readable


def test_json_output_is_the_api_s_answer_byte_for_byte(server: Server) -> None:
    """The client reads answers into models; --json prints them as the API sent them:
    the same fields in the same order, nulls and all."""
    run_id = server.post(make_event(project_id="ok")).json()["run_id"]
    server.wait_terminal(run_id)
    for args, path, params in (
            (("show", run_id), f"/runs/{run_id}", {"history": "1"}),
            (("runs", "--limit", "5"), "/runs", {"limit": "5"}),
            (("callbacks", "list"), "/callbacks", {"limit": "20"})):
        printed = agentbox(server, *args, "--url", server.url, "--json")
        assert printed.returncode == 0, printed.stderr
        answered = server.client.get(path, params=params).json()
        shown = answered if args[0] == "show" else answered[path.rsplit("/", 1)[-1]]
        assert printed.stdout == json.dumps(shown, indent=2) + "\n", args
    sent = agentbox(server, "send", "--url", server.url, "--event-id", "pinned",
                    "session.exported", "project_id=ok", "mix_url=/mixes/a.wav")
    again = agentbox(server, "send", "--url", server.url, "--event-id", "pinned",
                     "session.exported", "project_id=ok", "mix_url=/mixes/a.wav")
    first, second = json.loads(sent.stdout), json.loads(again.stdout)
    assert list(first) == list(second) == ["status", "run_id", "duplicate", "status_url",
                                           "runs"]
    assert sent.stdout == json.dumps(first, separators=(",", ":")) + "\n"  # as it came
    assert second["duplicate"] is True and second["run_id"] == first["run_id"]


def test_send_refused_event_exits_non_zero(server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "session.exported", "project_id=ok")
    assert sent.returncode == 1
    assert json.loads(sent.stdout)["error_code"] == "invalid_event"


def test_send_a_prepared_file(server: Server, tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    event.write_text(json.dumps(make_event(project_id="ok")))
    sent = agentbox(server, "send", "--url", server.url, "--file", str(event))
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert server.wait_terminal(json.loads(sent.stdout)["run_id"])["status"] == "succeeded"


def test_dead_letters_and_replay(server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "session.exported",
                    "project_id=always-fail", "mix_url=/m.wav")
    run_id = json.loads(sent.stdout)["run_id"]
    server.wait_terminal(run_id)
    dead = agentbox(server, "dead-letters", "--url", server.url).stdout.splitlines()
    assert dead[0].split() == ["WHEN", "PROJECT", "FILE", "WHY", "ID"]
    assert "always-fail" in dead[1] and dead[1].split()[-1] == run_id[4:14]
    assert "agent_retryable_error: " in dead[1]
    replayed = agentbox(server, "replay", run_id, "--url", server.url)
    assert replayed.returncode == 0, replayed.stderr
    assert server.wait_terminal(run_id)["replays"] == 1
    missing = agentbox(server, "replay", "run_missing", "--url", server.url)
    assert missing.returncode != 0 and "No run id starts with 'run_missing'" in missing.stderr


def test_secret_and_token(server: Server) -> None:
    assert agentbox(server, "secret").stdout.strip() == "integration-test-secret"
    token = agentbox(server, "token").stdout.strip()
    assert token == (server.home / "config" / "agentbox" / "admin_token").read_text().strip()


def test_unreachable_server_is_a_clear_error(server: Server) -> None:
    sent = agentbox(server, "send", "--url", "http://127.0.0.1:9", "session.exported",
                    "project_id=ok", "mix_url=/m.wav")
    assert sent.returncode != 0 and "cannot reach agentbox" in sent.stderr


def test_verify_reports_ok_and_finds_damage(server: Server) -> None:
    run_id = server.post(make_event()).json()["run_id"]
    server.wait_terminal(run_id)
    ok = agentbox(server, "verify")
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": ok"), ok.stdout + ok.stderr
    server.stop()
    import sqlite3
    conn = sqlite3.connect(server.home / "data" / "agentbox.sqlite3")
    conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    conn.execute("INSERT INTO outbox (notification_id, run_id, status, destination, url, body,"
                 " created_at, ready) VALUES ('x:processing:0', 'x', 'processing', 'o', 'u',"
                 " '{}', 0, 1)")
    conn.commit()
    conn.close()
    damaged = agentbox(server, "verify")
    assert damaged.returncode == 1
    assert "events without any run" in damaged.stdout
    assert "callback notifications whose run is missing: x:processing:0" in damaged.stdout


# -- send for export scripts ------------------------------------------------------------------


def test_send_with_flags_and_wait(server: Server, tmp_path: Path) -> None:
    mix = tmp_path / "night-drive.wav"
    mix.write_bytes(b"not audio; the scripted agent does not read it")
    args = ["send", "--url", server.url, "--type", "session.exported", "--project", "ok",
            "--mix", str(mix), "--profile", "club", "--event-id", "export-7", "--wait", "--json"]
    done = agentbox(server, *args)
    assert done.returncode == 0, done.stderr
    answer, run = _two_json_documents(done.stdout)
    assert answer["status"] == "accepted" and run["status"] == "succeeded"
    assert run["event_id"] == "export-7"
    again = agentbox(server, *args)  # re-running the script: a duplicate, not a new run
    assert again.returncode == 0 and _two_json_documents(again.stdout)[0]["duplicate"] is True
    named = agentbox(server, "send", "--url", server.url, "--type", "session.exported",
                     "--project", "Night Drive (final)", "--mix", str(mix), "--wait", "--json")
    assert named.returncode == 0, named.stderr  # the README's hooks pass names like this
    assert _two_json_documents(named.stdout)[1]["result"]["project_id"] == "Night Drive (final)"
    failed = agentbox(server, "send", "--url", server.url, "--type", "session.exported",
                      "--project", "permanent", "--mix", str(mix), "--wait", "--json")
    assert failed.returncode == 4
    assert _two_json_documents(failed.stdout)[1]["status"] == "failed_permanent"
    told = agentbox(server, "send", "--url", server.url, "--type", "session.exported",
                    "--project", "permanent", "--mix", str(mix), "--wait")
    assert told.returncode == 4  # for people: the status and the error on one line
    assert "failed_permanent: " in told.stdout.splitlines()[-1]


def test_show_prints_a_run_s_text_on_one_line(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    forged = tmp_path / "broken.wav\nagentbox: all runs succeeded"
    forged.write_text("not audio")  # there (so taken), and its review fails naming it
    run_id = server.post(make_event(payload={"project_id": "p", "mix_url": str(forged)})
                         ).json()["run_id"]
    assert server.wait_terminal(run_id)["error_code"] == "mix_unreadable"
    shown = agentbox(server, "show", run_id, "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    # (wrapped at word boundaries to the terminal's width: read as one text)
    assert "broken.wav\\nagentbox: all runs succeeded" in " ".join(shown.stdout.split())
    assert not any(line.startswith("agentbox:") for line in shown.stdout.splitlines())


def test_dead_letters_leaves_out_those_discarded_on_the_page(server: Server) -> None:
    kept, dropped = (server.post(make_event(project_id="always-fail")).json()["run_id"]
                     for _ in range(2))
    for run_id in (kept, dropped):
        assert server.wait_terminal(run_id, timeout=30)["status"] == "dead_lettered"
    discarded = server.client.post("/ui/discard", data={
        "csrf": server.csrf(), "run_id": dropped, "reason": "a test render"})
    assert discarded.status_code == 303
    listed = agentbox(server, "dead-letters", "--url", server.url, "--json")
    assert listed.returncode == 0 and [r["run_id"] for r in json.loads(listed.stdout)] == [kept]
    every = agentbox(server, "runs", "--url", server.url, "--status", "dead_lettered", "--json")
    assert {r["run_id"] for r in json.loads(every.stdout)} == {kept, dropped}  # still dead
    bad = server.client.get("/runs", params={"discarded": "maybe"})
    assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_query"
    # replayed, it is no longer set aside: failing again, it waits for a decision again
    assert agentbox(server, "replay", dropped, "--url", server.url).returncode == 0
    assert server.wait_terminal(dropped, timeout=30)["status"] == "dead_lettered"
    again = agentbox(server, "dead-letters", "--url", server.url, "--json")
    assert dropped in {r["run_id"] for r in json.loads(again.stdout)}


def test_send_waits_out_a_busy_server_then_gives_up(server_factory: Any, tmp_path: Path
                                                     ) -> None:
    server = server_factory({"AGENTBOX_MAX_PENDING": "1"}).start()
    assert server.post(make_event(project_id="sleep-30")).status_code == 202
    busy = agentbox(server, "send", "--url", server.url, "--retries", "1", "session.exported",
                    "project_id=ok", "mix_url=/m.wav")
    assert busy.returncode == 3
    assert "429 too_many_pending; trying again" in busy.stderr and "giving up" in busy.stderr
    down = agentbox(server, "send", "--url", "http://127.0.0.1:9", "--retries", "0",
                    "session.exported", "project_id=ok", "mix_url=/m.wav")
    assert down.returncode == 3 and "cannot reach agentbox" in down.stderr


def _two_json_documents(text: str) -> list[Any]:
    decoder = json.JSONDecoder()
    found, index = [], 0
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        value, index = decoder.raw_decode(text, index)
        found.append(value)
    return found


# -- secret rotation -----------------------------------------------------------------------------


def test_secret_rotation_without_a_restart(server_factory: Any) -> None:
    server = server_factory()
    del server.env["AGENTBOX_WEBHOOK_SECRET"]  # kept in the config dir instead
    server.start()
    old = agentbox(server, "secret").stdout.strip()
    assert server.post(make_event(), secret=old).status_code == 202
    rotated = agentbox(server, "secret", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = agentbox(server, "secret").stdout.strip()
    assert new != old
    wait_until(lambda: server.post(make_event(), secret=new).status_code == 202, 10,
               "the new secret to verify")
    assert server.post(make_event(), secret=old).status_code == 202  # still, until retired
    retired = agentbox(server, "secret", "retire")
    assert retired.returncode == 0 and "retired 1" in retired.stdout
    wait_until(lambda: server.post(make_event(), secret=old).status_code == 401, 10,
               "the old secret to be refused")
    assert server.post(make_event(), secret=new).status_code == 202
    assert old not in server.log_path.read_text() and new not in server.log_path.read_text()
    refused = agentbox(server, "secret", "rotate")
    assert refused.returncode == 0  # a file-kept secret can rotate again
    server.env["AGENTBOX_WEBHOOK_SECRET"] = "from-env"
    from_env = agentbox(server, "secret", "rotate")
    assert from_env.returncode == 1 and "AGENTBOX_WEBHOOK_SECRET" in from_env.stderr


# -- watching an export folder ---------------------------------------------------------------------


def test_watch_sends_each_finished_file_once(server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "old.wav").write_bytes(b"already there")
    watcher = subprocess.Popen(
        [sys.executable, "-m", "agentbox", "watch", str(folder), "--url", server.url,
         "--settle", "0.6", "--interval", "0.1", "--project", "ok"],
        env=server.env, cwd=server.home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watcher.stdout.readline, "")),
                              daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        # Its first scan is done (what is there then counts as already there).
        wait_until(lambda: any(line.startswith("agentbox: watching") for line in lines), 30,
                   "the watcher to start")
        mix = folder / "night-drive.wav"
        with open(mix, "wb") as f:  # a render that takes a while
            for _ in range(5):
                f.write(b"x" * 10_000)
                f.flush()
                time.sleep(0.2)
        wait_until(lambda: any(line.startswith("night-drive.wav: accepted") for line in lines),
                   20, "the finished file to be sent")
        run_id = next(line for line in lines if line.startswith("night-drive.wav: accepted")
                      ).split()[-1]
        run = server.wait_terminal(run_id)
        assert run["event_id"].startswith("watch-") and run["source"] == "watch"
        (mix.parent / "notes.txt").write_text("not audio")
        os.utime(mix)  # written again, the same bytes: a render of its own, a new export
        wait_until(lambda: sum(line.startswith("night-drive.wav: accepted")
                               for line in lines) == 2, 20, "the new render to be sent")
        assert sum("accepted" in line for line in lines) == 2
        assert not any(line.startswith("old.wav") for line in lines)
    finally:
        watcher.terminate()
        watcher.wait(10)
        reader.join(10)
        watcher.stdout.close()  # type: ignore[union-attr]
    again = agentbox(server, "watch", str(folder), "--url", server.url, "--settle", "0.2",
                     "--interval", "0.1", "--existing", "--once", "--project", "ok")
    assert again.returncode == 0, again.stderr
    assert "night-drive.wav: sent before, its review is run_" in again.stdout  # no new run
    assert "old.wav: accepted" in again.stdout


def test_watch_once_gives_up_on_an_unreachable_agentbox(server: Server, tmp_path: Path
                                                        ) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "My Song (final mix).wav").write_bytes(b"rendered")
    (folder / "b-side.wav").write_bytes(b"rendered too")
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{unused.getsockname()[1]}"
    started = time.monotonic()
    gone = agentbox(server, "watch", str(folder), "--url", nowhere, "--settle", "0.2",
                    "--interval", "0.1", "--existing", "--once", "--retries", "2")
    assert gone.returncode == 3, gone.stderr  # as `send`: unreachable
    assert "My Song (final mix).wav: not sent (agentbox unavailable)" in gone.stderr
    assert "b-side.wav: not sent (agentbox unavailable)" in gone.stderr
    assert gone.stderr.count("trying again") == 2  # one file's retries; not the next's
    assert time.monotonic() - started < 30
    bad = agentbox(server, "watch", str(folder), "--once", "--retries", "-1")
    assert bad.returncode == 2 and "--retries" in bad.stderr
    sent = agentbox(server, "watch", str(folder), "--url", server.url, "--settle", "0.2",
                    "--interval", "0.1", "--existing", "--once")
    assert sent.returncode == 0, sent.stderr
    said = next(line for line in sent.stdout.splitlines() if line.startswith("My Song"))
    run = server.wait_terminal(said.split()[-1])
    assert run["status"] == "succeeded", run  # the project named as the file is
    assert run["result"]["project_id"] == "My Song (final mix)"


def test_watcher_waits_for_a_file_to_settle(tmp_path: Path) -> None:
    from agentbox.desktop.watch import Watcher

    now = [100.0]
    watcher = Watcher(tmp_path, settle=2.0, clock=lambda: now[0])
    assert watcher.poll() == []
    mix = tmp_path / "a.flac"
    mix.write_bytes(b"1")
    assert watcher.poll() == []  # just seen
    now[0] += 1.0
    mix.write_bytes(b"12")  # still growing
    os.utime(mix, ns=(1, 1))
    assert watcher.poll() == []
    now[0] += 1.9
    assert watcher.poll() == [] and watcher.busy
    now[0] += 0.2
    assert watcher.poll() == [mix]
    watcher.sent(mix)
    now[0] += 5
    assert watcher.poll() == [] and not watcher.busy


# -- send --wait: how it follows a run ------------------------------------------------------


def test_send_wait_outlasts_a_restart_of_agentbox(server: Server) -> None:
    """agentbox gone in the middle of a wait (killed, restarted by the service) is
    waited for; the run it takes up again is told when it ends, exit status 0."""
    said: list[str] = []
    with subprocess.Popen(
            [sys.executable, "-m", "agentbox", "send", "--url", server.url, "--wait",
             "--json", "session.exported", "project_id=sleep-2", "mix_url=/mixes/a.wav"],
            env=server.env, cwd=server.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True) as waiting:
        assert waiting.stderr is not None and waiting.stdout is not None
        errors = waiting.stderr
        reader = threading.Thread(target=lambda: said.extend(errors), daemon=True)
        reader.start()
        try:
            run_id = json.loads(waiting.stdout.readline())["run_id"]
            wait_until(lambda: server.run(run_id)["status"] == "processing", 30,
                       "the run to start")
            server.kill9()
            wait_until(lambda: any("waiting for it" in line for line in said), 30,
                       "send --wait to notice agentbox gone")
            server.start()  # the run, left processing, is taken up again
            assert waiting.wait(60) == 0, "".join(said)
        finally:
            if waiting.poll() is None:
                waiting.kill()
            reader.join(10)
    assert any("reachable again" in line for line in said), said
    assert server.run(run_id)["status"] == "succeeded"


def test_send_wait_gives_up_on_an_agentbox_gone_for_good_with_status_3(
        monkeypatch: Any) -> None:
    import click

    from agentbox import cli, client

    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        # The client's, which cli.follow reads as it follows (the cli names it too).
        monkeypatch.setattr(client, "FOLLOW_UNREACHABLE_SECONDS", 0.5)
        assert cli.FOLLOW_UNREACHABLE_SECONDS == 0.5
        started = time.monotonic()
        try:
            cli.follow(url, "run_gone", timeout=60)
        except click.ClickException as exc:
            assert exc.exit_code == cli.EXIT_UNAVAILABLE == 3
            assert "cannot reach agentbox" in exc.format_message()
        else:
            raise AssertionError("follow returned while agentbox was unreachable")
    assert 0.5 <= time.monotonic() - started < 10


def test_send_wait_looks_less_often_as_the_run_goes_on(server: Server) -> None:
    """Beside a DAW a long wait must cost next to nothing: one kept-alive connection,
    the looks spaced out to one a second (they were 5 a second, 19 % of a core)."""
    from agentbox import cli
    from agentbox.client import Client

    run_id = server.post(make_event(payload={"project_id": "sleep-4",
                                             "mix_url": "/mixes/a.wav"})).json()["run_id"]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    with Client(server.url, admin_token=server.admin_token()) as box:  # the server's user
        run = cli.follow(box, run_id, timeout=60, sleep=sleep)
    assert run is not None and run["status"] == "succeeded"
    assert slept[0] == cli.FOLLOW_FIRST_SECONDS  # a short review is told at once
    assert slept == sorted(slept) and max(slept) <= cli.FOLLOW_MAX_SECONDS
    assert len(slept) <= 10  # about 4 s: 0.1, 0.15, 0.23 ... 1, 1 (20 at 0.2 s before)


def test_secret_without_a_configuration_says_where_it_looked(tmp_path: Path) -> None:
    """It once made a secret there and then, which a server started under another
    configuration never used: senders signed with it and were refused."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")}
    env |= {"PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "HOME": str(tmp_path)}

    def secret(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentbox", "secret", *args], env=env,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    kept = tmp_path / "config" / "agentbox" / "webhook_secret"
    none = secret()
    assert none.returncode == 1 and none.stdout == ""
    assert "AGENTBOX_WEBHOOK_SECRET (not set)" in none.stderr
    assert str(tmp_path / "config" / "agentbox" / "agentbox.toml") in none.stderr
    assert str(kept) in none.stderr and "agentbox serve makes it" in none.stderr
    assert not kept.exists()
    assert secret("--path").stdout.strip() == str(kept) and not kept.exists()
    kept.parent.mkdir(parents=True)
    kept.write_text("whsec_made-by-serve\n")
    assert secret().stdout.strip() == "whsec_made-by-serve"
    env["AGENTBOX_WEBHOOK_SECRET"] = "from-the-environment"
    assert secret().stdout.strip() == "from-the-environment"


def test_token_never_makes_one_a_server_would_not_take(server_factory: Any,
                                                       tmp_path: Path) -> None:
    """`agentbox token` with no server and no token made one, which a server then
    started with AGENTBOX_ADMIN_TOKEN did not know. Now: none made, where it looked
    said; a running server that refuses the one found is said; its own is printed."""
    server = server_factory({"AGENTBOX_ADMIN_TOKEN": "t" * 40})
    kept = Path(server.env["XDG_CONFIG_HOME"]) / "agentbox" / "admin_token"
    plain = {k: v for k, v in server.env.items() if k != "AGENTBOX_ADMIN_TOKEN"}

    def token(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentbox", "token"], env=env,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    none = token(plain)
    assert none.returncode == 1 and none.stdout == ""
    assert f"no admin token yet: none in AGENTBOX_ADMIN_TOKEN, none in {kept}" in none.stderr
    assert not kept.exists()
    server.start()  # (its user's token file is made by the test's start: another token)
    assert kept.exists() and kept.read_text().strip() != "t" * 40
    refused = token(plain)
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"the agentbox at {server.url} does not take the token in {kept}" in refused.stderr
    assert token(server.env).stdout.strip() == "t" * 40


def test_send_refuses_a_field_the_payload_does_not_have_before_sending(
        server: Server) -> None:
    sent = agentbox(server, "send", "--url", server.url, "session.exported",
                    "project_id=ok", "mix_ulr=/m.wav")
    assert sent.returncode == 2 and sent.stdout == ""
    assert "session.exported has no field 'mix_ulr'; its payload's fields: project_id, " \
        "mix_url" in sent.stderr
    assert server.client.get("/runs").json()["runs"] == []  # nothing was sent
    mix = server.home / "night-drive.wav"
    mix.write_bytes(b"RIFF")
    as_file = agentbox(server, "send", str(mix), "genre=rock", "projekt=x")
    assert as_file.returncode == 2 and "has no field 'projekt'" in as_file.stderr
