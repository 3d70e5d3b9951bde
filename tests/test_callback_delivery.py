"""The callback deliverer in-process: the SSRF rules, the retry decision, signatures.

Name resolution is simulated (a fake resolver), never the network: a test that
names a public or private address must not reach it, so every request goes
through a guard transport that refuses anything but loopback and records what
it was asked. The TLS test uses a real TLS server on 127.0.0.1 with a
certificate made here by the openssl command.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import random
import ssl
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbox.addresses import REFUSED_V4, REFUSED_V6, IPAddress, is_public
from agentbox.config import Settings
from agentbox.engine.callbacks import (
    Attempt,
    CallbackDeliverer,
    DestinationPolicy,
    UrlProblem,
    retry_after_seconds,
)
from agentbox.engine.subscriptions import SubscriptionPolicy
from agentbox.signing import SignatureError, callback_headers, verify_callback
from agentbox.store import Notification
from agentbox.store.sqlite import SqliteStore
from tests.support.callback_receiver import CallbackReceiver
from tests.vectors import load_vectors

SECRET = "whsec_Y2FsbGJhY2stdGVzdC1rZXktMDEyMzQ1Njc4OWFiY2RlZg=="
NOW = 1_785_166_920.0
V4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
V6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)


# -- the address classifier ------------------------------------------------------------------


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.255.0.9", "10.0.0.7", "172.16.0.1", "172.31.255.255", "192.168.1.20",
    "169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.254", "0.0.0.0",
    "255.255.255.255", "224.0.0.1", "239.255.255.250", "192.0.2.1", "198.18.0.1",
    "::1", "::", "fe80::1", "fc00::1", "fd12:3456::1", "ff02::1", "::ffff:127.0.0.1",
    "::ffff:10.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a00:1", "::127.0.0.1",
    "2002:7f00:1::1", "2001:db8::1", "2001::1", "fe80::1%1", "::ffff:0:a9fe:a9fe",
    "::1:0:0:1", "4000::1", "e000::1", "3fff::1", "5f00::1",
])
def test_local_and_special_addresses_are_refused(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", [
    "8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2a00:1450:4001::200e",
    "::ffff:8.8.8.8", "64:ff9b::808:808",
])
def test_public_addresses_are_permitted(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


@given(V4)
def test_ipv4_forms_in_ipv6_are_judged_like_the_ipv4_address(v4: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{v4}")
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(v4))
    translated = ipaddress.IPv6Address(int(ipaddress.IPv6Address("::ffff:0:0:0")) | int(v4))
    assert is_public(mapped) == is_public(nat64) == is_public(translated) == is_public(v4)


@given(st.one_of(V4, V6))
def test_a_permitted_address_is_global_unicast_and_in_no_refused_network(
        address: IPAddress) -> None:
    if is_public(address):
        assert address.is_global and not address.is_multicast
        assert not address.is_loopback and not address.is_private
        assert not address.is_link_local and not address.is_unspecified
        networks: Sequence[Any] = REFUSED_V4 if address.version == 4 else REFUSED_V6
        embedded = isinstance(address, ipaddress.IPv6Address) and any(
            address in ipaddress.IPv6Network(n) for n in ("::ffff:0:0/96", "64:ff9b::/96",
                                                           "::ffff:0:0:0/96"))
        assert embedded or not any(address in network for network in networks)


@given(st.sampled_from(REFUSED_V4).flatmap(
    lambda net: st.integers(0, net.num_addresses - 1).map(lambda i: net[i])))
def test_every_address_of_a_refused_ipv4_network_is_refused(
        address: ipaddress.IPv4Address) -> None:
    assert not is_public(address)


@given(st.sampled_from(REFUSED_V6[3:]).flatmap(
    lambda net: st.integers(0, net.num_addresses - 1).map(lambda i: net[i])))
def test_every_address_of_a_refused_ipv6_network_is_refused(
        address: ipaddress.IPv6Address) -> None:
    assert not is_public(address)


# -- delivering with a simulated resolver ------------------------------------------------------


class GuardTransport(httpx.AsyncBaseTransport):
    """Answers 200 itself and records each request: nothing leaves this process."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, stream=httpx.ByteStream(b"fine"))


class FakeResolver:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise OSError("no such host")
        return [ipaddress.ip_address(a) for a in self.answers[host]]


def settings(**changes: Any) -> Settings:
    return replace(Settings(), callback_secret=(SECRET,), **changes)


def note(url: str, attempts: int = 0) -> Notification:
    body = json.dumps({"notification_id": "run_1:processing:0"}).encode()
    return Notification(pk=1, notification_id="run_1:processing:0", run_id="run_1",
                        destination="", url=url, body=body, attempts=attempts,
                        lease_until=NOW + 25)


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    return SqliteStore(tmp_path / "unused.db")  # never opened: attempt() does not store


