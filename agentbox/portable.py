"""Everything that differs between macOS, Windows and Linux, in one place.

The rest of agentbox never asks which OS it runs on: it asks this module for
the data directory's lock, a durable flush, a clock that counts sleep, a lower
priority, a way to ignore the terminal's Ctrl-C, a graceful stop, the event
loop, and the path a file:// URL names. Each choice is made once, at import,
from `sys.platform`, so a test can import this module with the platform
reported as another OS's and see what it picks there.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
import platform
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import filelock

log = logging.getLogger("agentbox.portable")

PLATFORM = sys.platform
"""For code that must name the OS's own tools (which service manager starts
agentbox at login); everything else asks for what it needs below."""
WINDOWS = PLATFORM == "win32"
MACOS = PLATFORM == "darwin"
LINUX = PLATFORM.startswith("linux")

# -- the data directory's lock --------------------------------------------------------


class LockHeld(Exception):
    """Another process holds the lock."""


class HeldLock:
    """A lock held until `close()` (or until the process ends, however it ends)."""

    def __init__(self, lock: filelock.BaseFileLock) -> None:
        self._lock = lock

    def close(self) -> None:
        self._lock.release(force=True)


def hold_lock(path: Path) -> HeldLock:
    """Take the lock file `path` for this process, or raise LockHeld at once.

    filelock picks the OS's own lock: flock(2) on Linux and macOS, LockFileEx on
    Windows. Both end with the process, so a crash never leaves a stale lock.
    """
    import filelock  # here: only the server and the store take the lock

    lock = filelock.FileLock(str(path), thread_local=False, mode=PRIVATE_FILE)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise LockHeld(str(path)) from None
    return HeldLock(lock)


# -- private files --------------------------------------------------------------------

PRIVATE_DIRECTORY = 0o700
PRIVATE_FILE = 0o600
"""POSIX modes of agentbox's folders and files: its user's alone. On Windows the
user's profile folders, where platformdirs puts agentbox's, already keep other
users out, and what is made inside inherits their ACL: the modes do nothing there."""


def private_directory(path: Path) -> None:
    """Make the folder `path` (and missing parents) if missing; one made here is its
    user's alone."""
    path.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)


