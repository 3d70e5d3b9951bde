"""What an event costs a real agentbox server end to end, in CPU instructions: an A/B
that a busy machine does not blur. See agentbox/docs/performance.md, "An event's
cost end to end, counted".

    .venv/bin/python scripts/serve_cost.py [--against DIR ...] [--concurrency 4]

Each checkout (this one, then each `--against DIR`, the root of another copy of
agentbox's source, run by this venv's Python and libraries, so that only agentbox's
code differs) serves `agentbox serve` on 127.0.0.1 under valgrind's callgrind, in
the configuration scripts/bench measures (the default apps, INFO logs, the no-op
agent subscribed to `session.exported`, a SQLite store in a temporary folder). A
client in this process posts signed `session.exported` events of one project over
HTTP, `--concurrency` at a time (each group sent at once and answered before the
next), waits until every run has succeeded, and stops the server (SIGTERM). The
instructions the server executed, from its start to its exit, are counted for 200
events and for 1,200: their difference over 1,000 is what one event costs it end to
end (the request, its signature and model, the store, the run, its outcome, the log
lines), without the start-up's and the shutdown's. Counted instructions leave out
the kernel's part (sockets, fsyncs) and the cache misses: they compare code, not
machines. `--rounds N` measures each checkout N times, alternated, and reports each
count, so that the spread is seen.

No network beyond 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import bench
import httpx
from store_cost import FEW, MANY, checkouts_of, report

START_SECONDS = 900  # a start under callgrind is some fifty times slower than native


def environment(checkout: Path, data: Path) -> dict[str, str]:
    """The bench's server environment (bench.server_environment), with `checkout`'s
    agentbox first on the path."""
    env = bench.server_environment(data, checkout / "scripts")
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), env["PYTHONPATH"]])
    return env


def signed(i: int, tag: str) -> tuple[dict[str, str], bytes]:
    """Event `i`'s headers and body, as scripts/bench sends them, signed now."""
    body = bench.event_body(f"{tag}-{i}").encode()
    ts = str(int(time.time()))
    signature = hmac.new(bench.SECRET.encode(), ts.encode() + b"." + body, hashlib.sha256)
    return {"Content-Type": "application/json", "X-Webhook-Timestamp": ts,
            "X-Webhook-Signature": signature.hexdigest()}, body


async def load(url: str, events: int, concurrency: int) -> None:
    """Post `events` events, `concurrency` at a time; then wait until none is active."""
    tag = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def post(i: int) -> None:
            headers, body = signed(i, tag)
            answer = await client.post("/webhooks/events", headers=headers, content=body)
            if answer.status_code != 202:
                raise SystemExit(f"serve_cost: event {i} answered {answer.status_code}: "
                                 f"{answer.text[:300]}")

        for first in range(0, events, concurrency):
            await asyncio.gather(*(post(i) for i in range(first, min(events, first + concurrency))))
        deadline = time.monotonic() + 600
        while (await client.get("/healthz")).json()["active"] != 0:
            if time.monotonic() > deadline:
                raise SystemExit("serve_cost: the runs did not finish within 600 s")
            await asyncio.sleep(0.2)


def measured(checkout: Path, events: int, concurrency: int, keep: Path | None = None,
             counting: bool = True) -> int:
    """The instructions `checkout`'s server executed, start to exit, serving `events`;
    its callgrind profile copied into `keep`, if given. Not `counting`: the same work
    without valgrind, which answers 0 (tests/test_serve_cost.py)."""
    with tempfile.TemporaryDirectory(prefix="agentbox-serve-cost-") as folder:
        data = Path(folder)
        env = environment(checkout, data)
        found = subprocess.run([sys.executable, "-c", "import agentbox; print(agentbox.__file__)"],
                               env=env, capture_output=True, text=True, check=True,
                               cwd=checkout / "scripts").stdout
        if not Path(found.strip()).is_relative_to(checkout):
            raise SystemExit(f"serve_cost: {checkout}'s agentbox is not the one imported "
                             f"({found.strip()})")
        port, out = bench.free_port(), data / "callgrind.out"
        log_path = data / "server.log"
        url = f"http://127.0.0.1:{port}"
        with open(log_path, "wb") as log:
            counter = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
            server = subprocess.Popen(
                [*(counter if counting else []), sys.executable, "-m", "agentbox", "serve",
                 "--port", str(port)],
                env=env, stdout=log, stderr=log, cwd=checkout / "scripts")
            try:
                deadline = time.monotonic() + START_SECONDS
                while True:
                    if server.poll() is not None:
                        raise SystemExit(f"serve_cost: the server exited:\n"
                                         f"{log_path.read_text(errors='replace')[-3000:]}")
                    try:
                        httpx.get(url + "/healthz", timeout=5)
                        break
                    except httpx.TransportError:
                        if time.monotonic() > deadline:
                            raise SystemExit("serve_cost: the server did not start") from None
                        time.sleep(0.5)
                asyncio.run(load(url, events, concurrency))
                server.send_signal(signal.SIGTERM)
                server.wait(START_SECONDS)
            finally:
                if server.poll() is None:
                    server.kill()
                    server.wait()
        if not counting:
            return 0
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out, keep / f"callgrind.{checkout.name}.{events}.out")
        said = log_path.read_text(errors="replace")
        total = re.search(r"Collected : (\d+)", said)
        if total is None:
            raise SystemExit(f"serve_cost: no count from callgrind:\n{said[-3000:]}")
        return int(total[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="another checkout's root, measured the same way")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="events sent at once (default 4)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each checkout this many times, alternated")
    parser.add_argument("--keep", type=Path, help="copy each callgrind profile into this "
                        "folder (callgrind_annotate reads them: where the instructions go)")
    args = parser.parse_args()
    checkouts = checkouts_of(args.against, "serve_cost")
    for checkout in checkouts:
        if not (checkout / "scripts" / "bench_apps.py").is_file():
            raise SystemExit(f"serve_cost: {checkout} has no scripts/bench_apps.py")
    if shutil.which("valgrind") is None:
        raise SystemExit("serve_cost: counting instructions needs valgrind (apt install valgrind)")
    costs: dict[Path, list[float]] = {checkout: [] for checkout in checkouts}
    for turn in range(args.rounds):
        for checkout in checkouts[::1 if turn % 2 == 0 else -1]:
            few, many = (measured(checkout, n, args.concurrency, args.keep) for n in (FEW, MANY))
            costs[checkout].append((many - few) / (MANY - FEW))
            print(f"  round {turn + 1}: {costs[checkout][-1]:>12,.0f}  {checkout}", flush=True)
    report({checkout: min(found) for checkout, found in costs.items()},
           f"instructions per event end to end, {args.concurrency} sent at once (received, "
           "stored, run, succeeded; the least of the rounds):")


if __name__ == "__main__":
    main()
