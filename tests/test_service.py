"""`agentbox service`: the systemd unit, the launchd agent and the scheduled task it
writes, and install/uninstall/status on a throwaway home.

The systemd unit is checked by the real `systemd-analyze verify`, and on Linux the
CLI runs against the real systemctl. launchctl and schtasks cannot run on Linux, so
for macOS and Windows the OS's tool is a recorder (`FakeLaunchctl`, `FakeSchtasks`)
that keeps the state those tools would: what can be proven here is the file each
OS reads (plistlib, the task schema's elements) and the calls made with it.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from agentbox.cli import main
from agentbox.desktop import service as svc
from tests.conftest import ROOT, free_port, wait_until

NS = {"t": svc.TASK_NAMESPACE}


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def installation(tmp_path: Path, config_name: str = "my agentbox %h $HOME.toml"
                 ) -> svc.Installation:
    """This interpreter, with a config file whose name needs quoting everywhere."""
    config = tmp_path / "conf dir" / config_name
    config.parent.mkdir(exist_ok=True)
    config.write_text("")
    return svc.Installation.this(config, environ={})


class Recorder:
    """Stands in for an OS's service tool; records each call and answers `ok`."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> svc.CommandResult:
        self.calls.append(list(args))
        return self.answer(list(args))

    def answer(self, args: list[str]) -> svc.CommandResult:
        return svc.CommandResult(0, "")


class FakeLaunchctl(Recorder):
    """launchctl's state for one user: which labels are loaded (macOS cannot run here)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, dict[str, object]] = {}

    def answer(self, args: list[str]) -> svc.CommandResult:
        verb = args[1]
        if verb == "bootstrap":
            agent = plistlib.loads(Path(args[3]).read_bytes())
            if agent["Label"] in self.loaded:
                return svc.CommandResult(5, "Bootstrap failed: 5: Input/output error")
            self.loaded[agent["Label"]] = agent
        elif verb in ("bootout", "print"):
            label = args[2].rsplit("/", 1)[1]
            if label not in self.loaded:
                return svc.CommandResult(113, "Could not find service in domain")
            if verb == "bootout":
                del self.loaded[label]
            else:
                return svc.CommandResult(0, f"{args[2]} = {{\n\tstate = running\n}}")
        return svc.CommandResult(0, "")


class FakeSchtasks(Recorder):
    """Task Scheduler's state: registered task definitions (Windows cannot run here)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[str, ET.Element] = {}
        self.running: set[str] = set()
        self.read_from: Path | None = None

    def answer(self, args: list[str]) -> svc.CommandResult:
        verb, name = args[1], args[args.index("/TN") + 1]
        if verb == "/Create":
            self.read_from = Path(args[args.index("/XML") + 1])
            xml = self.read_from.read_bytes()
            assert xml.startswith(b"\xff\xfe")  # UTF-16 with its BOM, as schtasks reads it
            self.tasks[name] = ET.fromstring(xml.decode("utf-16"))
            return svc.CommandResult(0, "SUCCESS")
        if name not in self.tasks:
            return svc.CommandResult(1, "ERROR: The system cannot find the file specified.")
        if verb == "/Run":
            self.running.add(name)
        elif verb == "/End":
            self.running.discard(name)
        elif verb == "/Delete":
            del self.tasks[name]
        elif verb == "/Query":
            state = "Running" if name in self.running else "Ready"
            return svc.CommandResult(0, f'"\\{name}","N/A","{state}"')
        return svc.CommandResult(0, "SUCCESS")


# -- the files ----------------------------------------------------------------------------------


