"""scripts/bench --peers --against DIR: this checkout's agentbox and an older one's, in
the same session, each against the peers measured in the same rounds.

DIR is the root of another agentbox checkout (`git worktree add DIR COMMIT`); its
own scripts/_setup makes or updates its own venv (DIR/.venv), and its agentbox
serves with its own scripts (its no-op agent). On this machine's load a figure
alone says little: what an A/B reads is each agentbox's end to end over each
peer's in the same round, and this agentbox's over the older one's.

On SQLite, at each concurrency, in rounds: this agentbox (`agentbox`), the older
one (`against`), huey (SqliteHuey + consumer) and the reference design (Redis AOF
always + worker), on the same pre-signed events with the same wrk load, each on
a fresh store, the order turned each round so a drift of the machine's speed
weighs on all alike. The load average is recorded before each phase. With
--database-url the same alternation runs among the PostgreSQL peers
(bench_pg.py: `against xN` beside `agentbox xN`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_peers

PEERS = {"huey": ("huey", "sqlite"), "reference": ("reference", "aof")}
TARGETS = ["agentbox", "against", *PEERS]
NAMES = {"agentbox": "agentbox (this checkout)", "against": "agentbox (--against)",
         "huey": "Starlette + huey SqliteHuey + consumer",
         "reference": "reference design, Redis AOF always + worker"}


def prepare(checkout: Path, postgres: bool) -> Path:
    """The checkout's root, its venv made or brought up to date by its own scripts/_setup
    (with the extras the bench needs of it). Exits 2, measuring nothing, if DIR is not
    an agentbox checkout or its set-up fails."""
    checkout = checkout.resolve()
    setup = checkout / "scripts" / "_setup"
    if not setup.is_file():
        print(f"scripts/bench --against: {checkout} has no scripts/_setup; give the root of an "
              "agentbox checkout (e.g. git worktree add DIR COMMIT); nothing was measured",
              file=sys.stderr)
        raise SystemExit(2)
    extras = ["postgres"] if postgres else []
    print(f"--against: setting up {checkout}/.venv with its scripts/_setup ...", file=sys.stderr)
    done = subprocess.run([sys.executable, str(setup), *extras], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"scripts/bench --against: {setup} failed:\n{done.stderr[-3000:]}\nnothing was "
              "measured", file=sys.stderr)
        raise SystemExit(2)
    return checkout


def main(bench: Any, args: Any) -> None:
    """--peers --against DIR on SQLite: the rounds, the table, the report."""
    bench_peers.require()
    levels = [int(c) for c in (args.concurrency or "16,64").split(",")]
    work = Path(tempfile.mkdtemp(prefix="agentbox-bench-"))
    print(f"work directory (removed if the run passes): {work}", file=sys.stderr)
    report: dict[str, Any] = {"duration_s": args.duration, "log_level": args.log_level,
                              "rounds": args.rounds, "against": str(args.against),
                              "load": [], "cpus": os.cpu_count(),
                              "started": time.strftime("%FT%TZ", time.gmtime())}
    failed = run(bench, work, levels, args.duration, args.rounds, args.against, report)
    report["ab"] = summary(report["load"], levels)
    print_summary(report)
    bench.finish(report, args.json, work, failed)


def run(bench: Any, work: Path, levels: list[int], duration: float, rounds: int,
        checkout: Path, report: dict[str, Any]) -> bool:
    """Every target at every concurrency, `rounds` times; True if anything failed."""
    count = int(bench.MAX_EVENTS_PER_SECOND * duration)
    failed = False
    for round_ in range(1, rounds + 1):
        order = TARGETS[round_ - 1:] + TARGETS[:round_ - 1]
        for connections in levels:
            events = bench.write_events(work, f"against-{connections}-{round_}", count)
            for target in order:
                load = os.getloadavg()[0]
                print(f"round {round_}, {connections} connections: {target} "
                      f"(load average {load:.2f}) ...", file=sys.stderr)
                row = phase(bench, work, events, connections, duration, target, round_,
                            checkout)
                row.update(target=target, round=round_, load_average=round(load, 2))
                report["load"].append(row)
                failed |= set(row["statuses"]) != {"202"} or any(row["errors"].values())
                failed |= not row["store_check"]["ok"]
            events.unlink()
    return failed


def phase(bench: Any, work: Path, events: Path, connections: int, duration: float,
          target: str, round_: int, checkout: Path) -> dict[str, Any]:
    if target in PEERS:
        return bench_peers.peer_phase(bench, work, events, connections, duration,
                                      *PEERS[target], tag=f"-{round_}")
    row = bench.load_phase("agentbox", work / f"{target}-{connections}-{round_}", events,
                           connections, duration,
                           checkout=checkout if target == "against" else None)
    # Its load phase waits for every run to finish after the load: end to end is the
    # accepted runs over the load and that drain (as bench_peers.summary counts it).
    row["completed_per_s"] = round(row["accepted_per_s"] * duration
                                   / (duration + row["drain_after_load_s"]))
    return row


def summary(rows: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    """Medians over the rounds; for each agentbox, its end to end over each peer's in the
    same round, and this one's over the older one's."""
    out = []
    for connections in levels:
        for target in TARGETS:
            mine = [r for r in rows if r["target"] == target and r["connections"] == connections]
            if not mine:
                continue
            entry: dict[str, Any] = {
                "system": NAMES[target], "target": target, "connections": connections,
                "rounds": len(mine),
                "accepted_per_s": statistics.median(r["accepted_per_s"] for r in mine),
                "completed_per_s": statistics.median(r["completed_per_s"] for r in mine),
                "p99_ms": statistics.median(r["p99_ms"] for r in mine),
                "cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in mine),
                "load_averages": [r["load_average"] for r in mine],
            }
            if target not in PEERS:
                for other in [*PEERS, *(["against"] if target == "agentbox" else [])]:
                    entry[f"x_{other}"] = ratios(rows, mine, other, connections)
            out.append(entry)
    return out


def ratios(rows: list[dict[str, Any]], mine: list[dict[str, Any]], other: str,
           connections: int) -> list[float]:
    """Each of `mine`'s end to end over `other`'s in the same round."""
    found = []
    for row in mine:
        theirs = next((r for r in rows if r["target"] == other and r["round"] == row["round"]
                       and r["connections"] == connections), None)
        if theirs and theirs["completed_per_s"]:
            found.append(round(row["completed_per_s"] / theirs["completed_per_s"], 2))
    return found


def print_summary(report: dict[str, Any]) -> None:
    print(f"\nthis checkout against {report['against']} and the peers (same rounds, same "
          "events, same wrk load; medians of the rounds, ratios per round):\n")
    print(f"{'system':<44} {'conns':>5} {'accepted/s':>10} {'end-to-end/s':>12} "
          f"{'p99 ms':>7} {'x huey':>16} {'x reference':>16} {'x --against':>16}  load averages")
    for entry in report["ab"]:
        def each(key: str, entry: dict[str, Any] = entry) -> str:
            return "/".join(map(str, entry.get(key, []))) or "-"

        print(f"{entry['system']:<44} {entry['connections']:>5} "
              f"{entry['accepted_per_s']:>10.0f} {entry['completed_per_s']:>12.0f} "
              f"{entry['p99_ms']:>7.1f} {each('x_huey'):>16} {each('x_reference'):>16} "
              f"{each('x_against'):>16}  {'/'.join(map(str, entry['load_averages']))}")