def private_file(path: Path) -> None:
    """Make `path` empty and its user's alone, unless it exists (so that what opens it
    next, SQLite say, keeps that mode: SQLite gives its -wal and -shm files the
    database file's)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))


def others_may_change(path: Path) -> str | None:
    """POSIX: why another account could change `path`, in a few words with its mode
    (another account owns it, or its group or everyone may write it); None when only
    this user (or root) can, or there is nothing there. Windows: None (its ACLs are
    not read)."""
    if WINDOWS:
        return None
    try:
        found = path.stat()
    except OSError:
        return None
    mode = f"mode {stat.S_IMODE(found.st_mode):04o}"
    if found.st_uid not in (os.getuid(), 0):  # type: ignore[attr-defined,unused-ignore]
        return f"owned by another account (uid {found.st_uid}, {mode})"
    if found.st_mode & 0o022:
        return f"writable by {'everyone' if found.st_mode & 0o002 else 'its group'} ({mode})"
    return None


def make_private(path: Path, mode: int) -> int | None:
    """POSIX: if `path` lets anyone but its owner in and this user owns it, set it to
    `mode` and return the mode it had; else None (Windows: always None)."""
    if WINDOWS:
        return None
    found = path.lstat()
    if found.st_uid != os.getuid() or not found.st_mode & 0o077:  # type: ignore[attr-defined,unused-ignore]
        return None
    os.chmod(path, mode)
    return found.st_mode & 0o777


# -- a file itself, never what a link points to -----------------------------------------

_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX; Windows has none
# POSIX: a FIFO swapped in for a file must not block the open; Windows: no newline
# translation.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


class NotTheFile(OSError):
    """The path names a symlink, or something other than a regular file."""


def open_unfollowed(path: Path) -> int:
    """A read-only descriptor of the regular file at `path` itself, never of what a
    symlink there points to (NotTheFile, or OSError when there is nothing). POSIX
    opens with O_NOFOLLOW; Windows, which has no such flag, looks at the path first
    and then checks that the file it opened is the one it looked at, so that a link
    swapped in between is found too."""
    seen = None
    if not _NO_FOLLOW:
        seen = os.lstat(path)
        if not stat.S_ISREG(seen.st_mode):
            raise NotTheFile(f"{path} is not a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS | _NO_FOLLOW)
    except OSError as exc:
        if _NO_FOLLOW and os.path.islink(path):
            raise NotTheFile(f"{path} is a symbolic link") from exc
        raise
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or (
            seen is not None and (seen.st_dev, seen.st_ino) != (opened.st_dev, opened.st_ino)):
        os.close(fd)
        raise NotTheFile(f"{path} is not the regular file it was")
    return fd


# -- durable flush --------------------------------------------------------------------


def _fsync(fd: int) -> None:
    os.fsync(fd)  # Linux: fsync(2); Windows: _commit, which is FlushFileBuffers


def _full_fsync(fd: int) -> None:
    """macOS's fsync hands the data to the drive, whose cache a power cut can still
    lose; F_FULLFSYNC also has the drive write its cache out."""
    import fcntl

    try:
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined,unused-ignore]
    except OSError:  # a file system without it (some network shares): the best there is
        os.fsync(fd)


durable_flush: Callable[[int], None] = _full_fsync if MACOS else _fsync
"""Put what was written to file descriptor `fd` on disk, so a power cut keeps it."""


def flush_directory(path: Path) -> None:
    """Make a rename or a new file in `path` last (POSIX needs the directory's own
    flush; Windows cannot open a directory this way, and NTFS journals it)."""
    if WINDOWS:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        durable_flush(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text`: readers see the old file or the new one, never
    half, and the new one is on disk when this returns."""
    fresh = path.with_name(path.name + ".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        durable_flush(f.fileno())
    os.replace(fresh, path)
    flush_directory(path.parent)


SQLITE_FULLFSYNC = MACOS


class _SqlConnection(Protocol):
    """What make_sqlite_durable needs of a connection (the driver itself is the store's)."""

    def execute(self, sql: str, /) -> Any: ...


def make_sqlite_durable(conn: _SqlConnection) -> None:
    """On macOS, SQLite's own syncs (commits and checkpoints) use F_FULLFSYNC;
    elsewhere its fsync (Linux) and FlushFileBuffers (Windows) already are."""
    if SQLITE_FULLFSYNC:
        conn.execute("PRAGMA fullfsync = ON")
        conn.execute("PRAGMA checkpoint_fullfsync = ON")


# -- a clock that counts sleep --------------------------------------------------------


def _boottime() -> float:
    """Linux: CLOCK_BOOTTIME is CLOCK_MONOTONIC plus the time spent suspended."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _monotonic_with_sleep() -> float:
    """macOS: clock_gettime(3) documents CLOCK_MONOTONIC as continuing to increment
    while the system is asleep (so does CLOCK_MONOTONIC_RAW, which is not kept in
    step with NTP's rate; CLOCK_UPTIME_RAW stops). Python's `time.monotonic` there
    reads mach_absolute_time, which is CLOCK_UPTIME_RAW: it stops while the Mac
    sleeps, which is why it is not used."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@cache
def _windows_interrupt_time() -> Any:
    import ctypes  # here: each use is one platform's, and `agentbox runs` uses none

    return ctypes.WinDLL("kernel32").QueryInterruptTimePrecise  # type: ignore[attr-defined,unused-ignore]


def _interrupt_time() -> float:
    """Windows: the interrupt-time count (100 ns units) includes sleep and
    hibernation, the documented difference from QueryUnbiasedInterruptTime. Python's
    `time.monotonic` reads QueryPerformanceCounter since 3.13 (GetTickCount64
    before), whose behaviour across sleep Microsoft does not document as plainly."""
    import ctypes

    count = ctypes.c_ulonglong()
    _windows_interrupt_time()(ctypes.byref(count))
    return count.value / 10_000_000


def _pick_clock() -> Callable[[], float]:
    if LINUX:
        return _boottime
    if MACOS:
        return _monotonic_with_sleep
    if WINDOWS:
        try:
            _windows_interrupt_time()
        except (AttributeError, OSError):  # before Windows 10
            return time.monotonic
        return _interrupt_time
    return time.monotonic  # another OS: steady, though it may stop in sleep


since_boot: Callable[[], float] = _pick_clock()
"""Seconds from an arbitrary start that never step and keep counting while the
machine sleeps: leases and retry times stay right across a night's sleep."""


# -- priority and signals ------------------------------------------------------------

NICE = 10
IDLE_PRIORITY_CLASS = 0x40
BELOW_NORMAL_PRIORITY_CLASS = 0x4000
# ioprio_set(2) has no wrapper in Python or libc; its number differs per architecture.
IOPRIO_SET = {"x86_64": 251, "amd64": 251, "i686": 289, "i386": 289, "aarch64": 30,
              "arm64": 30, "riscv64": 30, "loongarch64": 30, "armv7l": 314,
              "ppc64le": 273, "s390x": 282}
IOPRIO_IDLE = 3 << 13  # IOPRIO_CLASS_IDLE, level 0
IOPRIO_WHO_PROCESS = 1


def _nice_posix() -> None:
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current < NICE:  # never raise a priority someone already lowered further
        os.setpriority(os.PRIO_PROCESS, 0, NICE)


def _idle_io_linux() -> None:
    import ctypes

    number = IOPRIO_SET.get(platform.machine().lower())
    if number is None:
        raise OSError(f"no ioprio_set number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")


def _below_normal_windows() -> None:
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined,unused-ignore]
    process = kernel32.GetCurrentProcess()
    if kernel32.GetPriorityClass(process) in (IDLE_PRIORITY_CLASS,
                                              BELOW_NORMAL_PRIORITY_CLASS):
        return
    if not kernel32.SetPriorityClass(process, BELOW_NORMAL_PRIORITY_CLASS):
        raise OSError("SetPriorityClass failed")


def _priority_steps() -> tuple[Callable[[], None], ...]:
    if WINDOWS:
        return (_below_normal_windows,)
    if LINUX:
        return (_nice_posix, _idle_io_linux)
    return (_nice_posix,)


PRIORITY_STEPS = _priority_steps()


def lower_priority() -> None:
    """Run this process at low priority: CPU (nice 10 on POSIX, below normal on
    Windows) and, on Linux, disk (the idle I/O class). Call it first thing in the
    process: on Linux both are per thread, and threads started later inherit them.
    Never raises; a step the OS refuses is logged at debug."""
    for step in PRIORITY_STEPS:
        try:
            step()
        except (OSError, AttributeError, ValueError) as exc:
            log.debug("cannot lower priority", extra={"step": step.__name__,
                                                       "reason": str(exc)})


# A thread's own priority, where it differs from the process's (macOS: a QoS class;
# Windows: background mode, which lowers its I/O and memory priority too).
QOS_CLASS_UTILITY = 0x11
THREAD_MODE_BACKGROUND_BEGIN = 0x00010000


def _utility_qos_macos() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.pthread_set_qos_class_self_np(QOS_CLASS_UTILITY, 0) != 0:
        raise OSError(ctypes.get_errno(), "pthread_set_qos_class_self_np")


def _background_thread_windows() -> None:
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined,unused-ignore]
    if not kernel32.SetThreadPriority(kernel32.GetCurrentThread(),
                                      THREAD_MODE_BACKGROUND_BEGIN):
        raise OSError("SetThreadPriority failed")


