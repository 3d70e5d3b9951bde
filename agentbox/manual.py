"""The manual: the Markdown topics in `agentbox/docs/`, shipped with the package.

The page serves them rendered at `/docs` (agentbox.http.docs) and `agentbox docs`
prints them. `docs/index.md` is the table of contents: one line per topic,
`- [Title](name.md): what it covers`, in reading order, under headings that
group them (a musician's topics first, then the developers' and operators'); a
topic is a file listed there. Links between topics are written as relative `.md`
links, which work where the files are read (a repository's web view) and are
rewritten to `/docs/...` when rendered. Headings get the ids a repository's web
view gives them, so that `review.md#the-page-for-musicians` finds the same heading
in both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

INDEX = "index"
# `- [Getting started](getting-started.md): install, hook up your DAW, ...`
_TOPIC_LINE = re.compile(r"^- \[(?P<title>[^\]]+)\]\((?P<name>[a-z0-9][a-z0-9-]*)\.md\): "
                         r"(?P<summary>.+)$")
# A link to a topic, with or without a heading: `review.md`, `review.md#verdict`.
# `## For musicians`: the group of the topics listed below it.
_GROUP_LINE = re.compile(r"^## (?P<group>.+)$")
_TOPIC_LINK = re.compile(r"^(?P<name>[a-z0-9][a-z0-9-]*)\.md(?P<anchor>#[^\s]*)?$")
_NOT_IN_SLUG = re.compile(r"[^\w\- ]")


class UnknownTopic(LookupError):
    """No topic of the manual has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class Topic:
    name: str  # the file's name without `.md`, as in the URL: "getting-started"
    title: str
    summary: str  # one line: what the topic covers
    group: str = ""  # the heading it is listed under in the contents ("For musicians")


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str


@dataclass(frozen=True)
class Rendered:
    title: str  # the first heading's text
    html: str  # the topic below its title
    headings: tuple[Heading, ...]  # the sections (levels 2 and 3), for a table of contents


def folder() -> Traversable:
    return resources.files("agentbox") / "docs"


@lru_cache(maxsize=1)
def topics() -> tuple[Topic, ...]:
    """Every topic, in the order of the table of contents."""
    lines = (folder() / f"{INDEX}.md").read_text(encoding="utf-8").splitlines()
    found, group = [], ""
    for line in lines:
        heading = _GROUP_LINE.match(line.strip())
        if heading:
            group = heading["group"]
        listed = _TOPIC_LINE.match(line.strip())
        if listed:
            found.append(Topic(listed["name"], listed["title"], listed["summary"], group))
    return tuple(found)


def groups() -> list[tuple[str, list[Topic]]]:
    """The topics under their headings, in the contents' order."""
    grouped: dict[str, list[Topic]] = {}
    for t in topics():
        grouped.setdefault(t.group, []).append(t)
    return list(grouped.items())


def topic(name: str) -> Topic:
    for candidate in topics():
        if candidate.name == name:
            return candidate
    raise UnknownTopic(name)


def text(name: str) -> str:
    """A topic's Markdown (`index` is the table of contents)."""
    if name != INDEX:
        topic(name)  # only listed topics: a name never becomes an arbitrary path
    return (folder() / f"{name}.md").read_text(encoding="utf-8")


def for_terminal(name: str | None) -> str:
    """`agentbox docs [TOPIC]`: the list of topics, or one topic's Markdown."""
    return text(name) if name else listing()


def listing() -> str:
    """The topics under their headings: a musician's first."""
    width = max(len(t.name) for t in topics())
    lines = []
    for group, listed in groups():
        lines += [group, *(f"  {t.name.ljust(width)}  {t.title}: {t.summary}"
                           for t in listed), ""]
    return "\n".join(["The agentbox manual. Read a topic with: agentbox docs TOPIC", "",
                      *lines, "The same manual is at /docs on a running agentbox."])


def unknown_sentence(name: str) -> str:
    names = ", ".join(t.name for t in topics())
    return f"The manual has no topic named {name!r}. Its topics: {names}."


@lru_cache(maxsize=64)
def render(name: str) -> Rendered:
    """A topic as HTML: headings with ids, links between topics pointing at `/docs/`."""
    source = text(name)
    parser = markdown()
    tokens = parser.parse(source)
    headings = _add_heading_ids(tokens)
    _point_links_at_pages(tokens)
    _no_empty_headers(tokens)
    title = next((h.text for h in headings if h.level == 1), name)
    html = parser.renderer.render(_without_title(tokens), parser.options, {})
    # A block wider than the page scrolls in its box: focusable, so that a keyboard
    # can scroll it too (axe-core's scrollable-region-focusable).
    html = html.replace("<pre><code", '<pre tabindex="0"><code')
    return Rendered(title, html, tuple(h for h in headings if h.level in (2, 3)))


def markdown() -> MarkdownIt:
    """CommonMark with tables; raw HTML is shown as text, never passed through."""
    from markdown_it import MarkdownIt  # here: the CLI's other commands start without it

    return MarkdownIt("commonmark", {"html": False}).enable("table")


def slug(text: str, seen: dict[str, int]) -> str:
    """A heading's id as a repository's web view makes it: lower case, punctuation
    dropped, spaces as hyphens; a repeated one gets -1, -2, ..."""
    base = _NOT_IN_SLUG.sub("", text.lower()).replace(" ", "-")
    count = seen.get(base, 0)
    seen[base] = count + 1
    return base if count == 0 else f"{base}-{count}"


def heading_texts(source: str) -> list[tuple[int, str]]:
    """Every heading of a Markdown text as (level, plain text)."""
    tokens = markdown().parse(source)
    return [(int(tokens[i].tag[1]), _plain(tokens[i + 1]))
            for i, token in enumerate(tokens) if token.type == "heading_open"]


def anchors(source: str) -> set[str]:
    """The ids of a Markdown text's headings."""
    seen: dict[str, int] = {}
    return {slug(text, seen) for _, text in heading_texts(source)}


def _add_heading_ids(tokens: list[Token]) -> list[Heading]:
    seen: dict[str, int] = {}
    headings = []
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            words = _plain(tokens[i + 1])
            anchor = slug(words, seen)
            token.attrSet("id", anchor)
            headings.append(Heading(int(token.tag[1]), words, anchor))
    return headings


def _without_title(tokens: list[Token]) -> list[Token]:
    """The tokens less the first level-1 heading (the page shows the title itself)."""
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == "h1":
            return tokens[:i] + tokens[i + 3:]  # heading_open, inline, heading_close
    return tokens


def _plain(inline: Token) -> str:
    """The text of an inline token as a reader sees it (code spans without backticks)."""
    parts = []
    for child in inline.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return "".join(parts).strip()


def _no_empty_headers(tokens: list[Token]) -> None:
    """A table's empty header cell (over a column of row names) as a plain cell: a
    header that names nothing is noise to a screen reader."""
    for i, token in enumerate(tokens[:-2]):
        if token.type == "th_open" and not tokens[i + 1].content.strip():
            token.tag = tokens[i + 2].tag = "td"


def _point_links_at_pages(tokens: list[Token]) -> None:
    for token in tokens:
        for child in token.children or []:
            if child.type != "link_open":
                continue
            match = _TOPIC_LINK.match(str(child.attrGet("href") or ""))
            if match:
                child.attrSet("href", f"/docs/{match['name']}{match['anchor'] or ''}")
