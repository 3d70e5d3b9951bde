"""`agentbox tray`: agentbox's icon in the menu bar (macOS) or the notification area
(Windows, Linux desktops), for the musician between notifications.

The icon says at a glance whether agentbox is running, idle or reviewing, and the
last review's verdict, by shape as well as colour (a colour-blind eye reads the
shape): a hollow grey ring, not running; a grey disc, idle with no review yet; a
blue disc with three dots, reviewing; a green disc with a tick, pass; an amber
triangle with a bar, warn; a red square with a cross, fail. Its menu: the last
five reviews (file, verdict, time: one opens its review page), open agentbox,
pause or resume the watched folders, each folder with its state, start agentbox
(when it is not running), quit.

A client of a running agentbox like the CLI (agentbox.client, never the store): it
follows the page's live updates (`GET /ui/stream`), so it wakes when the server
says something (a run's transition, the stats every few seconds), not on a timer
of its own. When nothing answers, it looks again with backoff (1 s doubling to
`RECONNECT_MAX_SECONDS`), which is all it does while agentbox is not running.

The tray library is pystray (the `tray` extra). Where there is no tray (no desktop
session, an X display without a tray host), `agentbox tray` says so in one
sentence and exits 2 (`NoTray`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import webbrowser
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentbox import browser, portable
from agentbox.client import AgentboxError, Client, LiveUpdate, NotProven
from agentbox.desktop.answers import WatchState
from agentbox.logs import get_logger, one_line
from agentbox.models import RunView
from agentbox.runs import TERMINAL

log = get_logger("tray")

RECENT_REVIEWS = 5  # reviews in the menu
RUNS_LOOKED_AT = 50  # the newest runs searched for them (other agents' runs between)
RECONNECT_FIRST_SECONDS = 1.0
RECONNECT_MAX_SECONDS = 30.0  # while agentbox is not running: one look this often
ICON_SIZE = 64  # pixels: the hosts scale it down (22 on most Linux panels)
MIX_REVIEW_AGENT = "agentbox.review.agent:mix_review"
VERDICTS = ("pass", "warn", "fail")
COULD_NOT = "couldn't review"  # a review that failed, as the menu says it (no run state)
INSTALL = ("agentbox tray needs the tray library, an optional part: pip install "
           "'agentbox[tray]'")


class NoTray(Exception):
    """This desktop has no tray to show an icon in (the sentence says why)."""


# -- what the icon and menu show -------------------------------------------------------------


@dataclass(frozen=True)
class Review:
    """One finished review, as the menu lists it."""

    run_id: str
    file: str
    verdict: str  # pass, warn, fail, or what became of the export (couldn't review)
    at: str  # when it finished, as people read it

    @property
    def label(self) -> str:
        return f"{self.file} · {self.verdict} · {self.at}"


@dataclass(frozen=True)
class Folder:
    path: str
    said: str  # watching, not there, ...


@dataclass(frozen=True)
class Look:
    """Everything the icon and its menu show; a new Look is drawn only when it differs."""

    running: bool = False
    reviewing: bool = False
    reviews: tuple[Review, ...] = ()
    paused: bool = False
    folders: tuple[Folder, ...] = ()

    @property
    def state(self) -> str:
        """down, reviewing, idle, or the last review's verdict (pass, warn, fail)."""
        if not self.running:
            return "down"
        if self.reviewing:
            return "reviewing"
        last = self.reviews[0].verdict if self.reviews else ""
        return last if last in VERDICTS else ("fail" if last == COULD_NOT else "idle")

    @property
    def title(self) -> str:
        """The icon's tooltip (and, on X, its window's name)."""
        if not self.running:
            return "agentbox: not running"
        said = "reviewing" if self.reviewing else "idle"
        if self.reviews:
            said += f"; last review: {self.reviews[0].verdict} · {self.reviews[0].file}"
        return f"agentbox: {said}" + (" (watch folders paused)" if self.paused else "")

    def menu_lines(self) -> list[str]:
        """The menu as text, top to bottom (what the log says of it)."""
        lines = [r.label for r in self.reviews] or ["no reviews yet"]
        if self.running:
            lines.append("Open agentbox")
            lines.append("Resume watch folders" if self.paused else "Pause watch folders")
            lines += [f"{f.path}: {'paused' if self.paused else f.said}"
                      for f in self.folders]
        else:
            lines.append("Start agentbox")
        return [*lines, "Quit"]