def _thread_priority_steps() -> tuple[Callable[[], None], ...]:
    if WINDOWS:
        return (_background_thread_windows,)
    if LINUX:  # nice and the I/O class are per thread on Linux
        return (_nice_posix, _idle_io_linux)
    if MACOS:
        return (_utility_qos_macos,)
    return ()  # elsewhere setpriority would lower the whole process


THREAD_PRIORITY_STEPS = _thread_priority_steps()


def lower_thread_priority() -> None:
    """Run the calling thread, and no other, at low priority: background work in a
    process that also serves (CPU nice 10 and idle I/O on Linux, the utility QoS
    class on macOS, background mode on Windows). Never raises; a step the OS
    refuses is logged at debug."""
    for step in THREAD_PRIORITY_STEPS:
        try:
            step()
        except (OSError, AttributeError, ValueError) as exc:
            log.debug("cannot lower the thread's priority",
                      extra={"step": step.__name__, "reason": str(exc)})


def ignore_interrupts() -> None:
    """Ignore the terminal's Ctrl-C (SIGINT on POSIX, CTRL_C_EVENT on Windows, which
    Python delivers as SIGINT): it reaches every process of the foreground group,
    and a worker must stop when its parent says so, not halfway through a file."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError as exc:  # not the main thread
        log.debug("cannot ignore interrupts", extra={"reason": str(exc)})


def _sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)


def _ctrl_break(pid: int) -> None:
    # Windows has no SIGTERM that one process can send another (os.kill with it
    # is TerminateProcess); uvicorn stops gracefully on CTRL_BREAK, which reaches
    # a process started with CREATE_NEW_PROCESS_GROUP.
    os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined,unused-ignore]


request_stop: Callable[[int], None] = _ctrl_break if WINDOWS else _sigterm
"""Ask the process `pid` (an agentbox server) to stop gracefully."""


def raise_open_files_limit() -> None:
    """Let this process open as many files and sockets as the OS allows it (the soft
    limit up to the hard one: macOS starts programs at 256, below the connections
    agentbox takes). Windows has no such per-process limit on sockets."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else OPEN_FILES_WANTED
    if MACOS:  # its kernel refuses more than OPEN_MAX for RLIMIT_NOFILE
        wanted = min(wanted, OPEN_FILES_WANTED)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError) as exc:
        log.debug("cannot raise the open files limit", extra={"reason": str(exc)})


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening, for the server to serve on:
    bound before anything says agentbox is listening. On POSIX SO_REUSEADDR (a
    restart finds the port free while old connections linger, as uvicorn's own);
    on Windows SO_EXCLUSIVEADDRUSE, since its SO_REUSEADDR would let two servers
    share the port. OSError as bind(2) raises it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if WINDOWS:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined]
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def address_in_use(exc: OSError) -> bool:
    """Whether a bind failed because another socket holds the address."""
    return exc.errno == errno.EADDRINUSE or getattr(exc, "winerror", None) == 10048


