"""Real Chromium for the page's tests: Debian's `chromium`, driven by Playwright
with `executable_path` (no browser of Playwright's own is downloaded)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = os.environ.get("AGENTBOX_TEST_CHROMIUM", "/usr/bin/chromium")
# Without these, Chromium tries to reach Google's services at every start.
QUIET = ("--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync")


@contextmanager
def chromium(*flags: str) -> Iterator[Browser]:
    """A headless Chromium started with QUIET and `flags`, closed after."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                             args=[*QUIET, *flags])
        try:
            yield browser
        finally:
            browser.close()


# The page needs the admin token on loopback too: a test's browser sends the one every
# test server's user holds (tests.conftest.Server) with each request, as a logged-in
# browser sends its session (the login itself is tested in tests/test_page.py).
AS_THE_USER = {"Authorization": "Bearer server-admin-token-of-the-tests"}


def as_the_user(**options: Any) -> dict[str, Any]:
    """Options of a new browser context (`options` too) that send the user's token."""
    return {"extra_http_headers": AS_THE_USER, **options}


@contextmanager
def fresh_page(browser: Browser, logged_in: bool = True) -> Iterator[Page]:
    """A page in a context of its own (no cookies or storage of another test), of the
    server's user (`logged_in`) or of another account."""
    context = browser.new_context(**as_the_user()) if logged_in else browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()
