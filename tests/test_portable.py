"""The portable layer (agentbox/portable.py): what it picks on each OS, and the
real thing on this one.

macOS and Windows cannot run here: tests.support.other_os imports every agentbox
module with the platform reported as theirs (POSIX-only modules unimportable on
"win32", Windows' kernel32 and msvcrt replaced by doubles) in a subprocess each,
and reports the choices. On Linux the choices are exercised for real: the
durable flush (seen with strace), the lock, the clock, priority, signals, and
a server without uvloop.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbox import config, portable
from agentbox.store import StorageUnavailable
from agentbox.store.sqlite import SqliteStore
from tests.conftest import ROOT, Server

PACKAGE = ROOT / "agentbox"
ALL_MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py") if path.name != "__main__.py")


def other_os(system: str, tmp_path: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.support.other_os", system,
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    assert found["platform"] == system
    assert sorted(found["modules"]) == ALL_MODULES  # every module imported there
    return found


def uvloop_here() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def test_on_windows_every_module_imports_and_the_windows_parts_are_picked(
        tmp_path: Path) -> None:
    found = other_os("win32", tmp_path)
    assert found["lock"] == "WindowsFileLock"  # LockFileEx, not flock
    assert found["flush"] == "_fsync"  # os.fsync is FlushFileBuffers there
    assert found["sqlite_fullfsync"] is False
    assert found["clock"] == "_interrupt_time"  # QueryInterruptTimePrecise, counts sleep
    assert found["clock_reads"] == 123456.7890123  # the double's 100 ns count, in seconds
    assert found["loop"] == "asyncio"  # no uvloop on Windows
    assert found["event_loop_setting"] == "auto"
    assert found["stop"] == "_ctrl_break"
    assert found["priority"] == ["_below_normal_windows"]
    assert found["path"] == "C:\\Mixes\\Night Drive.wav"
    assert found["mix_path"] == "C:\\Mixes\\a.wav"  # not /C:/Mixes/a.wav
    assert found["posix_mix_path"] == "\\Users\\me\\Mixes\\a b.wav"


def test_on_macos_every_module_imports_and_sqlite_flushes_the_drive(tmp_path: Path) -> None:
    found = other_os("darwin", tmp_path)
    assert found["lock"] == "UnixFileLock"
    assert found["flush"] == "_full_fsync"  # F_FULLFSYNC for the secret files
    assert found["clock"] == "_monotonic_with_sleep"  # CLOCK_MONOTONIC, not mach_absolute
    assert found["loop"] == uvloop_here()
    assert found["stop"] == "_sigterm"
    assert found["priority"] == ["_nice_posix"]
    assert found["posix_mix_path"] == "/Users/me/Mixes/a b.wav"
    pragmas = found["sqlite_pragmas"]  # read back from every connection the store made
    assert len(pragmas) >= 2
    assert all(p == {"fullfsync": 1, "checkpoint_fullfsync": 1, "synchronous": 2}
               for p in pragmas), pragmas


def test_on_linux_the_linux_parts_are_picked(tmp_path: Path) -> None:
    found = other_os("linux", tmp_path)
    assert (found["lock"], found["flush"], found["clock"]) == (
        "UnixFileLock", "_fsync", "_boottime")
    assert found["priority"] == ["_nice_posix", "_idle_io_linux"]
    assert found["loop"] == uvloop_here()
    assert all(p == {"fullfsync": 0, "checkpoint_fullfsync": 0, "synchronous": 2}
               for p in found["sqlite_pragmas"])


# -- nothing OS-specific outside the portable layer ----------------------------------

OS_MODULES = {"fcntl", "msvcrt", "winreg", "_winapi", "termios", "resource", "pwd", "grp",
              "ctypes", "uvloop", "nturl2path"}
OS_ATTRIBUTES = {("sys", "platform"), ("os", "name"), ("os", "fsync"), ("os", "nice"),
                 ("os", "setpriority"), ("os", "kill"), ("os", "getuid"),
                 ("os", "geteuid"), ("time", "clock_gettime"), ("signal", "signal")}


def os_specific(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]
            found += [f"import {n}" for n in names if n.split(".")[0] in OS_MODULES]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            pair = (node.value.id, node.attr)
            if pair in OS_ATTRIBUTES or (pair[0] == "time" and pair[1].startswith("CLOCK_")) \
                    or (pair[0] == "signal" and pair[1].startswith(("SIG", "CTRL_"))):
                found.append(".".join(pair))
        elif isinstance(node, ast.Constant) and node.value == "uvloop":
            found.append("'uvloop'")
    return [f"{path.relative_to(ROOT)}: {what}" for what in found]


def test_no_module_but_the_portable_layer_asks_for_os_specific_things() -> None:
    found = [line for path in sorted(PACKAGE.rglob("*.py")) if path.name != "portable.py"
             for line in os_specific(path)]
    assert found == []
    assert os_specific(PACKAGE / "portable.py")  # the check finds what it looks for


# -- the real thing on Linux ----------------------------------------------------------


def strace_fsyncs(code: str, tmp_path: Path) -> list[str]:
    """Run `code` in a fresh Python under strace; the files it fsynced, by path."""
    out = tmp_path / "strace.txt"
    done = subprocess.run(["strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-o", str(out),
                           sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line.split("<", 1)[1].split(">", 1)[0] for line in out.read_text().splitlines()
            if "fsync(" in line and "= 0" in line]


@pytest.mark.skipif(not portable.LINUX, reason="strace and fsync(2): Linux")
def test_secret_files_are_flushed_to_disk_with_their_directory(tmp_path: Path) -> None:
    home = tmp_path / "config"
    code = ("from pathlib import Path; from agentbox import config; "
            f"p = Path({str(home / 'webhook-secret')!r}); config.secret_from_file(p); "
            "config.rotate_secret(p)")
    synced = strace_fsyncs(code, tmp_path)
    secret, directory = str(home / "webhook-secret"), str(home)
    # made: the file, then its directory; rotated: the new file (renamed after), and
    # the directory again for the rename
    assert synced.count(secret) == 1 and synced.count(secret + ".new") == 1, synced
    assert synced.count(directory) == 2, synced
    assert (home / "webhook-secret").stat().st_mode & 0o777 == 0o600
    assert len(config.secrets_in_file(home / "webhook-secret")) == 2
    assert not (home / "webhook-secret.new").exists()


def test_the_data_directory_lock_turns_a_second_store_away(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = SqliteStore(tmp_path / "agentbox.sqlite3")
        await first.open()
        try:
            holder = subprocess.run(  # another process: the lock is the OS's, not a flag
                [sys.executable, "-c", "from pathlib import Path; from agentbox import "
                 f"portable; portable.hold_lock(Path({str(tmp_path / 'agentbox.lock')!r}))"],
                cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert "LockHeld" in holder.stderr
            second = SqliteStore(tmp_path / "agentbox.sqlite3")
            with pytest.raises(StorageUnavailable, match="already serving"):
                await second.open()
        finally:
            await first.close()
        again = SqliteStore(tmp_path / "agentbox.sqlite3")  # released at close
        await again.open()
        await again.close()

    asyncio.run(scenario())


def test_the_steady_clock_counts_with_the_boot_clock() -> None:
    before, wall = portable.since_boot(), time.time()
    time.sleep(0.05)
    elapsed = portable.since_boot() - before
    assert 0.05 <= elapsed < 0.05 + (time.time() - wall) + 0.01
    if portable.LINUX:  # CLOCK_BOOTTIME, which is CLOCK_MONOTONIC plus suspend
        monotonic = time.clock_gettime(time.CLOCK_MONOTONIC)
        assert portable.since_boot() >= monotonic


PRIORITY = """
import ctypes, os, platform
from agentbox import portable
portable.lower_priority()
number = {"x86_64": 252, "aarch64": 31}[platform.machine()]  # ioprio_get
libc = ctypes.CDLL(None, use_errno=True)
print(os.getpriority(os.PRIO_PROCESS, 0), libc.syscall(number, 1, 0) >> 13)
"""


@pytest.mark.skipif(not portable.LINUX, reason="nice and ioprio: Linux")
@pytest.mark.parametrize(("start", "expected"), [(0, 10), (15, 15)])
def test_lower_priority_lowers_cpu_and_disk_priority_and_never_raises_it(
        start: int, expected: int) -> None:
    # nice -n is relative to this process's niceness (a suite run under nice 10 must not
    # start the child at 25): ask for the absolute starting value.
    increment = start - os.getpriority(os.PRIO_PROCESS, 0)
    if increment < 0 and os.geteuid() != 0:
        pytest.skip(f"this process runs at a niceness above {start}, which only root can undo")
    done = subprocess.run(["nice", "-n", str(increment), sys.executable, "-c", PRIORITY],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    nice, io_class = map(int, done.stdout.split())
    assert nice == expected
    assert io_class == 3  # IOPRIO_CLASS_IDLE


FREED = """
import resource, sys
from agentbox import portable
if sys.argv[1] == "reuse":
    portable.reuse_freed_memory()
