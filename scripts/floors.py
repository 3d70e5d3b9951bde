"""scripts/floors: what each part of agentbox's pipeline costs, as the ratio to the
ceiling that agentbox reaches with it taken out (scripts/bench_floor.py).

Each round measures the ceiling, then agentbox whole and with each floor, each on
a fresh server with its own pre-signed events (wrk, 127.0.0.1 only); the
report gives each floor's median over the rounds of accepted/s ÷ the ceiling's
in the same round, and CPU per request ÷ the ceiling's. No store check: with
parts taken out, the store is not what a 202 promises.

    scripts/floors --rounds 3 --concurrency 1,16,64 --log-level info
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench

FLOORS = {"whole": "", "no runs": "no-runs", "no SQL": "no-sql",
          "no SQL, no runs": "no-sql,no-runs"}


def measure(kind: str, work: Path, name: str, floor: str, connections: list[int],
            duration: float) -> dict[int, dict[str, float]]:
    server = bench.Server(kind, work / name, floor=floor)
    found = {}
    try:
        for c in connections:
            warm = bench.write_events(work, f"{name}-warm-{c}", 2 * bench.MAX_EVENTS_PER_SECOND)
            bench.run_wrk(server.url, warm, c, 2)
            events = bench.write_events(work, f"{name}-{c}",
                                        round(duration * bench.MAX_EVENTS_PER_SECOND))
            monitor = bench.Monitor(server.process.pid)
            monitor.start()
            result = bench.run_wrk(server.url, events, c, duration)
            monitor.finish()
            if set(result["statuses"]) != {"202"}:
                raise SystemExit(f"{name} at {c} connections answered {result['statuses']}")
            found[c] = {"per_second": result["per_second"], "p50_ms": result["p50_us"] / 1000,
                        "cpu_us": bench.us_per_request(monitor.cpu_seconds, result["statuses"])}
    finally:
        server.stop()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--duration", type=float, default=6)
    parser.add_argument("--log-level", default="info",
                        help="agentbox's (default info: the default configuration)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    connections = [int(c) for c in args.concurrency.split(",")]
    bench.Server.log_level = args.log_level
    work = Path(tempfile.mkdtemp(prefix="agentbox-floors-"))
    print(f"work directory: {work}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            ceiling = measure("ceiling", work, f"ceiling-{r}", "", connections, args.duration)
            for label, floor in FLOORS.items():
                name = floor.replace(",", "-") or "whole"  # an event id takes no comma
                got = measure("agentbox", work, f"{name}-{r}", floor, connections, args.duration)
                for c in connections:
                    rows.append({"round": r, "floor": label, "connections": c, **got[c],
                                 "ratio": got[c]["per_second"] / ceiling[c]["per_second"],
                                 "cpu_ratio": got[c]["cpu_us"] / ceiling[c]["cpu_us"],
                                 "ceiling_per_second": ceiling[c]["per_second"],
                                 "ceiling_p50_ms": ceiling[c]["p50_ms"]})
                    row = rows[-1]
                    print(f"round {r + 1}: {label:16} {c:3} connections: "
                          f"{row['ratio']:.3f} of the ceiling, CPU x{row['cpu_ratio']:.2f}, "
                          f"p50 {row['p50_ms']:.2f} ms", file=sys.stderr, flush=True)
    finally:
        for server in list(bench.RUNNING):
            server.stop()
    rounds = f"{args.rounds} rounds" if args.rounds != 1 else "1 round"
    print(f"\nmedians of {rounds}, agentbox at --log-level {args.log_level}\n")
    print("| agentbox | connections | accepted/s ÷ ceiling's | CPU µs per request ÷ ceiling's "
          "| p50 ms (ceiling's) |")
    print("|---|---|---|---|---|")
    for label in FLOORS:
        for c in connections:
            mine = [row for row in rows if row["floor"] == label and row["connections"] == c]
            print(f"| {label} | {c} | {statistics.median(x['ratio'] for x in mine):.2f} | "
                  f"{statistics.median(x['cpu_ratio'] for x in mine):.2f} | "
                  f"{statistics.median(x['p50_ms'] for x in mine):.2f} "
                  f"({statistics.median(x['ceiling_p50_ms'] for x in mine):.2f}) |")
    if args.json:
        args.json.write_text(json.dumps({"log_level": args.log_level, "rows": rows}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