def deliverer(store: SqliteStore, resolver: FakeResolver, transport: httpx.AsyncBaseTransport,
              **changes: Any) -> CallbackDeliverer:
    return CallbackDeliverer(store, settings(**changes), clock=lambda: NOW, resolver=resolver,
                             transport=transport, rng=random.Random(7))


def attempt(d: CallbackDeliverer, url: str) -> Attempt:
    async def run() -> Attempt:
        try:
            return await d.attempt(note(url))
        finally:
            await d._client.aclose()
    return asyncio.run(run())


@pytest.mark.parametrize("answer", [
    ["10.0.0.7"], ["127.0.0.1"], ["169.254.169.254"], ["::ffff:192.168.0.1"], ["fd00::5"],
    ["93.184.216.34", "10.0.0.7"],  # one bad address is enough to refuse
])
def test_a_public_name_resolving_to_a_private_address_is_refused(
        store: SqliteStore, answer: list[str]) -> None:
    guard, resolver = GuardTransport(), FakeResolver({"studio.example": answer})
    d = deliverer(store, resolver, guard, callback_allowed=("https://studio.example",))
    assert attempt(d, "https://studio.example/hooks") == Attempt("address_not_allowed")
    assert guard.requests == []  # refused before connecting
    assert resolver.asked == [("studio.example", 443)]


def test_the_checked_address_is_the_one_connected_to(store: SqliteStore) -> None:
    guard = GuardTransport()
    resolver = FakeResolver({"studio.example": ["93.184.216.34", "2606:2800:220:1::1"]})
    d = deliverer(store, resolver, guard, callback_allowed=("https://studio.example:8443",))
    assert attempt(d, "https://studio.example:8443/hooks/a?x=1") == Attempt(None, 200)
    (request,) = guard.requests
    assert str(request.url) == "https://93.184.216.34:8443/hooks/a?x=1"
    assert request.headers["host"] == "studio.example:8443"
    assert request.extensions["sni_hostname"] == "studio.example"  # TLS checks this name
    assert resolver.asked == [("studio.example", 8443)]  # one lookup, no second one
    assert request.headers["webhook-id"] == "run_1:processing:0"


def test_the_host_header_keeps_an_explicit_port_only(store: SqliteStore) -> None:
    guard = GuardTransport()
    resolver = FakeResolver({"studio.example": ["93.184.216.34"]})
    d = deliverer(store, resolver, guard, callback_allowed=("https://studio.example",))
    assert attempt(d, "https://Studio.Example/hooks") == Attempt(None, 200)
    assert guard.requests[0].headers["host"] == "studio.example"


@pytest.mark.parametrize("url", [
    "https://evil.example/hooks",  # not allowlisted
    "https://studio.ex\u212aample/hooks",  # a Kelvin sign that lower() would make a k
    "https://studio.example:444/hooks",  # another port is another origin
    "http://studio.example/hooks",  # another scheme is another origin
    "https://user:pw@studio.example/hooks",  # credentials
])
def test_urls_outside_the_allowlist_are_refused_again_at_delivery(
        store: SqliteStore, url: str) -> None:
    guard, resolver = GuardTransport(), FakeResolver({"studio.example": ["93.184.216.34"]})
    d = deliverer(store, resolver, guard, callback_allowed=("https://studio.example",))
    assert attempt(d, url) == Attempt("destination_not_allowed")
    assert guard.requests == [] and resolver.asked == []


def test_a_name_that_does_not_resolve_is_a_dns_error(store: SqliteStore) -> None:
    guard, resolver = GuardTransport(), FakeResolver({})
    d = deliverer(store, resolver, guard, callback_allowed=("https://studio.example",))
    assert attempt(d, "https://studio.example/") == Attempt("dns_error")
    assert guard.requests == []


def test_a_loopback_origin_reaches_loopback_only(store: SqliteStore) -> None:
    guard = GuardTransport()
    resolver = FakeResolver({"localhost": ["10.1.1.1"]})
    d = deliverer(store, resolver, guard,
                  callback_allowed=("http://localhost:9000", "http://127.0.0.1:9000"))
    assert attempt(d, "http://localhost:9000/cb") == Attempt("address_not_allowed")
    assert attempt(deliverer(store, resolver, guard,
                             callback_allowed=("http://127.0.0.1:9000",)),
                   "http://127.0.0.1:9000/cb") == Attempt(None, 200)
    assert [str(r.url) for r in guard.requests] == ["http://127.0.0.1:9000/cb"]