def block():  # a block of audio's arrays, allocated, touched and freed together
    arrays = [bytearray(2 << 20) for _ in range(6)]
    del arrays
for _ in range(3):  # warm: the heap grows to the block's size once
    block()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    block()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not portable.LINUX, reason="glibc's mallopt: Linux")
def test_freed_memory_is_reused_not_mapped_and_zeroed_again() -> None:
    faults = {}
    for how in ("reuse", "default"):
        done = subprocess.run([sys.executable, "-c", FREED, how], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        faults[how] = int(done.stdout)
    # 20 blocks of 12 MB given back are 61,440 pages the kernel maps and zeroes again
    assert faults["default"] > 20_000, faults
    assert faults["reuse"] < 2_000, faults


INTERRUPTED = """
import os, signal, sys
from agentbox import portable
if sys.argv[1] == "ignore":
    portable.ignore_interrupts()
# raise() sends it to this thread, so its C handler has run when raise returns (os.kill
# to the process may be taken by another thread, such as a library's, whose handler a
# busy machine then runs after the print). The interpreter runs the pending Python
# handler at its next check (a loop's jump back), not inside a C call such as print's.
signal.raise_signal(signal.SIGINT)
for _ in range(1000):
    pass
print("still running")
"""


@pytest.mark.parametrize(("how", "survives"), [("ignore", True), ("default", False)])
def test_ignore_interrupts_survives_the_terminals_ctrl_c(how: str, survives: bool) -> None:
    done = subprocess.run([sys.executable, "-c", INTERRUPTED, how], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0 and done.stdout == "still running\n") is survives
    if not survives:
        assert "KeyboardInterrupt" in done.stderr


def uvloop_absent(tmp_path: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes `import uvloop` fail as on Windows."""
    shadow = tmp_path / "no-uvloop" / "uvloop"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('uvloop is not installed')\n")
    return shadow.parent


@pytest.mark.slow
def test_serves_without_uvloop_and_stops_gracefully_when_asked(tmp_path: Path) -> None:
    path = os.pathsep.join([str(uvloop_absent(tmp_path)), str(ROOT)])
    server = Server(tmp_path, {"PYTHONPATH": path}).start()
    try:
        assert server.client.get("/healthz").status_code == 200
        assert server.process is not None
        portable.request_stop(server.process.pid)
        # uvicorn re-raises SIGTERM once it has shut down cleanly: -15 is clean too
        assert server.process.wait(30) in (0, -signal.SIGTERM)
        assert '"msg": "agentbox stopped"' in server.log_path.read_text()  # not killed
    finally:
        server.close()
    check = subprocess.run([sys.executable, "-c", "from agentbox import portable; "
                            "print(portable.event_loop())"], cwd=ROOT, text=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": path})
    assert check.stdout == "asyncio\n"


def test_file_urls_become_local_paths_through_the_standard_library() -> None:
    from agentbox.review.analysis import local_path

    assert portable.path_from_url("/Users/me/Night%20Drive.wav") == "/Users/me/Night Drive.wav"
    assert str(local_path("file:///home/me/%C3%9Cber.wav")) == "/home/me/Über.wav"
    assert str(local_path("file://localhost/tmp/a.wav")) == "/tmp/a.wav"


@pytest.mark.slow
def test_a_second_server_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    first = Server(tmp_path).start()
    try:
        second = subprocess.run([sys.executable, "-m", "agentbox", "serve", "--port", "1"],
                                env=first.env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode != 0
        assert "already serving" in second.stderr
        assert httpx.get(first.url + "/healthz").status_code == 200
    finally:
        first.close()