def verify_unit(path: Path, runtime: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: install Debian's systemd package "
                    "(the test set-up does)")
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    return subprocess.run([analyze, "--user", "verify", str(path)], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    manager = svc.Systemd(installation(tmp_path), tmp_path / "config")
    unit = tmp_path / svc.UNIT_NAME
    unit.write_text(manager.render())
    checked = verify_unit(unit, tmp_path / "run")
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked
    # The same check does fail a broken unit: it is not silent whatever it reads.
    unit.write_text(manager.render().replace("Restart=on-failure", "Restart=sometimes"))
    assert "sometimes" in verify_unit(unit, tmp_path / "run").stderr


def test_the_units_exec_start_is_this_python_serving_with_the_config(tmp_path: Path) -> None:
    inst = installation(tmp_path)
    text = svc.Systemd(inst, tmp_path).render()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    # systemd doubles % and $ and quotes as a shell does with double quotes.
    words = shlex.split(exec_start.removeprefix("ExecStart=").replace("%%", "%"))
    words = [w.replace("$$", "$") for w in words]
    # -P: the service's working folder is not on the import path (agentbox.desktop.service)
    assert words == [os.path.abspath(sys.executable), "-P", "-m", "agentbox", "serve",
                     "--config", str(inst.config_file)]
    assert "WantedBy=default.target" in text and "Restart=on-failure" in text


@pytest.mark.slow
def test_the_units_command_serves_with_its_config(tmp_path: Path) -> None:
    """What systemd would start: the ExecStart words run as they are, on a fresh home,
    serve on the port that only the config file names."""
    inst, port = installation(tmp_path), free_port()
    assert inst.config_file is not None
    inst.config_file.write_text(f"port = {port}\n")
    exec_start = next(line for line in svc.Systemd(inst, tmp_path).render().splitlines()
                      if line.startswith("ExecStart="))
    words = [w.replace("$$", "$") for w in
             shlex.split(exec_start.removeprefix("ExecStart=").replace("%%", "%"))]
    home = a_home(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")},
           **cli_env(home)}
    server = subprocess.Popen(words, env=env, cwd=home, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _healthy(port) or server.poll() is not None, 60, "/healthz")
        assert server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=30)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_frozen_agentbox_runs_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    inst = svc.Installation.this(None, environ={"AGENTBOX_CONFIG": "x.toml"})
    assert inst.argv() == [os.path.abspath(sys.executable), "serve", "--config",
                           str(Path("x.toml").resolve())]


def test_the_launchd_plist_round_trips_with_the_keys_launchd_needs(tmp_path: Path) -> None:
    inst = installation(tmp_path)
    agent = plistlib.loads(svc.Launchd(inst, tmp_path, 501).render().encode())
    assert agent["Label"] == svc.LAUNCHD_LABEL
    assert agent["ProgramArguments"] == inst.argv()
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    log = str(tmp_path / "Library" / "Logs" / "agentbox" / "agentbox.log")
    assert agent["StandardOutPath"] == agent["StandardErrorPath"] == log
    assert plistlib.loads(plistlib.dumps(agent)) == agent


def test_the_task_xml_has_the_schemas_required_elements(tmp_path: Path) -> None:
    inst = installation(tmp_path, config_name='a "quoted" name.toml')
    python = tmp_path / "venv" / "Scripts" / "python.exe"
    python.parent.mkdir(parents=True)
    (python.parent / "pythonw.exe").write_bytes(b"")  # the console-less interpreter
    inst = svc.Installation((str(python), "-m", "agentbox"), inst.config_file)
    text = svc.TaskScheduler(inst, tmp_path / "data", "STUDIO\\ana").render()
    task = ET.fromstring(text.split("\n", 1)[1])
    assert task.tag == f"{{{svc.TASK_NAMESPACE}}}Task" and task.get("version") == "1.2"
    for path in ("t:RegistrationInfo", "t:Triggers/t:LogonTrigger", "t:Principals/t:Principal",
                 "t:Settings", "t:Actions/t:Exec/t:Command"):
        assert task.find(path, NS) is not None, path
    assert task.findtext("t:Triggers/t:LogonTrigger/t:UserId", namespaces=NS) == "STUDIO\\ana"
    assert task.findtext("t:Settings/t:ExecutionTimeLimit", namespaces=NS) == "PT0S"
    assert task.findtext("t:Actions/t:Exec/t:Command", namespaces=NS) == str(
        python.parent / "pythonw.exe")
    arguments = task.findtext("t:Actions/t:Exec/t:Arguments", namespaces=NS)
    log = tmp_path / "data" / "logs" / "agentbox.log"
    assert arguments == subprocess.list2cmdline(
        ["-m", "agentbox", "service", "run", "--log-file", str(log), "--", "serve",
         "--config", str(inst.config_file)])


