"""Start agentbox at login: a systemd user unit (Linux), a launchd agent (macOS) or a
Task Scheduler task (Windows), serving with this installation and its config.

Each OS's service manager is one small class with the same parts: the file it
takes (`render`), where that goes (`where`), and `install`, `uninstall` and
`status`, which write or remove the file and ask the OS's tool (systemctl,
launchctl, schtasks) to load or unload it. Every call of those tools goes through
one `Runner`, so that tests can record them: launchctl and schtasks cannot run
on Linux.

The tray icon (`agentbox tray`) starts at login beside the server, each OS's own
way for a program of the desktop session (`tray_for`): an XDG autostart entry on
Linux (the desktop session starts it, with its display), a second launchd agent
on macOS limited to the graphical session, a value of the Run key on Windows.
"""

from __future__ import annotations

import contextlib
import csv
import os
import plistlib
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from agentbox import portable

SERVICE_NAME = "agentbox"
UNIT_NAME = "agentbox.desktop.service"
LAUNCHD_LABEL = "local.agentbox"  # "local.": made on this machine, claims no domain
TASK_NAME = "agentbox"
TASK_NAMESPACE = "http://schemas.microsoft.com/windows/2004/02/mit/task"
DESCRIPTION = "agentbox: signed webhooks in, durable agent runs out"
COMMAND_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30  # shutdown grace (10 s) + uvicorn's 5 s, with room
LOG_FILE_NAME = "agentbox.log"
LOG_KEEP_BYTES = 10_000_000  # the Windows log file is started afresh beyond this


class ServiceError(Exception):
    """The service could not be installed or removed; the message says what to do."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str  # stdout and stderr, stripped

    @property
    def ok(self) -> bool:
        return self.returncode == 0


Runner = Callable[[Sequence[str]], CommandResult]


def run_command(args: Sequence[str]) -> CommandResult:
    """Run a service manager's tool. A missing tool is an answer, not a crash."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, check=False,
                              timeout=COMMAND_TIMEOUT_SECONDS)
    except FileNotFoundError:
        return CommandResult(127, f"{args[0]}: command not found")
    except subprocess.TimeoutExpired:
        return CommandResult(124, f"{args[0]}: no answer after {COMMAND_TIMEOUT_SECONDS:g} s")
    except OSError as exc:
        return CommandResult(126, f"{args[0]}: {exc}")
    return CommandResult(done.returncode, (done.stdout + done.stderr).strip())


SAFE_PATH = ("-P",)  # python: no working folder (nor script's folder) on the import path


@dataclass(frozen=True)
class Installation:
    """What the service runs: this agentbox (the one-file executable itself when
    frozen, else this interpreter with -P -m agentbox, so a venv's python keeps its
    venv) with this config file, if one was given. -P: the working folder is not put
    on the import path (a module there named in `apps` would run as the user); not
    -I, which leaves out the user's site-packages, where `pip install --user` puts
    agentbox."""

    program: tuple[str, ...]
    config_file: Path | None = None

    @classmethod
    def this(cls, config_file: Path | None = None,
             environ: Mapping[str, str] | None = None) -> Installation:
        environ = os.environ if environ is None else environ
        if config_file is None and environ.get("AGENTBOX_CONFIG"):
            config_file = Path(environ["AGENTBOX_CONFIG"])
        executable = os.path.abspath(sys.executable)
        program = (executable,) if getattr(sys, "frozen", False) else (
            executable, *SAFE_PATH, "-m", "agentbox")
        return cls(program, None if config_file is None else config_file.expanduser().resolve())

    def serve_args(self) -> list[str]:
        config = [] if self.config_file is None else ["--config", str(self.config_file)]
        return ["serve", *config]

    def argv(self) -> list[str]:
        return [*self.program, *self.serve_args()]

    def tray_argv(self) -> list[str]:
        """`agentbox tray`, reading the same config (where the server is)."""
        config = [] if self.config_file is None else ["--config", str(self.config_file)]
        return [*self.program, "tray", *config]


@dataclass(frozen=True)
class Status:
    installed: bool
    where: str
    running: bool | None  # None: the service manager could not say
    detail: str

    def lines(self) -> list[str]:
        running = {True: "yes", False: "no", None: "unknown"}[self.running]
        return [f"installed: {'yes' if self.installed else 'no'} ({self.where})",
                f"running: {running}" + (f" ({self.detail})" if self.detail else "")]


