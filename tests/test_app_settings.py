"""The apps' settings (agentbox.config.app_settings): each app's section of
agentbox.toml, its variables as they were, a key at the top of the file as before
sections, the same precedence and error words; `agentbox config` lists them by
section; the core Settings holds the engine's alone.

Every test passes an explicit config file and `environ` (or a subprocess's own
environment), so the real home directory and environment are never read.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentbox import config
from agentbox.archive.settings import ArchiveSettings
from agentbox.cli import main
from agentbox.config import ConfigError, Settings, load_settings
from agentbox.desktop.settings import DesktopSettings, WatchedFolder
from agentbox.review.settings import ReviewSettings

ROOT = Path(__file__).resolve().parent.parent


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agentbox.toml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, environ: dict[str, str] | None = None, **overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ or {}, overrides)
    return str(info.value)


def test_each_app_reads_its_section_of_the_file(tmp_path: Path) -> None:
    path = config_file(tmp_path, '[review]\nmix_profile = "club"\narchive_max_gb = 2.5\n'
                                 'mix_stage = "Master"\n[desktop]\nnotify = false\n'
                                 'watch = ["/music/masters=master"]\n')
    settings = load_settings(path, {})
    assert settings.of(ReviewSettings).mix_profile == "club"
    assert settings.of(ReviewSettings).mix_stage == "master"
    assert settings.of(ArchiveSettings).archive_max_gb == 2.5
    assert settings.of(ArchiveSettings).max_bytes == 2_500_000_000
    assert settings.of(DesktopSettings) == DesktopSettings(
        notify=False, watch=(WatchedFolder(Path("/music/masters"), "master"),))


def test_the_variables_are_as_they_were(tmp_path: Path) -> None:
    path = config_file(tmp_path, "")
    environ = {"AGENTBOX_MIX_PROFILE": "podcast", "AGENTBOX_MIX_STAGE": "mix",
               "AGENTBOX_LLM_BASE_URL": "http://127.0.0.1:11434/v1",
               "AGENTBOX_LLM_MODEL": "m", "AGENTBOX_NOTIFY": "off", "AGENTBOX_ARCHIVE": "0",
               "AGENTBOX_ARCHIVE_MAX_GB": "0.5", "AGENTBOX_ARCHIVE_KEEP_PER_PROJECT": "3",
               "AGENTBOX_MIN_FREE_MB": "7", "AGENTBOX_WATCH": "/w",
               "AGENTBOX_MIX_ROOTS": str(tmp_path)}
    settings = load_settings(path, environ)
    assert settings.of(ReviewSettings) == ReviewSettings(
        mix_profile="podcast", mix_stage="mix", llm_base_url="http://127.0.0.1:11434/v1",
        llm_model="m", mix_roots=(Path(os.path.realpath(tmp_path)),))
    assert settings.of(ArchiveSettings) == ArchiveSettings(
        archive=False, archive_max_gb=0.5, archive_keep_per_project=3, min_free_mb=7)
    assert settings.of(DesktopSettings) == DesktopSettings(False, (WatchedFolder(Path("/w")),))


def test_the_analysis_processes_are_the_reviews_setting_in_the_words_of_before(
        tmp_path: Path) -> None:
    """AGENTBOX_ANALYSIS_PROCESSES, read as it always was (empty: the default), is the
    review's setting now: the file may give it, and a wrong one is refused in the
    sentence it always had, by `config` and serve alike."""
    assert load_settings(config_file(tmp_path, "[review]\nanalysis_processes = 2\n"),
                         {}).of(ReviewSettings).analysis_processes == 2
    path = config_file(tmp_path, "")
    for given, expected in (("3", 3), ("", 1), (" 4 ", 4)):
        settings = load_settings(path, {"AGENTBOX_ANALYSIS_PROCESSES": given})
        assert settings.of(ReviewSettings).analysis_processes == expected
    for bad in ("0", "x", "1.5", "-2", "\u0663"):
        assert refused(path, {"AGENTBOX_ANALYSIS_PROCESSES": bad}) == \
            "AGENTBOX_ANALYSIS_PROCESSES must be a whole number, 1 or more"


def test_a_key_at_the_top_of_the_file_still_counts(tmp_path: Path) -> None:
    path = config_file(tmp_path, 'mix_profile = "club"\narchive = false\nnotify = false\n'
                                 "archive_keep_per_project = 5\n")
    settings = load_settings(path, {})
    assert settings.of(ReviewSettings).mix_profile == "club"
    assert settings.of(ArchiveSettings).archive is False
    assert settings.of(ArchiveSettings).archive_keep_per_project == 5
    assert settings.of(DesktopSettings).notify is False


def test_the_file_then_the_variable_then_the_flag(tmp_path: Path) -> None:
    path = config_file(tmp_path, '[review]\nmix_profile = "club"\narchive_max_gb = 3\n')
    assert load_settings(path, {}).of(ReviewSettings).mix_profile == "club"
    from_env = load_settings(path, {"AGENTBOX_MIX_PROFILE": "spotify"})
    assert from_env.of(ReviewSettings).mix_profile == "spotify"
    assert from_env.of(ArchiveSettings).archive_max_gb == 3  # the file's, not overridden
    flagged = load_settings(path, {"AGENTBOX_MIX_PROFILE": "spotify"},
                            {"mix_profile": "youtube", "archive_max_gb": None})
    assert flagged.of(ReviewSettings).mix_profile == "youtube"
    assert flagged.of(ArchiveSettings).archive_max_gb == 3  # None: the flag not given


@pytest.mark.parametrize(("text", "environ", "says"), [
    ('[review]\nmix_profile = "loud"\n', {},
     "review.mix_profile in {path}: 'loud' is not a profile; use one of streaming,"),
    ('mix_profile = "loud"\n', {}, "mix_profile in {path}: 'loud' is not a profile"),
    ("", {"AGENTBOX_MIX_STAGE": "loud"},
     "AGENTBOX_MIX_STAGE: 'loud' is not a stage; use one of auto, mix, master"),
    ("[review]\narchive_keep_per_project = 500\n", {},
     "review.archive_keep_per_project in {path} must be at most 200"),
    ("", {"AGENTBOX_ARCHIVE_MAX_GB": "0"},
     "AGENTBOX_ARCHIVE_MAX_GB must be a positive number (got 0.0)"),
    ("", {"AGENTBOX_NOTIFY": "maybe"}, "AGENTBOX_NOTIFY: 'maybe' is not a valid value"),
    ('[review]\nllm_base_url = "ftp://x"\n', {},
     "review.llm_base_url in {path} must be an http(s) URL"),
    ("", {"AGENTBOX_WATCH": "/a=loud"}, "AGENTBOX_WATCH: '/a=loud': the stage must be mix or"),
    ('mix_profile = "club"\n[review]\nmix_profile = "club"\n', {},
     "mix_profile is set twice in {path}: at the top and in [review]"),
    ("[review]\nmix_profil = 1\n[studio]\nx = 1\n", {},
     "config file {path}: unknown setting(s) review.mix_profil, studio"),
])
def test_an_app_setting_that_does_not_fit_is_named_as_it_was_set(
        tmp_path: Path, text: str, environ: dict[str, str], says: str) -> None:
    path = config_file(tmp_path, text)
    assert says.format(path=path) in refused(path, environ)


def test_a_setting_left_at_its_default_is_named_by_its_variable(tmp_path: Path) -> None:
    path = config_file(tmp_path, "")
    assert "--archive-keep-per-project must be at most" in refused(
        path, archive_keep_per_project=201)
    with pytest.raises(ConfigError, match="AGENTBOX_ARCHIVE_KEEP_PER_PROJECT must be at most"):
        ArchiveSettings(archive_keep_per_project=201).check(config.env_name)


def test_settings_given_as_they_are(tmp_path: Path) -> None:
    settings = Settings().with_app(ReviewSettings(mix_profile="club"))
    assert settings.of(ReviewSettings).mix_profile == "club"
    assert settings.of(DesktopSettings) == DesktopSettings()  # the rest at their defaults
    assert Settings().of(ReviewSettings).mix_profile == "streaming"  # as config shows it


def test_the_core_settings_hold_no_app_setting() -> None:
    config.import_apps(config.DEFAULT_APPS)
    engine = {field.name for field in dataclasses.fields(Settings)}
    apps = {field.name for kind in config.registered_settings()
            for field in dataclasses.fields(kind)}
    assert {"mix_profile", "notify", "archive", "watch", "mix_roots"} <= apps
    assert not engine & apps
    assert not set(config._SETTABLE) & apps
    with pytest.raises(ValueError, match="the setting 'port' is taken"):
        @config.app_settings("studio")
        @dataclasses.dataclass(frozen=True)
        class Taken:
            port: int = config.setting(1, config.parse_positive_int)


def test_reading_settings_imports_no_app_unless_the_file_names_one(tmp_path: Path) -> None:
    """A client of agentbox stays light: only a key no app imported so far knows makes
    the configuration import the apps, to learn their settings; a bundled app's keys
    are accepted even by a server that does not run it (AGENTBOX_APPS=""), as before."""
    script = ("import sys; from pathlib import Path; from agentbox.config import load_settings;"
              "s = load_settings(Path(sys.argv[1]), {'AGENTBOX_APPS': sys.argv[2]});"
              "print('agentbox.review.app' in sys.modules, 'agentbox.desktop.app' in sys.modules,"
              "s.apps)")
    plain, named = tmp_path / "plain.toml", tmp_path / "named.toml"
    plain.write_text("port = 8123\n", encoding="utf-8")
    named.write_text("mix_profile = 'club'\n[desktop]\nnotify = false\n", encoding="utf-8")
    for path, apps, expected in ((plain, "agentbox.desktop.app:app", "False False"),
                                 (named, "agentbox.desktop.app:app", "True True"),
                                 (named, "", "True True")):
        done = subprocess.run([sys.executable, "-c", script, str(path), apps], cwd=ROOT,
                              capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items()
                                   if not k.startswith("AGENTBOX_")})
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[:2] == expected.split()
        assert done.stdout.split()[2:] == (["()"] if not apps else [f"('{apps}',)"])


def test_agentbox_config_lists_every_setting_by_section(tmp_path: Path) -> None:
    path = config_file(tmp_path, 'port = 8123\nmix_profile = "club"\n[desktop]\nnotify = false\n')
    secret = "whsec_" + "s" * 40
    shown = CliRunner().invoke(main, ["config", "--config", str(path)], env={
        "AGENTBOX_ARCHIVE_MAX_GB": "2.5", "AGENTBOX_WEBHOOK_SECRET": secret,
        "AGENTBOX_MIX_STAGE": None, "AGENTBOX_NOTIFY": None})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert f"port = 8123  # port in {path}" in lines
    assert "webhook_secret = (set, not shown)  # AGENTBOX_WEBHOOK_SECRET" in lines
    assert secret not in shown.output
    review, desktop = lines.index("[review]"), lines.index("[desktop]")
    assert lines.index(f"port = 8123  # port in {path}") < review < desktop
    assert f'mix_profile = "club"  # mix_profile in {path}' in lines[review:desktop]
    assert "archive_max_gb = 2.5  # AGENTBOX_ARCHIVE_MAX_GB" in lines[review:desktop]
    assert 'mix_stage = "auto"  # default' in lines[review:desktop]
    assert f"notify = false  # desktop.notify in {path}" in lines[desktop:]
    assert "watch = []  # default" in lines[desktop:]


def test_agentbox_config_refuses_what_serve_would(tmp_path: Path) -> None:
    path = config_file(tmp_path, '[review]\nmix_profile = "loud"\n')
    shown = CliRunner().invoke(main, ["config", "--config", str(path)])
    assert shown.exit_code == 2
    assert f"review.mix_profile in {path}: 'loud' is not a profile" in shown.output


def test_agentbox_config_refuses_an_app_missing_what_it_requires(tmp_path: Path) -> None:
    """As serve does: the export log (written from docs/apps.md) without the review
    whose event it takes is refused by `config` too, in words that name the app."""
    path = config_file(tmp_path, "")
    shown = CliRunner().invoke(main, ["config", "--config", str(path)],
                               env={"AGENTBOX_APPS": "tests.support.export_log.app:app"})
    assert shown.exit_code == 2, shown.output
    assert "the app 'exportlog' requires the app 'review', which AGENTBOX_APPS does not " \
        "run" in shown.output


def test_agentbox_config_says_a_kept_secret_is_set_and_an_idle_apps_section_unused(
        tmp_path: Path) -> None:
    """The secret serve made (config_dir/webhook_secret) is set, where it is kept; an
    app's section in the file while AGENTBOX_APPS does not run the app says so."""
    path = config_file(tmp_path, f'config_dir = "{tmp_path / "cfg"}"\n[desktop]\nnotify = false\n')
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "webhook_secret").write_text("whsec_" + "k" * 40 + "\n")
    shown = CliRunner().invoke(main, ["config", "--config", str(path)], env={
        "AGENTBOX_APPS": "", "AGENTBOX_WEBHOOK_SECRET": None, "AGENTBOX_CONFIG_DIR": None})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert f"webhook_secret = (set, not shown)  # {tmp_path / 'cfg' / 'webhook_secret'}" in lines
    assert "k" * 40 not in shown.output
    assert "[desktop]  # not used: AGENTBOX_APPS does not run the app 'desktop'" in lines


@pytest.mark.slow  # agentbox serve in a process of its own
@pytest.mark.parametrize("where", ["file", "environment"])
def test_serve_refuses_an_app_setting_that_does_not_fit_in_its_words(
        tmp_path: Path, where: str) -> None:
    """The desktop side is imported by no command but serve: its setting is read and
    refused at start all the same, whether its section names it or its variable."""
    from tests.conftest import free_port
    from tests.test_startup import refused, serve

    path = config_file(tmp_path, '[desktop]\nwatch = ["/a=loud"]\n' if where == "file" else "")
    environ = {"AGENTBOX_WATCH": "/a=loud"} if where == "environment" else {}
    done = serve(tmp_path, "--config", str(path), "--port", str(free_port()), **environ)
    named = f"desktop.watch in {path}" if where == "file" else "AGENTBOX_WATCH"
    assert done.returncode == 2
    assert refused(done) == (f"agentbox: {named}: '/a=loud': the stage must be mix or master "
                             "(PATH=STAGE), not 'loud'")