# -- install, uninstall, status ------------------------------------------------------------------


def a_home(tmp_path: Path) -> Path:
    """A fresh home with the folders each OS's home already has."""
    home = tmp_path / "home"
    for folder in (".config", "Library/LaunchAgents", "Library/Logs"):
        (home / folder).mkdir(parents=True)
    return home


def test_systemd_install_and_uninstall_are_idempotent_and_leave_nothing(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    before, systemctl = files_under(home), Recorder()
    manager = svc.Systemd(installation(tmp_path), home / ".config", systemctl)
    assert manager.install()[0] == f"wrote {manager.path}"
    assert manager.install()[0] == f"unchanged: {manager.path}"
    assert systemctl.calls[:3] == [["systemctl", "--user", "daemon-reload"],
                                   ["systemctl", "--user", "enable", "--now", svc.UNIT_NAME],
                                   ["systemctl", "--user", "restart", svc.UNIT_NAME]]
    assert ["systemctl", "--user", "restart", svc.UNIT_NAME] not in systemctl.calls[3:]
    assert manager.status().installed
    # systemd enabled it by a link in default.target.wants, which uninstall removes.
    manager.wants_link.parent.mkdir()
    manager.wants_link.symlink_to(manager.path)
    assert manager.uninstall() == [f"removed {manager.path}"]
    assert ["systemctl", "--user", "disable", "--now", svc.UNIT_NAME] in systemctl.calls
    assert manager.uninstall() == [f"not installed (no {manager.path})"]
    assert files_under(home) == before
    assert not manager.status().installed


def test_launchd_install_and_uninstall_are_idempotent_and_leave_nothing(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    before, launchctl = files_under(home), FakeLaunchctl()
    manager = svc.Launchd(installation(tmp_path), home, 501, launchctl)
    for _ in range(2):  # the second unloads the first before loading again
        manager.install()
        assert launchctl.calls[-1] == ["launchctl", "bootstrap", "gui/501", str(manager.path)]
    assert launchctl.loaded[svc.LAUNCHD_LABEL]["ProgramArguments"] == manager.installation.argv()
    assert manager.status() == svc.Status(True, str(manager.path), True, "running")
    assert manager.uninstall() == [f"removed {manager.path}"]
    assert manager.uninstall() == [f"not installed (no {manager.path})"]
    assert launchctl.loaded == {}
    assert files_under(home) == before
    assert manager.status().running is False


def test_launchd_uninstall_keeps_logs_that_were_written(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    manager = svc.Launchd(installation(tmp_path), home, 501, FakeLaunchctl())
    manager.install()
    (manager.log_dir / "agentbox.log").write_text("a line\n")
    assert manager.uninstall()[1] == f"logs kept in {manager.log_dir}"
    assert not manager.path.exists()


def test_task_install_and_uninstall_are_idempotent_and_leave_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, schtasks, temp = a_home(tmp_path), FakeSchtasks(), tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(svc.tempfile, "tempdir", str(temp))  # where the XML file goes
    before = files_under(home)
    manager = svc.TaskScheduler(installation(tmp_path), home / "data", "STUDIO\\ana", schtasks)
    manager.install()
    manager.install()
    assert list(schtasks.tasks) == [svc.TASK_NAME] and schtasks.running == {svc.TASK_NAME}
    command = schtasks.tasks[svc.TASK_NAME].findtext("t:Actions/t:Exec/t:Command", namespaces=NS)
    assert command == os.path.abspath(sys.executable)  # no pythonw.exe beside it here
    assert manager.status().lines()[1] == "running: yes (Running)"
    manager.uninstall()
    assert manager.uninstall() == [f"not installed (no task {svc.TASK_NAME})"]
    assert schtasks.tasks == {} and not manager.status().installed
    assert files_under(home) == before
    assert schtasks.read_from is not None and schtasks.read_from.parent == temp
    assert os.listdir(temp) == []  # the XML file schtasks read is gone


def test_a_failed_registration_says_what_schtasks_said(tmp_path: Path) -> None:
    class Refusing(Recorder):
        def answer(self, args: list[str]) -> svc.CommandResult:
            return svc.CommandResult(1, "ERROR: Access is denied.")

    manager = svc.TaskScheduler(installation(tmp_path), tmp_path, None, Refusing())
    with pytest.raises(svc.ServiceError, match="Access is denied"):
        manager.install()


# -- the CLI, with the real systemctl of this machine -------------------------------------------


def cli_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"), "AGENTBOX_CONFIG": ""}


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux CLI path (systemd)")
def test_the_cli_installs_reports_and_uninstalls_a_unit(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    before, env, runner = files_under(home), cli_env(home), CliRunner()
    unit = home / ".config" / "systemd" / "user" / svc.UNIT_NAME
    dry = runner.invoke(main, ["service", "install", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith(f"would write the systemd user unit {unit}:")
    assert "ExecStart=" in dry.output and files_under(home) == before
    autostart = home / ".config" / "autostart" / svc.AUTOSTART_FILE
    assert f"would write the XDG autostart entry {autostart}:" in dry.output
    done = runner.invoke(main, ["service", "install"], env=env)
    assert done.exit_code == 0 and unit.read_text() in dry.output, done.output
    assert autostart.read_text() in dry.output  # the tray icon, at login beside it
    # Here systemd's user manager may or may not run; either way the answer says which.
    status = runner.invoke(main, ["service", "status"], env=env)
    assert status.output.startswith(f"installed: yes ({unit})\nrunning: "), status.output
    for _ in range(2):
        assert runner.invoke(main, ["service", "uninstall"], env=env).exit_code == 0
    assert files_under(home) == before
    status = runner.invoke(main, ["service", "status"], env=env)
    assert status.output.startswith(f"installed: no ({unit})"), status.output


def test_install_refuses_a_config_file_that_is_not_there(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    result = CliRunner().invoke(main, ["service", "install", "--config",
                                       str(tmp_path / "missing.toml")], env=cli_env(home))
    assert result.exit_code == 1 and "missing.toml" in result.output
    assert not (home / ".config" / "systemd").exists()


def test_service_run_appends_agentboxs_output_to_the_log_file(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "agentbox.log"
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "agentbox", "service", "run", "--log-file",
                               str(log), "--", "--version"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0 and done.stdout == "", done
    assert log.read_text().count("version 0.") == 2


def test_each_os_gets_its_own_manager_and_places(tmp_path: Path) -> None:
    inst, home = installation(tmp_path), tmp_path / "home"
    env = {"USERDOMAIN": "STUDIO", "USERNAME": "ana"}
    linux = svc.manager_for(inst, "linux", home, {})
    assert isinstance(linux, svc.Systemd)
    assert linux.where == str(home / ".config" / "systemd" / "user" / "agentbox.desktop.service")
    xdg = svc.manager_for(inst, "linux", home, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert xdg.where == str(tmp_path / "cfg" / "systemd" / "user" / "agentbox.desktop.service")
    mac = svc.manager_for(inst, "darwin", home, {})
    assert isinstance(mac, svc.Launchd)
    assert mac.where == str(home / "Library" / "LaunchAgents" / "local.agentbox.plist")
    windows = svc.manager_for(inst, "win32", home, env, data_dir=tmp_path / "data")
    assert isinstance(windows, svc.TaskScheduler) and windows.user == "STUDIO\\ana"
    assert windows.log_file == tmp_path / "data" / "logs" / "agentbox.log"


# -- the tray icon at login, beside the server ----------------------------------------------


def exec_argv(entry: Path) -> list[str]:
    """A desktop entry's Exec as the session starts it: the string escapes, then the
    quoting (shlex's POSIX double quotes escape the same four), then %% as %."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(entry.read_text())
    value = parser["Desktop Entry"]["Exec"].replace("\\\\", "\\")  # the string escape
    args, arg, quoted, chars = [], "", False, iter(value)
    for c in chars:  # the spec's quoting: in double quotes, \ escapes " ` $ and \
        if c == '"':
            quoted = not quoted
        elif c == "\\" and quoted:
            arg += next(chars)
        elif c == " " and not quoted:
            args, arg = [*args, arg], ""
        else:
            arg += c
    return [a.replace("%%", "%") for a in [*args, arg]]


def test_the_autostart_entry_starts_the_tray_with_the_config(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    before = files_under(home)
    tray = svc.tray_for(installation(tmp_path, "a \\ b \"q\" `x` %h $HOME.toml"),
                        "linux", home, {})
    assert isinstance(tray, svc.XdgAutostart)
    assert tray.install()[0] == f"wrote {tray.path}"
    assert tray.install()[0] == f"unchanged: {tray.path}"
    assert exec_argv(tray.path) == tray.installation.tray_argv()
    assert exec_argv(tray.path)[-3:-1] == ["tray", "--config"]
    assert "Type=Application" in tray.path.read_text()
    assert tray.uninstall() == [f"removed {tray.path}"]
    assert tray.uninstall() == [f"tray not started at login (no {tray.path})"]
    assert files_under(home) == before


def test_the_tray_launchd_agent_runs_in_the_graphical_session(tmp_path: Path) -> None:
    home, launchctl = a_home(tmp_path), FakeLaunchctl()
    before = files_under(home)
    tray = svc.tray_for(installation(tmp_path), "darwin", home, {}, launchctl)
    assert isinstance(tray, svc.LaunchdTray)
    for _ in range(2):
        assert tray.install()[1] == "tray icon started; it starts at login"
    agent = launchctl.loaded[svc.TRAY_LAUNCHD_LABEL]
    assert agent["ProgramArguments"] == tray.installation.tray_argv()
    assert agent["LimitLoadToSessionType"] == "Aqua" and agent["RunAtLoad"] is True
    assert tray.uninstall() == [f"removed {tray.path}"]
    assert launchctl.loaded == {} and files_under(home) == before


class FakeReg(Recorder):
    """The Run key's values (Windows cannot run here)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}

    def answer(self, args: list[str]) -> svc.CommandResult:
        verb, key, name = args[1], args[2], args[args.index("/v") + 1]
        assert key == svc.RUN_KEY
        if verb == "add":
            self.values[name] = args[args.index("/d") + 1]
        elif name not in self.values:
            return svc.CommandResult(1, "ERROR: The system was unable to find the specified "
                                        "registry key or value.")
        elif verb == "delete":
            del self.values[name]
        return svc.CommandResult(0, "The operation completed successfully.")


def test_the_run_key_starts_the_tray_at_logon(tmp_path: Path) -> None:
    reg = FakeReg()
    tray = svc.tray_for(installation(tmp_path), "win32", a_home(tmp_path), {}, reg)
    assert isinstance(tray, svc.RunKey)
    tray.install()
    tray.install()
    assert reg.values == {svc.RUN_VALUE: subprocess.list2cmdline(
        tray.installation.tray_argv())}  # no pythonw.exe beside this python
    assert tray.uninstall() == [f"removed {tray.where}"]
    assert tray.uninstall() == [f"tray not started at login (no {tray.where})"]
    assert reg.values == {}