class Manager:
    """One OS's way to start agentbox at login. Subclasses fill in the parts."""

    kind = ""

    def __init__(self, installation: Installation, runner: Runner = run_command) -> None:
        self.installation = installation
        self.run = runner

    @property
    def where(self) -> str:
        raise NotImplementedError

    def render(self) -> str:
        raise NotImplementedError

    def install(self, dry_run: bool = False) -> list[str]:
        raise NotImplementedError

    def uninstall(self) -> list[str]:
        raise NotImplementedError

    def status(self) -> Status:
        raise NotImplementedError

    def dry_run(self) -> list[str]:
        return [f"would write the {self.kind} {self.where}:", "", self.render()]


class FileManager(Manager):
    """A manager that reads a file we write (systemd, launchd)."""

    path: Path

    @property
    def where(self) -> str:
        return str(self.path)

    def write(self) -> bool:
        """Write the file (atomically); False when it was already there as it is."""
        text = self.render()
        if self.path.exists() and self.path.read_text(encoding="utf-8") == text:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        part = self.path.with_name(self.path.name + ".part")
        part.write_text(text, encoding="utf-8")
        os.replace(part, self.path)
        return True


# -- Linux: a systemd user unit; its output goes to the journal ---------------------------------


def systemd_quote(arg: str) -> str:
    """One ExecStart word, quoted as systemd reads it (% and $ doubled: specifiers and
    variables are not expanded)."""
    if any(ord(c) < 32 for c in arg):
        raise ServiceError(f"{arg!r} holds a control character; a unit file cannot carry it")
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"'\\;"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Systemd(FileManager):
    kind = "systemd user unit"

    def __init__(self, installation: Installation, config_home: Path,
                 runner: Runner = run_command) -> None:
        super().__init__(installation, runner)
        self.path = config_home / "systemd" / "user" / UNIT_NAME
        self.wants_link = self.path.parent / "default.target.wants" / UNIT_NAME

    def render(self) -> str:
        exec_start = " ".join(systemd_quote(a) for a in self.installation.argv())
        return "\n".join([
            "# Written by `agentbox service install`; `agentbox service uninstall` removes it.",
            "# Its output goes to the journal: journalctl --user -u agentbox",
            "[Unit]",
            f"Description={DESCRIPTION}",
            "",
            "[Service]",
            "Type=exec",
            f"ExecStart={exec_start}",
            "Environment=PYTHONUNBUFFERED=1",
            "Restart=on-failure",
            "RestartSec=5",
            f"TimeoutStopSec={STOP_TIMEOUT_SECONDS}",
            "",
            "[Install]",
            "WantedBy=default.target",
            "",
        ])

    def systemctl(self, *args: str) -> CommandResult:
        return self.run(["systemctl", "--user", *args])

    def install(self, dry_run: bool = False) -> list[str]:
        if dry_run:
            return self.dry_run()
        changed = self.write()
        said = [f"{'wrote' if changed else 'unchanged:'} {self.path}"]
        reload = self.systemctl("daemon-reload")
        if not reload.ok:
            return [*said, "systemd's user manager did not answer "
                    f"({_first_line(reload.output)}), so nothing was started. Where systemd "
                    "runs, log in again or: systemctl --user enable --now agentbox; "
                    "elsewhere start agentbox with: agentbox serve"]
        enable = self.systemctl("enable", "--now", UNIT_NAME)
        if not enable.ok:
            raise ServiceError(f"systemctl --user enable --now {UNIT_NAME} failed: "
                               f"{enable.output}")
        if changed:
            self.systemctl("restart", UNIT_NAME)  # a running one takes the new unit
        return [*said, "enabled and started; it starts at login. Logs: journalctl --user "
                "-u agentbox"]

    def uninstall(self) -> list[str]:
        if not self.path.exists() and not self.wants_link.is_symlink():
            return [f"not installed (no {self.path})"]
        stopped = self.systemctl("disable", "--now", UNIT_NAME)
        self.path.unlink(missing_ok=True)
        if self.wants_link.is_symlink():  # systemd was not there to disable it
            self.wants_link.unlink()
        for folder in (self.wants_link.parent, self.path.parent, self.path.parent.parent):
            _remove_if_empty(folder)
        if stopped.ok:
            self.systemctl("daemon-reload")
        return [f"removed {self.path}"]

    def status(self) -> Status:
        installed = self.path.exists()
        active = self.systemctl("is-active", UNIT_NAME)
        state = _first_line(active.output)
        if state in {"active", "reloading", "activating", "deactivating", "inactive",
                     "failed"}:
            return Status(installed, self.where, state == "active", state)
        return Status(installed, self.where, None, f"systemd did not answer: {state}")


