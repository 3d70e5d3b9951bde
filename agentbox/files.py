"""agentbox's own folders and files, and who may read them.

The data directory holds the database (raw event bodies, callback URLs,
subscribers' secrets), the config directory the secrets and the admin token.
On POSIX both are their user's alone (0700), and so is every file agentbox
makes in them (0600): each is made so (agentbox.portable.private_directory,
private_file), and `agentbox serve` checks at start what an older version, a
copy or a restore left looser, tightens it where agentbox owns it and this user
owns the file, and warns, naming each. A folder you chose that holds files of
your own is not agentbox's: it is named in a warning, not changed. On Windows
the user's profile folders, where agentbox keeps both by default, already keep
other users out, and what is made inside inherits that.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from agentbox import portable
from agentbox.config import (
    ADMIN_TOKEN_FILE,
    CALLBACK_SECRET_FILE,
    CONFIG_FILE_NAME,
    PAGE_NAME_FILE,
    WEBHOOK_SECRET_FILE,
    Settings,
    default_config_dir,
    default_data_dir,
)

# Folders inside the data directory that agentbox makes: the watch folders' state,
# the service's logs, the archive of exports (its files are in folders of their own
# inside it, each made 0700).
DATA_FOLDERS = ("watch", "logs", "archive")
CONFIG_FILES = (WEBHOOK_SECRET_FILE, CALLBACK_SECRET_FILE, ADMIN_TOKEN_FILE, PAGE_NAME_FILE,
                CONFIG_FILE_NAME)


# The names agentbox gives its files in the data directory: the database, its WAL,
# shared memory and (before WAL mode) journal, its lock.
DATA_FILES = ("agentbox.sqlite3", "agentbox.sqlite3-wal", "agentbox.sqlite3-shm",
              "agentbox.sqlite3-journal", "agentbox.lock")


def tighten(settings: Settings) -> list[str]:
    """Make agentbox's folders and files private where they are not; one sentence per
    change made (or, for a folder of the user's, not made)."""
    said = []
    for folder, default, names in ((settings.data_dir, default_data_dir(), DATA_FILES),
                                   (settings.config_dir, default_config_dir(), CONFIG_FILES)):
        if not folder.is_dir():
            continue
        said += _folder(folder, folder == default or _only_ours(folder, names))
        for path in _ours(folder, names):
            said += _file(path)
    return said


def _ours(folder: Path, names: tuple[str, ...]) -> Iterator[Path]:
    for name in names:
        if (folder / name).is_file():
            yield folder / name
    for name in DATA_FOLDERS:
        inner = folder / name
        if inner.is_dir() and not inner.is_symlink():
            yield from (p for p in inner.iterdir() if p.is_file() and not p.is_symlink())


def _only_ours(folder: Path, names: tuple[str, ...]) -> bool:
    return all(p.name in names or p.name in DATA_FOLDERS for p in folder.iterdir())


def _folder(folder: Path, owned: bool) -> list[str]:
    said = []
    inner = [folder / name for name in DATA_FOLDERS if (folder / name).is_dir()]
    for path in ([folder] if owned else []) + inner:
        was = portable.make_private(path, portable.PRIVATE_DIRECTORY)
        if was is not None:
            said.append(f"{path} could be read by other users ({was:o}); now 700")
    if not owned and not portable.WINDOWS and folder.stat().st_mode & 0o077:
        said.append(f"{folder} can be entered by other users "
                    f"({folder.stat().st_mode & 0o777:o}) and holds files not agentbox's, "
                    f"so it is left as it is: chmod 700 {folder}")
    return said


def _file(path: Path) -> list[str]:
    was = portable.make_private(path, portable.PRIVATE_FILE)
    return [] if was is None else [f"{path} could be read by other users ({was:o}); now 600"]
