"""Guessing the admin token is slowed everywhere (agentbox.http.access): a wrong Bearer
token is a failed login (counted, logged, answered later and later), every loopback
address is one client, and the right token never waits for another's wrong ones. And
the small doors: `POST /login-links` takes the admin token only; an unusable file
name dropped on the page is 422 with nothing left behind; a token is read stripped."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from agentbox import config as cfg
from agentbox.http.access import SESSION_COOKIE
from agentbox.review.web import drops
from tests.conftest import InProcess, Server
from tests.test_page_upload import AS_SCRIPT, form, tone

WRONG = "a-wrong-token-of-sufficient-length"


def failures(server: Server) -> float:
    metrics = server.client.get("/metrics").text
    found = re.search(r"^agentbox_login_failures_total ([0-9.e+]+)$", metrics, re.M)
    assert found, metrics
    return float(found.group(1))


def from_address(address: str, server: Server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, timeout=120,
                             transport=httpx.AsyncHTTPTransport(local_address=address))


@pytest.mark.anyio
async def test_wrong_bearer_tokens_from_every_loopback_address_are_one_slowed_client(
        server: Server, anyio_backend: str) -> None:
    before = failures(server)
    guessers = [from_address(f"127.0.0.{n}", server) for n in range(2, 12)]
    right = from_address("127.0.0.99", server)
    try:
        # Ten guesses at once, each from an address of its own: they queue up as one
        # client's (0, 1, 2, 4 ... 32 s), and past a minute queued the answer is 429.
        tries = [asyncio.ensure_future(guesser.get("/runs", headers={
            "Authorization": f"Bearer {WRONG}"})) for guesser in guessers]
        done, waiting = await asyncio.wait(tries, return_when=asyncio.FIRST_COMPLETED)
        while not any(t.result().status_code == 429 for t in done):
            more, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            done |= more
        refused = next(t.result() for t in done if t.result().status_code == 429)
        assert refused.json()["error_code"] == "too_many_wrong_tokens"
        assert int(refused.headers["retry-after"]) > 0
        assert waiting  # guesses still held back, from other addresses than the 429's
        # The right token, from yet another loopback address, is answered meanwhile.
        answer = await right.get("/runs", headers={
            "Authorization": f"Bearer {server.admin_token()}"})
        assert answer.status_code == 200
        assert not all(t.done() for t in waiting)
        for each in waiting:
            each.cancel()
    finally:
        for each in (*guessers, right):
            await each.aclose()
    assert failures(server) >= before + 10
    assert "an admin call with a wrong token was refused" in server.log_path.read_text()
    assert WRONG not in server.log_path.read_text()


def test_a_login_link_needs_the_admin_token_not_a_session(server: Server) -> None:
    browser = server.browser()  # on the page's private name, where sessions are
    opened = browser.get(server.on_page(server.login_link()))
    session = opened.cookies[SESSION_COOKIE]
    with_session = browser.post("/login-links", headers={
        "Cookie": f"{SESSION_COOKIE}={session}", "Origin": "https://elsewhere.example"})
    assert with_session.status_code == 401
    assert with_session.json()["error_code"] == "admin_token_required"
    assert browser.get("/runs", headers={
        "Cookie": f"{SESSION_COOKIE}={session}"}).status_code == 200  # the session works
    browser.close()
    assert server.client.post("/login-links").status_code == 201


@pytest.mark.anyio
async def test_an_unusable_file_name_is_422_leaving_nothing(box: InProcess) -> None:
    csrf = await box.csrf()
    for name in ("..", ".", "a/..", "x" * 252 + ".wav", "é" * 128 + ".wav"):
        answer = await box.client.post("/exports", data=form(csrf), headers=AS_SCRIPT,
                                       files={"file": (name, tone())})
        if name in (".", "a/.."):  # a name of no file: it is named mix.wav, or refused
            assert answer.status_code in (202, 422), answer.text
            continue
        assert answer.status_code == 422, (name[:20], answer.text)
        assert answer.json()["error_code"] == "invalid_request"
        assert "cannot be kept" in answer.json()["message"]
    dropped = box.settings.data_dir / "archive" / drops.DROPPED
    kept = [p for p in dropped.rglob("*")] if dropped.exists() else []
    assert all(p.name != ".." for p in kept)
    assert len([p for p in kept if p.is_dir()]) <= 1  # only the one "." became mix.wav


def test_a_token_with_spaces_is_read_stripped_and_still_checked_for_length(
        tmp_path: Path) -> None:
    settings = cfg.load_settings(environ={"AGENTBOX_DATA_DIR": str(tmp_path / "d")},
                                 overrides={"config_dir": tmp_path / "c"})
    token = "0123456789abcdef"
    assert cfg.admin_token(settings, {"AGENTBOX_ADMIN_TOKEN": f" {token}  "}) == token
    with pytest.raises(cfg.ConfigError, match="shorter than 16"):
        cfg.admin_token(settings, {"AGENTBOX_ADMIN_TOKEN": "0123456789abcde   "})