# -- macOS: a launchd agent; its output goes to ~/Library/Logs/agentbox -----------------------


class Launchd(FileManager):
    kind = "launchd agent"

    def __init__(self, installation: Installation, home: Path, uid: int,
                 runner: Runner = run_command) -> None:
        super().__init__(installation, runner)
        self.path = home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        self.log_dir = home / "Library" / "Logs" / SERVICE_NAME
        self.domain = f"gui/{uid}"

    def render(self) -> str:
        log = str(self.log_dir / LOG_FILE_NAME)
        agent = {
            "Label": LAUNCHD_LABEL,
            "ProgramArguments": self.installation.argv(),
            "RunAtLoad": True,
            "Umask": 0o077,  # its log files (launchd makes them) its user's alone
            "KeepAlive": {"SuccessfulExit": False},  # again after a crash, not after a stop
            "StandardOutPath": log,
            "StandardErrorPath": log,
            "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
            "ExitTimeOut": STOP_TIMEOUT_SECONDS,
        }
        return plistlib.dumps(agent, fmt=plistlib.FMT_XML).decode()

    def launchctl(self, *args: str) -> CommandResult:
        return self.run(["launchctl", *args])

    def install(self, dry_run: bool = False) -> list[str]:
        if dry_run:
            return self.dry_run()
        changed = self.write()
        self.log_dir.mkdir(parents=True, exist_ok=True)  # launchd makes the file, not the folder
        self.launchctl("bootout", f"{self.domain}/{LAUNCHD_LABEL}")  # a loaded older one
        self.launchctl("enable", f"{self.domain}/{LAUNCHD_LABEL}")
        loaded = self.launchctl("bootstrap", self.domain, str(self.path))
        if not loaded.ok:
            raise ServiceError(f"launchctl bootstrap {self.domain} {self.path} failed: "
                               f"{loaded.output}")
        return [f"{'wrote' if changed else 'unchanged:'} {self.path}",
                f"loaded and started; it starts at login. Logs: {self.log_dir / LOG_FILE_NAME}"]

    def uninstall(self) -> list[str]:
        if not self.path.exists():
            return [f"not installed (no {self.path})"]
        self.launchctl("bootout", f"{self.domain}/{LAUNCHD_LABEL}")
        self.path.unlink()
        _remove_if_empty(self.log_dir)
        kept = [f"logs kept in {self.log_dir}"] if self.log_dir.exists() else []
        return [f"removed {self.path}", *kept]

    def status(self) -> Status:
        installed = self.path.exists()
        found = self.launchctl("print", f"{self.domain}/{LAUNCHD_LABEL}")
        if found.returncode == 127:
            return Status(installed, self.where, None, found.output)
        if not found.ok:
            return Status(installed, self.where, False, "not loaded")
        state = next((line.split("=", 1)[1].strip() for line in found.output.splitlines()
                      if line.strip().startswith("state =")), "")
        return Status(installed, self.where, state == "running", state)


# -- Windows: a Task Scheduler task; its output goes to a file in the data dir ----------------


