"""Resource limits against a real server: a body that trickles in is cut off
with 408, idle connections and a flood of bad requests do not stop good ones."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import Server, make_event


def test_a_trickling_body_gets_408_while_good_requests_go_on(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_BODY_TIMEOUT_SECONDS": "1"}).start()
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        # Signed as far as the headers tell (an unsigned one is refused before its body)
        signed = f"X-Webhook-Timestamp: {int(time.time())}\r\nX-Webhook-Signature: 00\r\n"
        slow.sendall(b"POST /webhooks/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n"
                     + signed.encode() + b"\r\n")
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


# -- connections that never finish asking (agentbox.http.connections) ----------------------

IDLE_CONNECTIONS = 1000
SLOW_HEADERS = 50


def _enough_files(count: int) -> None:
    """This test's own limit of open files: each socket it holds is one."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        if hard != resource.RLIM_INFINITY and hard < count:
            pytest.skip(f"the hard limit of open files ({hard}) is under {count}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))


def _closed_by_server(connection: socket.socket, timeout: float) -> bytes:
    """What the server sent before it closed the connection (AssertionError if it kept
    it open past `timeout`)."""
    connection.settimeout(timeout)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except TimeoutError:
        raise AssertionError(f"still open after {timeout} s: {received[:80]!r}") from None
    except ConnectionResetError:
        pass
    return received


def test_the_receiver_answers_while_idle_and_slow_header_connections_are_held(
        server_factory: Callable[..., Server]) -> None:
    """1,000 sockets that never send a byte and 50 that send a header a byte at a time
    take no request's slot: the receiver answers 202 and /healthz 200 within 2 s
    while they are held, and the server closes each once its head is overdue."""
    _enough_files(IDLE_CONNECTIONS + SLOW_HEADERS + 200)
    server = server_factory({"AGENTBOX_HEAD_TIMEOUT_SECONDS": "3"}).start()
    held: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        slow = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
                for _ in range(SLOW_HEADERS)]
        held += slow
        for connection in slow:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
        for _ in range(3):  # a byte each, now and then: the head never ends
            started = time.monotonic()
            assert server.post(make_event()).status_code == 202
            assert server.client.get("/healthz", timeout=2).status_code == 200
            assert time.monotonic() - started < 2
            for connection in slow:
                with contextlib.suppress(OSError):
                    connection.sendall(b"b")
        # Each is closed once overdue: the silent ones without a word, the slow ones
        # with 408 (the first were opened a few seconds ago; allow for the load).
        assert _closed_by_server(held[0], 10) == b""
        late = _closed_by_server(slow[-1], 10)
        assert late.startswith(b"HTTP/1.1 408") and b"head_timeout" in late, late[:200]
        assert server.post(make_event()).status_code == 202
    finally:
        for connection in held:
            connection.close()


def test_more_waiting_connections_than_the_cap_close_the_oldest(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_MAX_CONNECTIONS": "20",
                             "AGENTBOX_MAX_IDLE_CONNECTIONS": "10"}).start()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
            for _ in range(15)]
    try:
        assert _closed_by_server(held[0], 5) == b""  # the longest waiting goes first
        started = time.monotonic()
        assert server.post(make_event()).status_code == 202
        assert time.monotonic() - started < 2
        held[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        held[-1].settimeout(5)
        assert held[-1].recv(4096).startswith(b"HTTP/1.1 200")  # the newest still serves
    finally:
        for connection in held:
            connection.close()


def test_huge_header_values_get_431_and_do_not_grow_the_server(
        server_factory: Callable[..., Server]) -> None:
    """50 connections sending 4 MiB header values once raised the RSS by 200 MiB: each
    is refused with 431 once its head passes AGENTBOX_MAX_HEAD_BYTES."""
    server = server_factory().start()
    assert server.process is not None
    before = rss_mb(server.process.pid)
    value = b"v" * (4 * 1024 * 1024)

    def huge(_: int) -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
            with contextlib.suppress(OSError):  # the server closes while we still send
                connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
                                   + value + b"\r\n\r\n")
            return _closed_by_server(connection, 10)

    with ThreadPoolExecutor(SLOW_HEADERS) as pool:
        answers = list(pool.map(huge, range(SLOW_HEADERS)))
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 431")]
    # A reset may overtake the 431 when the server closes with our bytes unread.
    assert len(refused) >= SLOW_HEADERS // 2, answers[:3]
    assert all(b"head_too_large" in a for a in refused)
    grown = rss_mb(server.process.pid) - before
    assert grown < 40, f"RSS grew by {grown:.1f} MB"
    assert server.client.get("/healthz").status_code == 200


def test_a_form_post_trickled_a_byte_at_a_time_gets_408(
        server_factory: Callable[..., Server]) -> None:
    """Every body has the receiver's deadline (AGENTBOX_BODY_TIMEOUT_SECONDS), the
    status page's forms too."""
    server = server_factory({"AGENTBOX_BODY_TIMEOUT_SECONDS": "1"}).start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        token = f"Authorization: Bearer {server.admin_token()}\r\n".encode()  # its user's
        slow.sendall(b"POST /ui/replay HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/x-www-form-urlencoded\r\nContent-Length: 100\r\n"
                     + token + b"\r\nc")
        started = time.monotonic()
        answer = b""
        slow.settimeout(0.5)
        while not answer and time.monotonic() - started < 10:
            with contextlib.suppress(OSError):
                slow.sendall(b"s")
            with contextlib.suppress(TimeoutError):
                answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        answer += _closed_by_server(slow, 5)
        assert b"body_timeout" in answer and b"connection: close" in answer.lower()
        assert time.monotonic() - started < 5
