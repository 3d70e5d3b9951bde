"""scripts/powercut: power cuts under load, many times; every 202 must survive.

    .venv/bin/python scripts/powercut.py [--cuts 50] [--seed N] [--broken]

The data directory lives on lazyfs (tests/support/lazyfs.py), a FUSE
filesystem that keeps every write not yet fsynced in memory and drops it when
the power is cut. Each round starts a real `agentbox serve` on 127.0.0.1 over
it, checks the events acknowledged before the previous cut (GET
/runs/{run_id}) and `agentbox verify`, sends events from several threads, and
at a random moment cuts the power: lazyfs freezes and drops its unsynced
writes, and the server gets SIGKILL. After the last cut a last round checks
every acknowledged event.

--broken runs the server with a commit path that answers 202 before its
fsync (tests/support/broken_commit): then events must be lost, which shows
that the check catches a loss.

It prints one line per cut and the totals, and exits 1 when an acknowledged
event was lost or `agentbox verify` failed (without --broken), or when none
was lost (with --broken). Needs Linux, /dev/fuse, fusermount3 (Debian's
fuse3) and mfusepy (the test extra). All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.support.powercut import PowerCuts, fuse_missing  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--senders", type=int, default=6, help="threads, one connection each")
    parser.add_argument("--per-sender", type=int, default=1000,
                        help="events a sender sends at most per round")
    parser.add_argument("--max-seconds", type=float, default=3.0,
                        help="the cut comes 0.05 s to this long after the round's first 202")
    parser.add_argument("--broken", action="store_true",
                        help="202 before fsync: the check must find lost events")
    args = parser.parse_args()
    missing = fuse_missing()
    if missing:
        print(f"powercut: {missing}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"powercut: {args.cuts} cuts, seed {seed}"
          f"{', broken commit path' if args.broken else ''}", flush=True)
    with tempfile.TemporaryDirectory(prefix="agentbox-powercut-") as home:
        run = PowerCuts(Path(home), seed, broken=args.broken, senders=args.senders,
                        per_sender=args.per_sender, cut_after=(0.05, args.max_seconds),
                        say=lambda line: print(line, flush=True))
        figures = run.run(args.cuts)
    print(json.dumps(figures.summary()))
    for failure in figures.verify_failures[:3]:
        print(f"agentbox verify failed:\n{failure}")
    if args.broken:
        return 0 if figures.lost else 1
    return 1 if figures.lost or figures.verify_failures else 0


if __name__ == "__main__":
    sys.exit(main())
