"""The built-in review against ffmpeg's ebur128 filter on the same files: time from
sending the event to `succeeded`, and the readings (integrated loudness, loudness range,
true peak) side by side. See agentbox/docs/performance.md, "The review's speed".

    .venv/bin/python scripts/review_speed.py [--minutes 5,3,10] [--rounds 3]
    .venv/bin/python scripts/review_speed.py --archive --minutes 5 --rounds 8
    .venv/bin/python scripts/review_speed.py --minutes 5 --rounds 6 --against OTHER

It writes stereo 48 kHz 24-bit mixes (pink-ish noise with a moving envelope and a
kick, soft-limited) to a temporary directory, starts `agentbox serve` on a free
loopback port, reviews one short file first (the analysis process is started
with the server and kept warm between reviews), then alternates agentbox and
ffmpeg on each file, `--rounds` times, and prints the medians.

`--against OTHER` (the root of another copy of agentbox's source, say the code
before a change, exported with `git archive`) starts a second server that runs
that code, and each round reviews the file with both (which goes first
alternates) before ffmpeg: the two codes' times and their ratio, measured in the
same rounds, hold on a busy machine better than times measured apart.

`--archive` measures what keeping the reviewed bytes costs instead: two servers,
the archive on (AGENTBOX_ARCHIVE=1, the default) and off, review the same file in
turn (which goes first alternates from round to round), and each round's times
are printed with the machine's load average, then the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import soundfile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from agentbox.signing import sign_headers  # noqa: E402

SECRET = "review-speed-secret"
ADMIN_TOKEN = "review-speed-admin-token"  # reading runs needs it on loopback too
CPU: list[float] = []  # ffmpeg's CPU seconds per run
RATE = 48_000


def write_mix(path: Path, minutes: float) -> Path:
    rng = np.random.default_rng(1)
    with soundfile.SoundFile(path, "w", RATE, 2, "PCM_24") as out:
        for start in range(0, int(minutes * 60 * RATE), RATE * 10):
            n = RATE * 10
            spectrum = np.fft.rfft(rng.normal(size=(n, 2)), axis=0)
            freqs = np.fft.rfftfreq(n, 1 / RATE)
            spectrum[1:] /= np.sqrt(freqs[1:, None])
            spectrum[0] = 0
            noise = np.fft.irfft(spectrum, n, axis=0)
            noise /= np.max(np.abs(noise))
            t = (start + np.arange(n)) / RATE
            envelope = 0.5 + 0.4 * np.sin(2 * np.pi * t / 37.0)
            kick = np.sin(2 * np.pi * 55 * t) * np.exp(-(t % 0.5) * 12)
            out.write((np.tanh(1.6 * (0.35 * noise * envelope[:, None] + 0.3 * kick[:, None]))
                       * 0.9).astype(np.float32))
    old = time.time() - 3600  # settled: not being written
    os.utime(path, (old, old))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def own_cpu(pid: int) -> float:
    """CPU seconds of a process itself so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu(pid: int) -> float:
    """CPU seconds of a process's children so far (Linux /proc; 0 elsewhere): the
    analysis process's, for the server."""
    total = 0.0
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            with open(f"/proc/{child}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def review(client: httpx.Client, path: Path) -> tuple[float, dict[str, float | None]]:
    event_id = uuid.uuid4().hex
    event = {"schema_version": "v1", "event_id": event_id,
             "idempotency_key": f"speed:session.exported:{event_id}",
             "event_type": "session.exported",
             "source": "speed", "timestamp": "2026-07-27T15:42:00Z",
             # a project of its own each time: the same bytes again in one project are
             # its latest export, not a new review (docs/cli.md, what counts as a render)
             "payload": {"project_id": f"{path.stem}-{event_id[:8]}", "mix_url": str(path)}}
    body = json.dumps(event).encode()
    headers = {"Content-Type": "application/json", **sign_headers(SECRET, body, int(time.time()))}
    started = time.monotonic()  # the musician's wait: from sending the render (its
    # admission reads the file's bytes before the 202: docs/cli.md, what counts as a render)
    response = client.post("/webhooks/events", content=body, headers=headers)
    assert response.status_code == 202, response.text
    run_id = response.json()["run_id"]
    while True:
        run = client.get(f"/runs/{run_id}").json()
        if run["status"] == "succeeded":
            elapsed = time.monotonic() - started
            m = run["result"]["metrics"]
            return elapsed, {"I": m["integrated_lufs"], "LRA": m["loudness_range_lu"],
                             "TP": m["true_peak_dbtp"]}
        if run["terminal"]:
            raise SystemExit(f"the review failed: {run}")
        time.sleep(0.05)  # asking more often takes CPU from the analysis it waits for


def ffmpeg(path: Path, niceness: int) -> tuple[float, dict[str, float | None]]:
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(["nice", "-n", str(niceness), "ffmpeg", "-nostats", "-hide_banner",
                           "-i", str(path), "-af", "ebur128=peak=true", "-f", "null", "-"],
                          capture_output=True, text=True, check=True)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    summary = done.stderr.rsplit("Summary:", 1)[1]

    def figure(name: str) -> float | None:
        found = re.search(rf"{name}:\s+(-?[\d.]+)", summary)
        return float(found.group(1)) if found else None

    return elapsed, {"I": figure("I"), "LRA": figure("LRA"), "TP": figure("Peak")}


def median(timed: list[tuple[float, dict[str, float | None]]]) -> float:
    return statistics.median(seconds for seconds, _ in timed)


def start(home: Path, source: Path = ROOT,
          **environ: str) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    """`agentbox serve` (the code in `source`) with its data in `home`, once it
    answers, and a client of it."""
    port = free_port()
    env = {**os.environ, "AGENTBOX_DATA_DIR": str(home / "data"),
           "AGENTBOX_WEBHOOK_SECRET": SECRET, "AGENTBOX_AGENTS": "",
           "XDG_CONFIG_HOME": str(home / "config"), "PYTHONPATH": str(source),
           "AGENTBOX_ADMIN_TOKEN": ADMIN_TOKEN, **environ}
    server = subprocess.Popen([sys.executable, "-m", "agentbox", "serve", "--port",
                               str(port)], env=env, cwd=home,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120, trust_env=False,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})  # reads need it
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.get("/healthz").status_code == 200:
                return server, client
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.terminate()
            raise SystemExit("agentbox did not start")
        time.sleep(0.1)