class TaskScheduler(Manager):
    kind = "Task Scheduler task"

    def __init__(self, installation: Installation, data_dir: Path, user: str | None,
                 runner: Runner = run_command) -> None:
        super().__init__(installation, runner)
        self.log_file = data_dir / "logs" / LOG_FILE_NAME
        self.user = user  # DOMAIN\name: the logon that starts it

    @property
    def where(self) -> str:
        return f"\\{TASK_NAME} (Task Scheduler, schtasks /Query /TN {TASK_NAME})"

    def command(self) -> tuple[str, list[str]]:
        """The program and its arguments. Task Scheduler keeps no output, so agentbox
        appends its own to the log file (`service run`); pythonw has no console window."""
        program, *rest = self.installation.program
        windowless = Path(program).with_name("pythonw.exe")
        if rest and Path(program).name.lower() == "python.exe" and windowless.exists():
            program = str(windowless)
        return program, [*rest, "service", "run", "--log-file", str(self.log_file), "--",
                         *self.installation.serve_args()]

    def render(self) -> str:
        ET.register_namespace("", TASK_NAMESPACE)
        task = ET.Element(_task("Task"), version="1.2")
        info = ET.SubElement(task, _task("RegistrationInfo"))
        _text(info, "Description", DESCRIPTION)
        _text(info, "URI", f"\\{TASK_NAME}")
        trigger = ET.SubElement(ET.SubElement(task, _task("Triggers")), _task("LogonTrigger"))
        _text(trigger, "Enabled", "true")
        principal = ET.SubElement(ET.SubElement(task, _task("Principals")), _task("Principal"),
                                  id="Author")
        if self.user:
            _text(trigger, "UserId", self.user)  # at this user's logon (no admin needed)
            _text(principal, "UserId", self.user)
        _text(principal, "LogonType", "InteractiveToken")
        _text(principal, "RunLevel", "LeastPrivilege")
        settings = ET.SubElement(task, _task("Settings"))
        for name, value in (("MultipleInstancesPolicy", "IgnoreNew"),
                            ("DisallowStartIfOnBatteries", "false"),
                            ("StopIfGoingOnBatteries", "false"),
                            ("ExecutionTimeLimit", "PT0S"),  # default 72 h would stop it
                            ("Priority", "5"),  # normal; the default 7 is below it
                            ("Enabled", "true")):
            _text(settings, name, value)
        restart = ET.SubElement(settings, _task("RestartOnFailure"))
        _text(restart, "Interval", "PT1M")
        _text(restart, "Count", "3")
        actions = ET.SubElement(task, _task("Actions"), Context="Author")
        exec_ = ET.SubElement(actions, _task("Exec"))
        program, arguments = self.command()
        _text(exec_, "Command", program)
        _text(exec_, "Arguments", subprocess.list2cmdline(arguments))
        ET.indent(task)
        return ('<?xml version="1.0" encoding="UTF-16"?>\n'
                + ET.tostring(task, encoding="unicode") + "\n")

    def schtasks(self, *args: str) -> CommandResult:
        return self.run(["schtasks", *args])

    def install(self, dry_run: bool = False) -> list[str]:
        if dry_run:
            return self.dry_run()
        # schtasks reads the definition from a file, in UTF-16 as Task Scheduler writes it.
        handle, name = tempfile.mkstemp(prefix="agentbox-task-", suffix=".xml")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(self.render().encode("utf-16"))
            made = self.schtasks("/Create", "/TN", TASK_NAME, "/XML", name, "/F")
        finally:
            os.unlink(name)
        if not made.ok:
            raise ServiceError(f"schtasks /Create failed: {made.output}")
        self.schtasks("/End", "/TN", TASK_NAME)  # a running older one
        started = self.schtasks("/Run", "/TN", TASK_NAME)
        now = "started" if started.ok else f"not started now ({_first_line(started.output)})"
        return [f"registered the task {self.where}",
                f"{now}; it starts at login. Logs: {self.log_file}"]

    def uninstall(self) -> list[str]:
        if not self.schtasks("/Query", "/TN", TASK_NAME).ok:
            return [f"not installed (no task {TASK_NAME})"]
        self.schtasks("/End", "/TN", TASK_NAME)
        removed = self.schtasks("/Delete", "/TN", TASK_NAME, "/F")
        if not removed.ok:
            raise ServiceError(f"schtasks /Delete failed: {removed.output}")
        return [f"removed the task {self.where}"]

    def status(self) -> Status:
        found = self.schtasks("/Query", "/TN", TASK_NAME, "/FO", "CSV", "/NH")
        if found.returncode == 127:
            return Status(False, self.where, None, found.output)
        if not found.ok:
            return Status(False, self.where, False, "")
        rows = [row for row in csv.reader(found.output.splitlines()) if len(row) >= 3]
        state = rows[0][2] if rows else ""
        return Status(True, self.where, state == "Running", state)


def _task(name: str) -> str:
    return f"{{{TASK_NAMESPACE}}}{name}"


def _text(parent: ET.Element, name: str, value: str) -> None:
    ET.SubElement(parent, _task(name)).text = value


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (or not there): those files stay
        folder.rmdir()


