"""The one place that speaks to the operating system's process controls, so that
the rest of agentbox runs the same on Linux, macOS and Windows."""

from __future__ import annotations

import logging
import os
import signal
import sys

log = logging.getLogger("agentbox.portable")

LOW_PRIORITY_NICE = 10  # POSIX: how far below normal background work runs
# Linux ioprio_set(2): the idle I/O class for this process (who=0 is the caller).
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_CLASS_SHIFT = 13
_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "arm64": 30, "i686": 289, "i386": 289}


def lower_priority() -> None:
    """Run this process at low priority: nice 10 on POSIX (never raising a priority
    already lower), the idle I/O class on Linux where allowed, the below-normal
    priority class on Windows. Never raises: a process that cannot lower its
    priority still does its work."""
    if sys.platform == "win32":
        _windows_below_normal()
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < LOW_PRIORITY_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, LOW_PRIORITY_NICE)
    except OSError as exc:
        log.debug("cannot lower the process priority: %s", exc)
    if sys.platform.startswith("linux"):
        _linux_idle_io()


def _linux_idle_io() -> None:
    import ctypes
    import platform

    number = _SYS_IOPRIO_SET.get(platform.machine())
    if number is None:
        log.debug("no ioprio_set syscall number known for %s", platform.machine())
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(number, _IOPRIO_WHO_PROCESS, 0,
                        _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT) != 0:
            log.debug("ioprio_set refused: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        log.debug("cannot set the idle I/O class: %s", exc)


def _windows_below_normal() -> None:
    import ctypes

    below_normal_priority_class = 0x00004000
    try:
        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined,unused-ignore]
        if not kernel32.SetPriorityClass(kernel32.GetCurrentProcess(),
                                         below_normal_priority_class):
            log.debug("SetPriorityClass refused")
    except (OSError, AttributeError) as exc:
        log.debug("cannot lower the process priority: %s", exc)


def ignore_interrupts() -> None:
    """Ignore the terminal's interrupt (Ctrl-C reaches the whole foreground process
    group; on Windows, CTRL_C goes to every process on the console): a child
    process stops when its parent tells it to, not on the keystroke meant for the
    parent."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (OSError, ValueError) as exc:  # ValueError: not the main thread
        log.debug("cannot ignore SIGINT: %s", exc)
    if sys.platform == "win32":
        import ctypes

        try:
            # SetConsoleCtrlHandler(NULL, TRUE): this process ignores CTRL_C_EVENT.
            ctypes.windll.kernel32.SetConsoleCtrlHandler(  # type: ignore[attr-defined,unused-ignore]
                None, True)
        except (OSError, AttributeError) as exc:
            log.debug("cannot ignore CTRL_C: %s", exc)