def reviews_of(runs: Sequence[RunView]) -> tuple[Review, ...]:
    """The newest finished mix reviews among `runs` (newest first)."""
    from agentbox.review import digest
    from agentbox.review.figures import local_time

    found = []
    for run in runs:
        if run.agent != MIX_REVIEW_AGENT or run.status not in TERMINAL:
            continue
        shown = run.as_json()
        # a musician's words: "couldn't review", never the run's state
        verdict = digest.run_verdict(shown)
        if verdict not in VERDICTS:
            verdict = "no review" if run.status == "succeeded" else COULD_NOT
        found.append(Review(run.run_id, digest.file_name(shown) or run.get("project") or "a mix",
                            verdict,
                            local_time(run.completed_at or run.updated_at)))
    return tuple(found[:RECENT_REVIEWS])


def folders_of(state: WatchState) -> tuple[Folder, ...]:
    return tuple(Folder(one_line(f.path), one_line(f.said)) for f in state.folders)


# -- the icon's picture ----------------------------------------------------------------------

COLOURS = {"down": (128, 128, 128), "idle": (150, 150, 150), "reviewing": (40, 110, 220),
           "pass": (30, 160, 70), "warn": (235, 160, 0), "fail": (210, 40, 40)}
WHITE = (255, 255, 255, 255)