def test_an_origin_allowlisted_as_local_may_resolve_to_a_private_address(
        store: SqliteStore) -> None:
    guard = GuardTransport()
    resolver = FakeResolver({"nas.studio.example": ["192.168.1.20"]})
    policy = DestinationPolicy((), ("https://nas.studio.example",))
    assert policy.permits("https://nas.studio.example/cb", ipaddress.ip_address("192.168.1.20"))
    assert not policy.permits("https://nas.studio.example/cb", ipaddress.ip_address("224.0.0.1"))
    d = deliverer(store, resolver, guard,
                  callback_allowed_local=("https://nas.studio.example",))
    assert attempt(d, "https://nas.studio.example/cb") == Attempt(None, 200)
    assert [str(r.url) for r in guard.requests] == ["https://192.168.1.20/cb"]


@pytest.mark.parametrize(("url", "callbacks", "subscriptions"), [
    ("https://hooks.example.com/cb", None, None),
    ("https://hooks.example.com/cb#part", None, UrlProblem.MALFORMED),
    ("http://[", UrlProblem.MALFORMED, UrlProblem.MALFORMED),
    ("ftp://hooks.example.com/cb", UrlProblem.MALFORMED, UrlProblem.MALFORMED),
    ("https://hooks.example.com:99999/", UrlProblem.MALFORMED, UrlProblem.MALFORMED),
    ("https://hooks.example.com/c\nb", UrlProblem.MALFORMED, UrlProblem.MALFORMED),
    ("https://h\u00f6oks.example.com/cb", UrlProblem.MALFORMED, UrlProblem.MALFORMED),
    ("https://u:p@hooks.example.com/cb", UrlProblem.CREDENTIALS, UrlProblem.CREDENTIALS),
    ("https://other.example.com/cb", UrlProblem.NOT_ALLOWED, None),
    ("http://hooks.example.com/cb", UrlProblem.NOT_ALLOWED, UrlProblem.NOT_ALLOWED),
    ("https://10.0.0.1/cb", UrlProblem.NOT_ALLOWED, UrlProblem.NOT_ALLOWED),
])
def test_one_policy_judges_every_destination_given(
        url: str, callbacks: UrlProblem | None, subscriptions: UrlProblem | None) -> None:
    """The receiver's callback_url and the subscriptions' url are judged by one
    `DestinationPolicy.check`, each by its own allowlist (the routes word the answer)."""
    assert DestinationPolicy(("https://hooks.example.com",), ()).check(url) is callbacks
    assert SubscriptionPolicy(()).check(url) is subscriptions


class LoopbackOnly(GuardTransport):
    """Forwards loopback requests to a real network transport; fails on anything else."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        super().__init__()
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        assert ipaddress.ip_address(host).is_loopback, f"refusing to reach {host}"
        self.requests.append(request)
        return await self.inner.handle_async_request(request)


def test_guard_refuses_non_loopback() -> None:
    guard = LoopbackOnly(GuardTransport())

    async def run() -> None:
        async with httpx.AsyncClient(transport=guard) as client:
            await client.get("https://93.184.216.34/")

    with pytest.raises(AssertionError):
        asyncio.run(run())


# -- TLS still verifies the URL's host name -----------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a certificate for callbacks.test, made by openssl."""
    d = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=agentbox test CA")
    openssl("req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=callbacks.test")
    (d / "san.cnf").write_text("subjectAltName=DNS:callbacks.test\n")
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "san.cnf")
    return d


@pytest.fixture
def tls_receiver(certificates: Path) -> Iterator[CallbackReceiver]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates / "leaf.pem", certificates / "leaf.key")
    found = CallbackReceiver(SECRET, tls=context)
    yield found
    found.close()


@pytest.mark.parametrize(("name", "expected"), [
    ("callbacks.test", None),  # the certificate's name: delivered
    ("other.test", "tls_error"),  # same address, another name: the certificate does not match
])
def test_tls_verifies_the_name_while_connecting_to_the_checked_address(
        store: SqliteStore, certificates: Path, tls_receiver: CallbackReceiver, name: str,
        expected: str | None) -> None:
    origin = f"https://{name}:{tls_receiver.port}"
    resolver = FakeResolver({name: ["127.0.0.1"]})  # these names exist nowhere else
    trust = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
    guard = LoopbackOnly(httpx.AsyncHTTPTransport(verify=trust, trust_env=False))
    d = deliverer(store, resolver, guard, callback_allowed_local=(origin,))
    got = attempt(d, origin + "/ok")
    assert got.error == expected
    if expected is None:
        (received,) = tls_receiver.delivered("/ok")
        assert received.headers["host"] == f"{name}:{tls_receiver.port}"
    else:
        assert tls_receiver.requests() == []


# -- the retry decision ----------------------------------------------------------------------


def decide(attempts: int, result: Attempt, schedule: tuple[float, ...] = (0, 5, 300)
           ) -> Any:
    d = CallbackDeliverer(SqliteStore(Path("/nonexistent/unused.db")),
                          settings(callback_retry_schedule=schedule), clock=lambda: NOW,
                          rng=random.Random(1))
    asyncio.run(d._client.aclose())
    return d.decide(note("https://x.example/", attempts), result)


