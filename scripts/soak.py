"""scripts/soak: kill agentbox with -9 at random moments, many times, under load.

    .venv/bin/python scripts/soak.py [--kills 100] [--seed N] [--database-url URL]

Each round starts a real `agentbox serve` on 127.0.0.1 (the same data directory
every time), sends signed events from several threads (with duplicates of
events already sent, a slow agent, a flaky one, one that always fails, and
callbacks to a receiver that fails each notification's first delivery), and
kills the server with SIGKILL at a random moment 0.2 to 1.5 s after that
round's first acknowledged event (its first 15 or 20 in the test's short
variant, so that a busy machine's slow start does not leave a round empty).
At the end one last
server drains everything, and the script checks and prints:

- acknowledged events lost: answered 202/200 but not in the store (must be 0)
- events with more than one run (0)
- agent starts after the run was terminal, from the agents' journal (0)
- callbacks never delivered (0)
- dead letters, by reason

With --database-url (an empty PostgreSQL database) the same runs on PostgreSQL,
with 2-second leases: there a restarted instance does not release its previous
life's leases (another instance might hold them), it waits for them to expire.

It exits 1 when a must-be-0 figure is not 0. All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.conftest import Server, make_event, wait_until  # noqa: E402
from tests.support.callback_receiver import CallbackReceiver  # noqa: E402

CALLBACK_SECRET = "whsec_c29hay10ZXN0LWNhbGxiYWNrLXNlY3JldC0wMTIzNDU2Nzg5"
PROJECTS = ["ok"] * 6 + ["sleep-0.3", "fail-1", "always-fail"]


class Sender(threading.Thread):
    """Posts events (and duplicates of earlier ones) until stopped; remembers every
    event the server acknowledged (202 or 200)."""

    def __init__(self, server: Server, receiver: CallbackReceiver, rng: random.Random,
                 sent: list[dict[str, Any]], acknowledged: set[str], lock: threading.Lock
                 ) -> None:
        super().__init__(daemon=True)
        self.server, self.receiver, self.rng = server, receiver, rng
        self.sent, self.acknowledged, self.lock = sent, acknowledged, lock
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                again = self.sent and self.rng.random() < 0.2
                event = self.rng.choice(self.sent) if again else make_event(
                    event_id=uuid.uuid4().hex, project_id=self.rng.choice(PROJECTS),
                    callback_url=self.receiver.url("/fail-1"))
                if not again:
                    self.sent.append(event)
            try:
                response = self.server.post(event)
            except Exception:  # the server is being killed: not acknowledged
                time.sleep(0.01)
                continue
            if response.status_code in (200, 202):
                with self.lock:
                    self.acknowledged.add(event["event_id"])


def soak(kills: int, seed: int, home: Path | None = None, quiet: bool = False,
         database_url: str | None = None, least_per_round: int = 1) -> dict[str, Any]:
    """Kill the loaded server `kills` times, each at a random moment after at least
    `least_per_round` new events of that round were acknowledged (a busy machine may
    take seconds to start it: a kill before then would test nothing), then let the
    last life settle everything and check the promise's figures."""
    rng = random.Random(seed)
    home = home or Path(tempfile.mkdtemp(prefix="agentbox-soak-"))
    receiver = CallbackReceiver(CALLBACK_SECRET)
    env = {"AGENTBOX_CALLBACK_ALLOWED": receiver.origin,
           "AGENTBOX_CALLBACK_SECRET": CALLBACK_SECRET,
           "AGENTBOX_CALLBACK_RETRY_SCHEDULE": "0" + ",0.2" * 30,
           # every notification fails once on purpose: that is not a dead destination
           "AGENTBOX_CALLBACK_PAUSE_AFTER_FAILURES": "100000",
           "AGENTBOX_RETRY_BASE_SECONDS": "0.05", "AGENTBOX_RETRY_MAX_SECONDS": "0.2",
           "AGENTBOX_LOG_LEVEL": "warning"}
    if database_url:
        env.update(AGENTBOX_DATABASE_URL=database_url, AGENTBOX_LEASE_SECONDS="2")
    sent: list[dict[str, Any]] = []
    acknowledged: set[str] = set()
    lock = threading.Lock()
    server = Server(home, env)
    try:
        for round_number in range(1, kills + 1):
            server.start()
            senders = [Sender(server, receiver, random.Random(rng.random()), sent,
                              acknowledged, lock) for _ in range(4)]
            before = len(acknowledged)
            for sender in senders:
                sender.start()
            wait_until(lambda at_least=before + least_per_round: len(acknowledged) >= at_least,
                       120,
                       f"{least_per_round} events acknowledged in round {round_number}",
                       interval=0.01)
            time.sleep(rng.uniform(0.2, 1.5))
            server.kill9()
            for sender in senders:
                sender.stop.set()
            for sender in senders:
                sender.join(30)
            if not quiet:
                print(f"kill {round_number}/{kills}: {len(acknowledged)} events acknowledged",
                      file=sys.stderr)
        server.start()  # the last life: drain everything

        def settled() -> bool:
            health = server.client.get("/healthz").json()
            pending = server.client.get("/callbacks", params={"state": "pending",
                                                              "limit": 1}).json()
            return health["active"] == 0 and not pending["callbacks"]

        wait_until(settled, 1800, "every run and callback to settle", interval=0.5)
        server.stop()
        return check(home, acknowledged, server, database_url)
    finally:
        server.close()
        receiver.close()