OPEN_FILES_WANTED = 10_240  # macOS's OPEN_MAX; where the hard limit is unlimited


def user_id() -> int | None:
    """The user's numeric id where the OS has one (launchd's gui/<uid> domain); None on
    Windows."""
    getuid = getattr(os, "getuid", None)
    return None if getuid is None else int(getuid())


# -- the event loop and file URLs ----------------------------------------------------

EVENT_LOOP = "auto"
"""uvicorn's `loop`: uvloop where it is installed (uvicorn[standard] installs it
on Linux and macOS, not on Windows), else asyncio's own loop."""


def event_loop() -> str:
    """The loop EVENT_LOOP gives here, for logs and tests."""
    try:
        importlib.import_module("uvloop")
    except ImportError:
        return "asyncio"
    return "uvloop"


def path_from_url(url_path: str) -> str:
    """The local path that the path part of a file:// URL names, through the
    standard library's conversion for this OS: `/home/me/a%20b.wav` is
    `/home/me/a b.wav`; on Windows `/C:/Mixes/a.wav` is `C:\\Mixes\\a.wav`.
    Raises OSError for a path Windows cannot name."""
    if WINDOWS:
        import nturl2path as conversion  # what urllib.request uses on Windows
    else:
        import urllib.request as conversion  # type: ignore[no-redef]
    return str(conversion.url2pathname(url_path))


# -- memory --------------------------------------------------------------------------

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt(3) parameters
REUSED_MEMORY_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit systems


def reuse_freed_memory() -> None:
    """Have this process keep the memory it frees for its next allocations, where
    glibc maps each large block afresh and returns it when freed, so the kernel
    zeroes every page of it again on first touch: numerical work that allocates a
    few megabytes per block of audio spent a tenth of its CPU so. On Linux with
    glibc (blocks up to REUSED_MEMORY_BYTES come from the heap, which keeps that
    much free); nothing elsewhere. Never raises."""
    import ctypes

    if not LINUX:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt(M_MMAP_THRESHOLD, REUSED_MEMORY_BYTES)
        mallopt(M_TRIM_THRESHOLD, REUSED_MEMORY_BYTES)
    except (OSError, AttributeError) as exc:  # another C library
        log.debug("cannot keep freed memory", extra={"reason": str(exc)})