def test_a_2xx_is_delivered() -> None:
    assert decide(0, Attempt(None, 204)).state == "delivered"


@pytest.mark.parametrize(("attempts", "delay"), [(0, 5), (1, 300)])
def test_failures_follow_the_schedule_with_jitter(attempts: int, delay: float) -> None:
    result = decide(attempts, Attempt("http_500", 500))
    assert result.state == "pending" and result.error == "http_500"
    assert NOW + delay * 0.8 <= result.next_attempt_at <= NOW + delay * 1.2


def test_the_last_attempt_of_the_schedule_makes_it_dead() -> None:
    result = decide(2, Attempt("timeout"))
    assert (result.state, result.error, result.next_attempt_at) == ("dead", "timeout", None)


def test_retry_after_is_waited_for_but_never_shortens_the_schedule() -> None:
    assert decide(0, Attempt("http_429", 429, retry_after=42.0)).next_attempt_at == NOW + 42
    soon = decide(1, Attempt("http_503", 503, retry_after=0.0)).next_attempt_at
    assert NOW + 240 <= soon <= NOW + 360  # the schedule's 300 s, jittered


def test_410_pauses_and_keeps_the_notification_due() -> None:
    result = decide(0, Attempt("http_410", 410))
    assert result.state == "pending" and result.next_attempt_at == NOW
    assert result.pause_reason is not None and "410" in result.pause_reason


@pytest.mark.parametrize(("header", "seconds"), [
    ("7", 7.0), (" 0 ", 0.0), ("99999999", 86_400.0), ("soon", None), ("-5", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), (None, None),
])
def test_retry_after_header_parsing(header: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(header, NOW) == seconds


def test_retry_after_as_a_date() -> None:
    assert retry_after_seconds("Thu, 01 Jan 2026 00:01:40 GMT", 1_767_225_600.0) == 100.0


@given(st.text(max_size=40))
def test_retry_after_never_raises_and_stays_bounded(header: str) -> None:
    seconds = retry_after_seconds(header, NOW)
    assert seconds is None or 0 <= seconds <= 86_400


# -- signatures ---------------------------------------------------------------------------------


def test_callback_headers_verify_with_an_independent_implementation() -> None:
    body = b'{"notification_id":"run_1:succeeded:0"}'
    headers = callback_headers([SECRET], "run_1:succeeded:0", body, 1_785_166_920)
    mac = hmac.new(SECRET.encode(), b"1785166920." + body, hashlib.sha256).hexdigest()
    assert headers["X-Agent-Signature"] == mac and headers["X-Agent-Timestamp"] == "1785166920"
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    std = base64.b64encode(hmac.new(key, b"run_1:succeeded:0.1785166920." + body,
                                    hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{std}"
    assert verify_callback(SECRET, headers, body, now=1_785_166_920) == json.loads(body)


def test_a_rotation_signs_with_every_secret() -> None:
    body = b"{}"
    headers = callback_headers(["new-secret", SECRET], "n1", body, 100)
    assert len(headers["webhook-signature"].split()) == 2
    only_std = {k: v for k, v in headers.items() if k.startswith("webhook-")}
    assert verify_callback(SECRET, only_std, body, now=100) == {}
    with pytest.raises(SignatureError):  # the hex header uses the current secret only
        verify_callback(SECRET, {k: v for k, v in headers.items() if k.startswith("X-")},
                        body, now=100)


def test_verify_callback_accepts_the_shared_vectors() -> None:
    for case in load_vectors()["hmac_hex"]:
        body = base64.b64decode(case["body_base64"])
        headers = {"X-Agent-Timestamp": case["timestamp"], "X-Agent-Signature": case["signature"]}
        if not body.startswith(b"{"):
            continue
        try:
            verify_callback(case["secret"], headers, body, now=float(case["timestamp"]))
        except SignatureError as exc:
            assert exc.code == "body_invalid"  # signed fine, but not a JSON notification


@given(st.binary(max_size=200), st.integers(0, 199))
def test_any_change_to_the_body_fails(body: bytes, position: int) -> None:
    headers = callback_headers([SECRET], "n1", body, 1000)
    changed = bytearray(body or b"x")
    changed[position % len(changed)] ^= 1
    with pytest.raises(SignatureError):
        verify_callback(SECRET, headers, bytes(changed), now=1000)


def test_an_old_callback_is_refused_unless_the_age_check_is_off() -> None:
    body = b'{"notification_id":"n"}'
    headers = callback_headers([SECRET], "n", body, 1000)
    with pytest.raises(SignatureError) as refused:
        verify_callback(SECRET, headers, body, now=1000 + 301)
    assert refused.value.code == "signature_expired"
    assert verify_callback(SECRET, headers, body, max_age_seconds=float("inf"), now=9e9)
