"""The manual opens with a musician's topics: its contents (`/docs`, `agentbox docs`)
list getting started and the review first, and the webhook and engine topics after,
under a heading that says they are for developers; the review's topic opens in a
musician's words."""

from __future__ import annotations

import pytest

from agentbox import manual
from tests.conftest import InProcess

MUSICIANS = ["getting-started", "review"]  # first, in this order
DEVELOPERS = {"events", "agents", "apps", "api", "internals", "scaling"}


def test_the_contents_put_a_musicians_topics_first() -> None:
    (first, listed), *rest = manual.groups()
    assert first == "For musicians"
    assert [t.name for t in listed][:2] == MUSICIANS
    later = {t.name: group for group, topics in rest for t in topics}
    assert set(later) >= DEVELOPERS
    assert all("developers" in later[name] for name in DEVELOPERS)


def test_agentbox_docs_lists_them_under_their_headings() -> None:
    text = manual.listing()
    order = [text.index(word) for word in ("For musicians", "getting-started", "review ",
                                           "For developers", "events ")]
    assert order == sorted(order), text


@pytest.mark.anyio
async def test_the_docs_page_lists_them_under_their_headings(box: InProcess) -> None:
    page = (await box.client.get("/docs")).text
    nav = page.split('aria-label="The manual\'s topics"', 1)[1].split("</nav>", 1)[0]
    order = [nav.index(part) for part in ("For musicians", 'href="/docs/getting-started"',
                                          'href="/docs/review"', "For developers",
                                          'href="/docs/events"')]
    assert order == sorted(order)
    contents = page.split('id="doc"', 1)[1]
    assert contents.index("For musicians") < contents.index("For developers")


def test_the_review_opens_in_a_musicians_words() -> None:
    opening = manual.text("review").split("\n## The mix review", 1)[0]
    for engine_word in ("session.exported", "agentbox.review", "mix_url", "AGENTBOX_"):
        assert engine_word not in opening
    assert "## Getting a review" in opening