def archive_cost(home: Path, minutes: float, rounds: int) -> None:
    """The archive on against off, alternated, on the same file."""
    path = write_mix(home / f"mix-{minutes:g}min.wav", minutes)
    servers = {}
    try:
        for name, on in (("on", "1"), ("off", "0")):
            (home / f"{name}-{minutes:g}").mkdir()
            servers[name] = start(home / f"{name}-{minutes:g}", AGENTBOX_ARCHIVE=on)
            review(servers[name][1], write_mix(home / f"warm-up-{name}.wav", 0.1))
        times: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}  # the server's and its analysis'
        for n in range(rounds):
            order = ("on", "off") if n % 2 == 0 else ("off", "on")
            for name in order:
                pid = servers[name][0].pid
                before = children_cpu(pid) + own_cpu(pid)
                times[name].append(review(servers[name][1], path)[0])
                time.sleep(0.5)  # the kept copy's flush and rename, in the background
                cpu[name].append(children_cpu(pid) + own_cpu(pid) - before)
            print(f"round {n + 1}: archive on {times['on'][-1]:.2f} s "
                  f"(CPU {cpu['on'][-1]:.2f} s), off {times['off'][-1]:.2f} s "
                  f"(CPU {cpu['off'][-1]:.2f} s); load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        on_cpu, off_cpu = statistics.median(cpu["on"]), statistics.median(cpu["off"])
        print(f"{minutes:g} min stereo 48 kHz 24-bit, medians of {rounds}: archive on "
              f"{on:.2f} s, off {off:.2f} s: on/off {on / off:.3f}; CPU on {on_cpu:.2f} s, "
              f"off {off_cpu:.2f} s: on/off {on_cpu / off_cpu:.3f}", flush=True)
    finally:
        for server, client in servers.values():
            client.close()
            server.terminate()
            server.wait(30)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def against(home: Path, other: Path, minutes_list: list[float], rounds: int) -> None:
    """This code and `other`'s, each in its own server, on the same file in the same
    rounds (who goes first alternating), then ffmpeg at nice 0."""
    servers = {}
    try:
        for name, source in (("this", ROOT), ("other", other)):
            (home / name).mkdir()
            servers[name] = start(home / name, source)
            review(servers[name][1], write_mix(home / f"warm-up-{name}.wav", 0.1))
        for minutes in minutes_list:
            path = write_mix(home / f"mix-{minutes:g}min.wav", minutes)
            times: dict[str, list[float]] = {"this": [], "other": [], "ffmpeg": []}
            cpu: dict[str, list[float]] = {"this": [], "other": []}  # analysis processes'
            for n in range(rounds):
                for name in ("this", "other") if n % 2 == 0 else ("other", "this"):
                    before = children_cpu(servers[name][0].pid)
                    times[name].append(review(servers[name][1], path)[0])
                    cpu[name].append(children_cpu(servers[name][0].pid) - before)
                times["ffmpeg"].append(ffmpeg(path, 0)[0])
                print(f"round {n + 1}: this {times['this'][-1]:.2f} s (CPU {cpu['this'][-1]:.2f}), "
                      f"other {times['other'][-1]:.2f} s (CPU {cpu['other'][-1]:.2f}), ffmpeg "
                      f"(nice 0) {times['ffmpeg'][-1]:.2f} s (CPU {CPU[-1]:.2f}); this/ffmpeg "
                      f"{times['this'][-1] / times['ffmpeg'][-1]:.2f}, other/ffmpeg "
                      f"{times['other'][-1] / times['ffmpeg'][-1]:.2f}; load average {load()}",
                      flush=True)
            this, that, theirs = (statistics.median(times[k]) for k in ("this", "other", "ffmpeg"))
            print(f"{minutes:g} min stereo 48 kHz 24-bit, medians of {rounds}: this {this:.2f} s, "
                  f"other {that:.2f} s (this/other {this / that:.3f}), ffmpeg {theirs:.2f} s; "
                  f"this/ffmpeg {this / theirs:.2f}, other/ffmpeg {that / theirs:.2f}; CPU this "
                  f"{statistics.median(cpu['this']):.2f} s, other "
                  f"{statistics.median(cpu['other']):.2f} s, ffmpeg {statistics.median(CPU):.2f} s",
                  flush=True)
            CPU.clear()
    finally:
        for server, client in servers.values():
            client.close()
            server.terminate()
            server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", default="5,3,10")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--archive", action="store_true",
                        help="the review with the archive of exports on against off")
    parser.add_argument("--against", type=Path, metavar="OTHER",
                        help="another copy of agentbox's source, reviewed in the same rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentbox-speed-") as tmp:
        home = Path(tmp)
        if args.against:
            against(home, args.against.resolve(),
                    [float(m) for m in args.minutes.split(",")], args.rounds)
            return
        if args.archive:
            for minutes in (float(m) for m in args.minutes.split(",")):
                archive_cost(home, minutes, args.rounds)
            return
        server, client = start(home)
        try:
            review(client, write_mix(home / "warm-up.wav", 0.1))
            for minutes in (float(m) for m in args.minutes.split(",")):
                path = write_mix(home / f"mix-{minutes:g}min.wav", minutes)
                ours, low, normal, our_cpu = [], [], [], []
                for _ in range(args.rounds):  # alternated
                    cpu = children_cpu(server.pid)
                    ours.append(review(client, path))
                    our_cpu.append(children_cpu(server.pid) - cpu)
                    low.append(ffmpeg(path, 10))  # the analysis process's priority
                    normal.append(ffmpeg(path, 0))
                    print(f"round {len(ours)}: agentbox {ours[-1][0]:.2f} s, ffmpeg at nice 10 "
                          f"{low[-1][0]:.2f} s, at nice 0 {normal[-1][0]:.2f} s: "
                          f"{ours[-1][0] / normal[-1][0]:.2f}x; load average {load()}",
                          flush=True)
                print(f"{minutes:g} min stereo 48 kHz 24-bit, medians of {args.rounds}: "
                      f"agentbox 202->succeeded {median(ours):.2f} s {ours[-1][1]}; "
                      f"ffmpeg ebur128=peak=true at nice 10 {median(low):.2f} s, "
                      f"at nice 0 {median(normal):.2f} s {normal[-1][1]}; CPU: analysis "
                      f"{statistics.median(our_cpu):.2f} s, ffmpeg {statistics.median(CPU):.2f} s; "
                      f"agentbox/ffmpeg (nice 0) {median(ours) / median(normal):.2f}", flush=True)
                CPU.clear()
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