# -- the tray icon at login, beside the server ------------------------------------------------

TRAY_LAUNCHD_LABEL = "local.agentbox.tray"
AUTOSTART_FILE = "agentbox-tray.desktop"
RUN_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Run"
RUN_VALUE = "agentbox tray"
TRAY_DESCRIPTION = "agentbox in the tray: the last review, one click to it"


class TrayAtLogin:
    """One OS's way to start `agentbox tray` when the desktop session starts."""

    def __init__(self, installation: Installation, runner: Runner = run_command) -> None:
        self.installation = installation
        self.run = runner

    @property
    def where(self) -> str:
        raise NotImplementedError

    def install(self, dry_run: bool = False) -> list[str]:
        raise NotImplementedError

    def uninstall(self) -> list[str]:
        raise NotImplementedError


class XdgAutostart(TrayAtLogin):
    """An XDG autostart entry: the desktop session (GNOME, KDE, Xfce, ...) starts it at
    login, with the session's display; a session manager without autostart does not."""

    def __init__(self, installation: Installation, config_home: Path,
                 runner: Runner = run_command) -> None:
        super().__init__(installation, runner)
        self.path = config_home / "autostart" / AUTOSTART_FILE

    @property
    def where(self) -> str:
        return str(self.path)

    def render(self) -> str:
        exec_line = " ".join(desktop_quote(a) for a in self.installation.tray_argv())
        return "\n".join([
            "# Written by `agentbox service install`; `agentbox service uninstall` removes it.",
            "[Desktop Entry]",
            "Type=Application",
            "Name=agentbox tray",
            f"Comment={TRAY_DESCRIPTION}",
            f"Exec={exec_line}",
            "Terminal=false",
            "X-GNOME-Autostart-enabled=true",
            "",
        ])

    def install(self, dry_run: bool = False) -> list[str]:
        if dry_run:
            return [f"would write the XDG autostart entry {self.where}:", "", self.render()]
        changed = _write_file(self.path, self.render())
        return [f"{'wrote' if changed else 'unchanged:'} {self.path}",
                "the tray icon starts at your next login (now: agentbox tray)"]

    def uninstall(self) -> list[str]:
        if not self.path.exists():
            return [f"tray not started at login (no {self.path})"]
        self.path.unlink()
        _remove_if_empty(self.path.parent)
        return [f"removed {self.path}"]


class LaunchdTray(TrayAtLogin):
    """A second launchd agent, for the graphical session only (Aqua)."""

    def __init__(self, installation: Installation, home: Path, uid: int,
                 runner: Runner = run_command) -> None:
        super().__init__(installation, runner)
        self.path = home / "Library" / "LaunchAgents" / f"{TRAY_LAUNCHD_LABEL}.plist"
        self.domain = f"gui/{uid}"

    @property
    def where(self) -> str:
        return str(self.path)

    def render(self) -> str:
        return plistlib.dumps({
            "Label": TRAY_LAUNCHD_LABEL,
            "ProgramArguments": self.installation.tray_argv(),
            "RunAtLoad": True,
            "LimitLoadToSessionType": "Aqua",  # a menu bar icon needs the user's desktop
            "ProcessType": "Interactive",
            "KeepAlive": {"SuccessfulExit": False},  # Quit is a success: it stays quit
        }, fmt=plistlib.FMT_XML).decode()

    def install(self, dry_run: bool = False) -> list[str]:
        if dry_run:
            return [f"would write the launchd agent {self.where}:", "", self.render()]
        changed = _write_file(self.path, self.render())
        self.run(["launchctl", "bootout", f"{self.domain}/{TRAY_LAUNCHD_LABEL}"])
        loaded = self.run(["launchctl", "bootstrap", self.domain, str(self.path)])
        now = "started" if loaded.ok else f"not started now ({_first_line(loaded.output)})"
        return [f"{'wrote' if changed else 'unchanged:'} {self.path}",
                f"tray icon {now}; it starts at login"]

    def uninstall(self) -> list[str]:
        if not self.path.exists():
            return [f"tray not started at login (no {self.path})"]
        self.run(["launchctl", "bootout", f"{self.domain}/{TRAY_LAUNCHD_LABEL}"])
        self.path.unlink()
        return [f"removed {self.path}"]


