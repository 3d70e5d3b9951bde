"""`/docs` and `/docs/{topic}`: the manual that ships in the package, rendered in
the page's look, with a table of contents of each topic's sections, and the topics
beside it under their headings (a musician's first).

Offline like the rest of the page (no CDN, no script of its own), and behind the
same access rules: the app's TokenGuard sees these routes as it sees every page.
"""

from __future__ import annotations

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from agentbox import manual

TEMPLATE = "docs.html"


class ManualPages:
    def __init__(self, env: Environment) -> None:
        self.env = env

    async def contents(self, request: Request) -> Response:
        """The table of contents: every topic with its line."""
        return self._page(manual.INDEX, status_code=200)

    async def topic(self, request: Request) -> Response:
        name = request.path_params["topic"]
        if name.endswith(".md"):  # a link copied from the repository's files
            name = name.removesuffix(".md")
            return RedirectResponse(f"/docs/{name}" if name != manual.INDEX else "/docs",
                                    status_code=301)
        if name == manual.INDEX:
            return RedirectResponse("/docs", status_code=301)
        try:
            manual.topic(name)
        except manual.UnknownTopic:
            return self._unknown(name)
        return self._page(name, status_code=200)

    def _page(self, name: str, status_code: int) -> HTMLResponse:
        rendered = manual.render(name)
        html = self.env.get_template(TEMPLATE).render(
            title=rendered.title, html=_scrolling_tables(rendered.html),
            headings=rendered.headings,
            topics=manual.topics(), groups=manual.groups(), current=name)
        return HTMLResponse(html, status_code=status_code)

    def _unknown(self, name: str) -> HTMLResponse:
        html = self.env.get_template(TEMPLATE).render(
            title="No such topic", html=None, missing=name, headings=(),
            topics=manual.topics(), groups=manual.groups(), current=None)
        return HTMLResponse(html, status_code=404)


def _scrolling_tables(html: str) -> str:
    """Each table in a box of its own that scrolls sideways: a wide one never
    makes the page wider than a phone. (The Markdown renderer writes bare
    `<table>` tags and passes no raw HTML through, so every one is a table's.)"""
    return html.replace("<table>", '<div class="scroll"><table>').replace(
        "</table>", "</table></div>")