def check(home: Path, acknowledged: set[str], server: Server,
          database_url: str | None = None) -> dict[str, Any]:
    conn: Any
    if database_url:
        import psycopg

        conn = psycopg.connect(database_url)
    else:
        conn = sqlite3.connect(home / "data" / "agentbox.sqlite3")
    stored = {row[0] for row in conn.execute("SELECT event_id FROM events")}
    doubled = conn.execute(
        "SELECT count(*) FROM (SELECT event_pk FROM runs GROUP BY event_pk, agent "
        "HAVING count(*) > 1) AS doubled").fetchone()[0]
    completed = dict(conn.execute(
        "SELECT run_id, completed_at FROM runs WHERE completed_at IS NOT NULL"))
    dead = Counter(code for (code,) in conn.execute(
        "SELECT error_code FROM runs WHERE status = 'dead_lettered'"))
    undelivered = conn.execute(
        "SELECT count(*) FROM outbox WHERE state != 'delivered'").fetchone()[0]
    runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    conn.close()
    late_starts = 0
    for entry in server.journal_lines():
        done = completed.get(entry["run_id"])
        if entry["kind"] == "start" and done is not None and entry["t"] > done + 0.001:
            late_starts += 1
    return {
        "events_acknowledged": len(acknowledged), "runs": runs,
        "acknowledged_lost": len(acknowledged - stored),
        "events_with_more_than_one_run": doubled,
        "agent_starts_after_terminal": late_starts,
        "callbacks_never_delivered": undelivered,
        "dead_letters": dict(dead),
    }


MUST_BE_ZERO = ("acknowledged_lost", "events_with_more_than_one_run",
                "agent_starts_after_terminal", "callbacks_never_delivered")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--database-url", default=None,
                        help="soak on this (empty) PostgreSQL database instead of SQLite")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    started = time.monotonic()
    report = soak(args.kills, seed, database_url=args.database_url)
    report.update(kills=args.kills, seed=seed, engine="postgresql" if args.database_url
                  else "sqlite",
                  minutes=round((time.monotonic() - started) / 60, 1))
    print(json.dumps(report, indent=2))
    failed = [name for name in MUST_BE_ZERO if report[name]]
    if failed:
        raise SystemExit(f"FAILED: {', '.join(failed)} (seed {seed})")


if __name__ == "__main__":
    main()