def picture(state: str, size: int = ICON_SIZE) -> Any:
    """The icon for `state` (a PIL image): a shape of its own for each, and a colour."""
    from PIL import Image, ImageDraw

    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    colour = (*COLOURS[state], 255)
    m, s, w = size // 16, size, max(2, size // 10)  # margin, size, stroke
    if state == "down":
        draw.ellipse((m, m, s - m, s - m), outline=colour, width=w)
    elif state == "warn":
        draw.polygon([(s // 2, m), (s - m, s - m), (m, s - m)], fill=colour)
        draw.line([(s // 2, s * 3 // 8), (s // 2, s * 11 // 16)], fill=WHITE, width=w)
        draw.ellipse((s // 2 - w // 2, s * 25 // 32 - w // 2, s // 2 + w // 2,
                      s * 25 // 32 + w // 2), fill=WHITE)
    elif state == "fail":
        draw.rectangle((m, m, s - m, s - m), fill=colour)
        draw.line([(s // 4, s // 4), (s * 3 // 4, s * 3 // 4)], fill=WHITE, width=w)
        draw.line([(s * 3 // 4, s // 4), (s // 4, s * 3 // 4)], fill=WHITE, width=w)
    else:
        draw.ellipse((m, m, s - m, s - m), fill=colour)
        if state == "pass":
            draw.line([(s * 5 // 16, s // 2), (s * 7 // 16, s * 11 // 16),
                       (s * 11 // 16, s * 5 // 16)], fill=WHITE, width=w, joint="curve")
        elif state == "reviewing":
            for x in (s * 5 // 16, s // 2, s * 11 // 16):
                draw.ellipse((x - w, s // 2 - w, x + w, s // 2 + w), fill=WHITE)
    return image


# -- following the server --------------------------------------------------------------------


@dataclass
class Follower:
    """Follows a running agentbox's live updates and keeps its Look; `changed` is told
    each new one (from this thread: the tray redraws)."""

    client: Client
    changed: Callable[[Look], None]
    look: Look = field(default_factory=Look)
    # Told at each look that found agentbox not running (the tray checks its icon).
    waiting: Callable[[], None] = lambda: None
    _stop: threading.Event = field(default_factory=threading.Event)
    _figures: dict[str, Any] = field(default_factory=dict)  # the apps' figures last seen

    def run(self) -> None:
        """Until `stop`: follow the stream; when it ends or nothing answers, say not
        running and look again with backoff."""
        delay = RECONNECT_FIRST_SECONDS
        while not self._stop.is_set():
            try:
                for update in self._updates():
                    delay = RECONNECT_FIRST_SECONDS
                    self._take(update)
            except AgentboxError as exc:
                log.debug("agentbox not reachable", extra={"error": one_line(exc)[:200]})
            except Exception:
                if self._stop.is_set():
                    return  # its client closed under the stream: quitting
                raise
            self.show(replace(self.look, running=False, reviewing=False))
            self.waiting()
            self._stop.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self.client.close()  # ends a stream being read

    def _updates(self) -> Iterator[LiveUpdate]:
        self._refresh(runs=True, watch=True)
        for update in self.client.live():
            if self._stop.is_set():
                return
            yield update

    def _take(self, update: LiveUpdate) -> None:
        if update.kind == "stats" and isinstance(update.data, dict):
            figures = {k: v for k, v in update.data.items() if k.startswith("watch")}
            watch_changed, self._figures = figures != self._figures, figures
            self._refresh(reviewing=bool(update.data.get("active")), watch=watch_changed)
        elif update.kind == "run" and isinstance(update.data, dict):
            finished = update.data.get("status") in TERMINAL
            self._refresh(reviewing=None if finished else True, runs=finished)

    def _refresh(self, reviewing: bool | None = None, runs: bool = False,
                 watch: bool = False) -> None:
        look = replace(self.look, running=True)
        if reviewing is not None:
            look = replace(look, reviewing=reviewing)
        if runs:
            look = replace(look, reviews=reviews_of(self.client.runs(RUNS_LOOKED_AT).runs))
        if watch:
            look = self._with_watch(look)
        self.show(look)

    def _with_watch(self, look: Look) -> Look:
        try:
            state = self.client.watch_state()
        except AgentboxError:
            return look  # an agentbox without the desktop app: no folders to show
        return replace(look, paused=state.paused, folders=folders_of(state))

    def show(self, look: Look) -> None:
        if look != self.look:
            self.look = look
            self.changed(look)


# -- the tray --------------------------------------------------------------------------------


def check_tray(environ: dict[str, str] | None = None) -> None:
    """NoTray, with the reason in one sentence, when this desktop has no tray; else the
    tray library is importable (on macOS and Windows a tray is always there)."""
    env = os.environ if environ is None else environ
    if portable.PLATFORM.startswith("linux"):
        if not env.get("DISPLAY"):
            raise NoTray("agentbox tray: this session has no desktop with a tray (no X "
                         "display: DISPLAY is not set).")
        _x_tray_or_indicator(env["DISPLAY"])
    try:
        import pystray  # noqa: F401
    except ImportError:
        raise NoTray(INSTALL) from None


def _x_tray_or_indicator(display_name: str) -> None:
    """On X: a tray host owns the system tray selection (XEmbed), or PyGObject is there
    for pystray's AppIndicator backend (whose host is the desktop's own)."""
    try:
        import Xlib.display
        import Xlib.error
    except ImportError:
        raise NoTray(INSTALL) from None
    try:
        display = Xlib.display.Display(display_name)
    except (Xlib.error.DisplayError, OSError) as exc:
        raise NoTray(f"agentbox tray: the X display {display_name} cannot be opened "
                     f"({one_line(exc)[:120]}).") from None
    try:
        tray = display.intern_atom(f"_NET_SYSTEM_TRAY_S{display.get_default_screen()}")
        if display.get_selection_owner(tray) != 0:
            return
    finally:
        display.close()
    if not _indicator_backend():
        raise NoTray(f"agentbox tray: the desktop on {display_name} has no tray (no "
                     "system tray host owns the display's tray).")


def _indicator_backend() -> bool:
    try:
        import gi  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("PYSTRAY_BACKEND", "appindicator") == "appindicator"


class Tray:
    """The icon, its menu and the follower behind them."""

    def __init__(self, client: Client, start_server: Callable[[], None] | None = None,
                 open_url: Callable[[str], object] = webbrowser.open) -> None:
        import pystray

        self.client = client
        self.open_url = open_url
        self.start_server = start_server or (lambda: start_agentbox(client.config_file))
        self.follower = Follower(client, self._changed, waiting=self._docked_again)
        self.icon = pystray.Icon("agentbox", picture("down"), "agentbox: not running",
                                 menu=pystray.Menu(self._items))
        self._thread: threading.Thread | None = None

    def _docked_again(self) -> None:
        """On X, an icon the tray has not shown asks to be docked again. Its first
        request is lost now and then (the host starting, say); the icon is redrawn,
        which docks it, only when something changes: agentbox not running from the
        start changes nothing, and the icon stayed unseen. Elsewhere: nothing."""
        window = getattr(self.icon, "_window", None)
        if not type(self.icon).__module__.endswith("_xorg") or window is None:
            return
        from Xlib import X

        try:
            if window.get_attributes().map_state != X.IsViewable:
                self.icon.icon = picture(self.follower.look.state)  # docks, then draws
        except Exception as exc:  # the display gone: the next look tries again
            log.warning("the tray icon could not be docked again",
                        extra={"error": f"{type(exc).__name__}: {one_line(exc)[:200]}"})

    def run(self) -> None:
        """Show the icon and follow agentbox until Quit (blocks: the tray's own loop,
        which macOS wants on the main thread)."""
        self.icon.run(setup=self._setup)

    def _setup(self, icon: Any) -> None:
        icon.visible = True
        log.info("tray shown", extra={"status": "down"})
        self._thread = threading.Thread(target=self.follower.run, name="agentbox-tray",
                                        daemon=True)
        self._thread.start()

    def quit(self) -> None:
        self.follower.stop()
        self.icon.stop()

    def _changed(self, look: Look) -> None:
        log.info("tray changed", extra={"status": look.state, "title": look.title,
                                        "menu": look.menu_lines()})
        try:
            # The title first: on X it is the icon window's name, which goes out with
            # the next request the backend flushes (the icon's drawing does).
            self.icon.title = self._titled(look.title)
            self.icon.icon = picture(look.state)
            self.icon.update_menu()
        except Exception as exc:  # the host went away, say: the next change tries again
            log.warning("the tray icon could not be updated",
                        extra={"error": f"{type(exc).__name__}: {one_line(exc)[:200]}"})

    def _titled(self, title: str) -> str:
        """On X the title is the icon window's name, which is Latin-1."""
        if type(self.icon).__module__.endswith("_xorg"):
            return title.encode("latin-1", "replace").decode("latin-1")
        return title

    def _items(self) -> Iterator[Any]:
        """The menu, made afresh from the Look each time it opens."""
        from pystray import Menu, MenuItem

        look = self.follower.look
        for review in look.reviews:
            yield MenuItem(review.label, self._opener(f"/ui/runs/{review.run_id}"))
        if not look.reviews:
            yield MenuItem("no reviews yet", None, enabled=False)
        yield Menu.SEPARATOR
        if look.running:
            yield MenuItem("Open agentbox", self._opener("/"), default=True)
            yield MenuItem("Resume watch folders" if look.paused else "Pause watch folders",
                           self._toggle_pause)
            for folder in look.folders:
                yield MenuItem(f"{folder.path}: {'paused' if look.paused else folder.said}",
                               None, enabled=False)
        else:
            yield MenuItem("Start agentbox", lambda: self.start_server(), default=True)
        yield Menu.SEPARATOR
        yield MenuItem("Quit", self.quit)

    def _opener(self, path: str) -> Callable[[], None]:
        return lambda: self._open(path)

    def _open(self, path: str) -> None:
        """The page at `path`, through a one-time login link handed over in a file of
        the user's (agentbox.browser: never in the browser's arguments), from a thread
        of its own (it waits for the browser); the plain address when no link can be
        had."""
        threading.Thread(target=self._open_logged_in, args=(path,), name="agentbox-open",
                         daemon=True).start()

    def _open_logged_in(self, path: str) -> None:
        try:
            browser.open_logged_in(self.client, self.open_url, next_path=path)
        except NotProven as exc:  # another's program: not even its address is opened
            log.warning("the page was not opened", extra={"error": one_line(exc)[:300]})
        except (AgentboxError, OSError):
            self.open_url(self.client.url + path)

    def _toggle_pause(self) -> None:
        try:
            state = (self.client.resume_watch() if self.follower.look.paused
                     else self.client.pause_watch())
        except AgentboxError as exc:
            log.warning("the watch folders could not be paused or resumed",
                        extra={"error": one_line(exc)[:200]})
            return
        self.follower.show(replace(self.follower.look, paused=state.paused,
                                    folders=folders_of(state)))


def start_agentbox(config_file: Path | None = None) -> None:
    """`agentbox serve` in the background with the tray's config, as the service would
    (the one-file build is agentbox itself)."""
    # -P: not the working folder on the import path (a module there named in `apps`
    # would run as the user), as the service runs it
    command = ([sys.executable, "serve"] if getattr(sys, "frozen", False)
               else [sys.executable, "-P", "-m", "agentbox", "serve"])
    if config_file is not None:
        command += ["--config", str(config_file)]
    subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