class RunKey(TrayAtLogin):
    """A value of the current user's Run key: Windows starts it at logon (no admin)."""

    @property
    def where(self) -> str:
        return f"{RUN_KEY}\\{RUN_VALUE}"

    def command(self) -> str:
        program, *rest = self.installation.tray_argv()
        windowless = Path(program).with_name("pythonw.exe")
        if Path(program).name.lower() == "python.exe" and windowless.exists():
            program = str(windowless)  # no console window beside the icon
        return subprocess.list2cmdline([program, *rest])

    def install(self, dry_run: bool = False) -> list[str]:
        if dry_run:
            return [f"would set {self.where} to:", "", self.command()]
        added = self.run(["reg", "add", RUN_KEY, "/v", RUN_VALUE, "/t", "REG_SZ", "/d",
                          self.command(), "/f"])
        if not added.ok:
            raise ServiceError(f"reg add {RUN_KEY} failed: {added.output}")
        return [f"set {self.where}", "the tray icon starts at your next logon "
                "(now: agentbox tray)"]

    def uninstall(self) -> list[str]:
        if not self.run(["reg", "query", RUN_KEY, "/v", RUN_VALUE]).ok:
            return [f"tray not started at login (no {self.where})"]
        removed = self.run(["reg", "delete", RUN_KEY, "/v", RUN_VALUE, "/f"])
        if not removed.ok:
            raise ServiceError(f"reg delete {RUN_KEY} failed: {removed.output}")
        return [f"removed {self.where}"]


def desktop_quote(arg: str) -> str:
    """One argument of a desktop entry's Exec key: quoted when it has to be, with the
    spec's escapes (and % doubled, a field code otherwise)."""
    arg = arg.replace("%", "%%")
    if arg and not any(c in arg for c in ' \t\n"\'\\><~|&;$*?#()`='):
        return arg
    # The string escapes (\\ is one backslash) apply before the quoting's, so a
    # backslash in a quoted argument is written four times.
    escaped = "".join("\\" * 4 if c == "\\" else "\\" + c if c in '"`$' else c
                      for c in arg)
    return f'"{escaped}"'


def _write_file(path: Path, text: str) -> bool:
    """Write `path` atomically; False when it was already there as it is."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)
    return True


def tray_for(installation: Installation, platform: str | None = None,
             home: Path | None = None, environ: Mapping[str, str] | None = None,
             runner: Runner = run_command) -> TrayAtLogin:
    """How this OS (or `platform`, for tests) starts the tray icon at login."""
    platform = portable.PLATFORM if platform is None else platform
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    if platform == "darwin":
        return LaunchdTray(installation, home, portable.user_id() or 501, runner)
    if platform == "win32":
        return RunKey(installation, runner)
    config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    return XdgAutostart(installation, config_home, runner)


# -- choosing one, and the Windows task's logging -------------------------------------------


def manager_for(installation: Installation, platform: str | None = None,
                home: Path | None = None, environ: Mapping[str, str] | None = None,
                data_dir: Path | None = None, runner: Runner = run_command) -> Manager:
    """The service manager of this OS (or of `platform`, for tests). `data_dir`: where
    the Windows task's log goes (default: the default data directory)."""
    platform = portable.PLATFORM if platform is None else platform
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    if platform == "darwin":
        return Launchd(installation, home, portable.user_id() or 501,
                       runner)
    if platform == "win32":
        user = environ.get("USERNAME")
        domain = environ.get("USERDOMAIN")
        data = data_dir or Path(platformdirs.user_data_dir(SERVICE_NAME))
        return TaskScheduler(installation, data,
                             f"{domain}\\{user}" if user and domain else user, runner)
    config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    return Systemd(installation, config_home, runner)


def run_logged(log_file: Path, run: Callable[[], object]) -> None:
    """`run()` (the command line the task names) with its output appended to
    `log_file`: how the Windows task logs, since Task Scheduler keeps no program's
    output. A file past LOG_KEEP_BYTES is kept as agentbox.log.1 and started afresh."""
    portable.private_directory(log_file.parent)
    if log_file.exists() and log_file.stat().st_size > LOG_KEEP_BYTES:
        os.replace(log_file, log_file.with_name(log_file.name + ".1"))
    portable.private_file(log_file)
    stream = open(log_file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (for life)
    sys.stdout = sys.stderr = stream
    run()
