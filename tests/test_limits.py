"""Resource limits against a real server: a body that trickles in is cut off
with 408, idle connections and a flood of bad requests do not stop good ones."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import Server, make_event


def test_a_trickling_body_gets_408_while_good_requests_go_on(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_BODY_TIMEOUT_SECONDS": "1"}).start()
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        slow.sendall(b"POST /webhooks/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()
        answer = b""
        for _ in range(20):  # a byte every 0.2 s: 100 bytes would take 20 s
            try:
                slow.sendall(b"{")
            except OSError:
                break
            slow.settimeout(0.2)
            with contextlib.suppress(TimeoutError):
                answer += slow.recv(4096)
            if answer:
                break
            assert server.post(make_event()).status_code == 202  # others are served
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        slow.settimeout(5)
        while chunk := slow.recv(4096):  # the server closes after its answer
            answer += chunk
        assert b"body_timeout" in answer
        assert time.monotonic() - started < 5
    finally:
        slow.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_idle_connections_and_a_flood_of_bad_requests_do_not_starve_good_ones(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory().start()
    assert server.process is not None
    idle: list[socket.socket] = []

    def bad(i: int) -> int:
        if i % 2:
            return server.post(make_event(), secret="wrong").status_code
        return server.client.post("/webhooks/events", content=b"x" * 2_000_000).status_code

    def flood_round(rounds: int) -> tuple[list[int], float, set[int]]:
        idle.extend(socket.create_connection(("127.0.0.1", server.port), timeout=10)
                    for _ in range(200))
        with ThreadPoolExecutor(16) as pool:
            flood = pool.map(bad, range(rounds))
            started = time.monotonic()
            good = [server.post(make_event()).status_code for _ in range(20)]
            took = time.monotonic() - started
            codes = set(flood)
        for connection in idle:
            connection.close()
        idle.clear()
        return good, took, codes

    try:
        good, took, codes = flood_round(200)
        assert good == [202] * 20 and took < 10
        assert codes <= {401, 413}
        assert server.client.get("/healthz").status_code == 200
        # Memory is bounded: after a first flood has warmed everything up, five more
        # floods (1,000 bad requests of up to 2 MB, 1,000 idle sockets) add little.
        warm = rss_mb(server.process.pid)
        for _ in range(5):
            good, _, codes = flood_round(200)
            assert good == [202] * 20 and codes <= {401, 413}
        grown = rss_mb(server.process.pid) - warm
        assert grown < 40, f"RSS grew by {grown:.1f} MB over five floods"
    finally:
        for connection in idle:
            connection.close()
