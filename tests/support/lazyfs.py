"""A FUSE filesystem that loses every write not yet flushed when the power goes.

Like LazyFS: the mount point shows a backing directory (the "disk"), but file
data written through the mount stays in this process's memory (the "page
cache") until the file is fsynced. A cut freezes the filesystem (every later
operation fails with EIO), drops everything not yet synced and leaves the
backing directory exactly as a disk would be found after a power failure.

What is modelled:
- data writes: lost at a cut unless the file was fsynced (fsync or fdatasync)
  after them, page by page as they were written;
- truncation and extension (ftruncate, a write past the end): lost unless the
  file was fsynced after them; the file comes back at its last synced size;
- writes through a shared mmap (SQLite's -shm): the kernel sends them here as
  writes, so they are unsynced data like any other and are lost too;
- fsync of one file persists that file only.

What is not modelled (kept durable at once, as if the directory were fsynced
after each of them): the directory entries: creating, renaming, unlinking a
file, mkdir, rmdir, and file attributes (mode, times). A file created and
never fsynced therefore survives a cut empty (or at its last synced size).
Torn pages are not modelled either: a page is either written or lost whole.

The disk may also be small: `room N` makes it full once files have grown by N
more bytes (a write that would grow a file past that fails with ENOSPC, as on
a full disk; rewriting what a file already holds still works), `room none`
takes the limit away again. The space is the files' sizes, counted as they
grow, shrink and go.

Run it as a process; its stdin is the control channel. A line `cut` freezes
and discards now; `arm SUFFIX N` cuts right after the N-th write (from now on)
to a file whose name ends with SUFFIX, e.g. between a WAL write and its fsync.
At its cut it prints one JSON line with the figures (pages discarded per file
name, fsyncs seen per file name); a second `cut` prints them again. `room`
answers one JSON line with the space used and the capacity. Unmount with
`fusermount3 -u`.

    python -m tests.support.lazyfs BACKING_DIR MOUNT_POINT
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import mfusepy as fuse  # type: ignore[import-untyped]

PAGE = 4096


class Node:
    """One file's contents as this process sees them: the synced bytes on the backing
    file (held open, so an unlinked or renamed file keeps its data) plus the pages
    written since its last fsync."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size  # the size readers see now
        self.synced_size = self.size  # the backing file's size
        # Backing bytes past a truncation made since the last sync are not the file's
        # any more (an extension reads zeros there), though the backing file keeps
        # them until the sync.
        self.backing_limit = self.size
        self.dirty: dict[int, bytearray] = {}  # page number -> its current contents
        self.handles = 0

    @property
    def unsynced(self) -> bool:
        return bool(self.dirty) or self.size != self.synced_size \
            or self.backing_limit != self.synced_size

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        out = bytearray()
        position = offset
        while position < end:
            number, within = divmod(position, PAGE)
            take = min(PAGE - within, end - position)
            out += self._page(number)[within:within + take]
            position += take
        return bytes(out)

    def write(self, data: bytes, offset: int) -> None:
        position = offset
        view = memoryview(data)
        while view:
            number, within = divmod(position, PAGE)
            take = min(PAGE - within, len(view))
            page = self.dirty.get(number)
            if page is None:
                page = self.dirty[number] = bytearray(self._page(number))
            page[within:within + take] = view[:take]
            view = view[take:]
            position += take
        self.size = max(self.size, offset + len(data))

    def truncate(self, length: int) -> None:
        if length < self.size:
            first_gone = (length + PAGE - 1) // PAGE
            for number in [n for n in self.dirty if n >= first_gone]:
                del self.dirty[number]
            if length % PAGE:  # the kept page's tail reads as zeros if extended again
                number = length // PAGE
                page = self.dirty.get(number)
                if page is None:
                    page = self.dirty[number] = bytearray(self._page(number))
                page[length % PAGE:] = bytes(PAGE - length % PAGE)
            self.backing_limit = min(self.backing_limit, length)
        self.size = length

    def sync(self) -> None:
        if self.backing_limit < self.synced_size:
            os.ftruncate(self.fd, self.backing_limit)  # zeros where an extension reads them
        os.ftruncate(self.fd, self.size)
        for number, page in self.dirty.items():
            os.pwrite(self.fd, bytes(page[:max(0, self.size - number * PAGE)]), number * PAGE)
        self.synced_size = self.backing_limit = self.size
        self.dirty.clear()

    def _page(self, number: int) -> bytes:
        page = self.dirty.get(number)
        if page is not None:
            return bytes(page)
        start = number * PAGE
        data = os.pread(self.fd, PAGE, start) if start < self.backing_limit else b""
        data = data[:max(0, self.backing_limit - start)]
        return data + bytes(PAGE - len(data))


class LazyFS(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        self.mutex = threading.Lock()
        self.nodes: dict[str, Node] = {}  # by path, while open or holding unsynced pages
        self.handles: dict[int, Node] = {}
        self.next_handle = 1
        self.frozen = False
        self.fsyncs: Counter[str] = Counter()
        self.last_cut: dict[str, Any] | None = None
        self.armed: tuple[str, int] | None = None  # (name suffix, writes left before the cut)
        self.used = sum(entry.stat().st_size for entry in backing.rglob("*")
                        if entry.is_file())  # bytes the files hold
        self.capacity: int | None = None  # past it, ENOSPC

    # -- plumbing ---------------------------------------------------------------------

    def _real(self, path: str) -> str:
        return str(self.backing) + path

    def _check(self) -> None:
        if self.frozen:
            raise fuse.FuseOSError(errno.EIO)

    def _node(self, path: str) -> Node:
        node = self.nodes.get(path)
        if node is None:
            node = self.nodes[path] = Node(os.open(self._real(path), os.O_RDWR))
        return node

    def _forget(self, path: str) -> None:
        node = self.nodes.get(path)
        if node is not None and node.handles == 0 and not node.unsynced:
            os.close(node.fd)
            del self.nodes[path]

    def _handle(self, node: Node) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = node
        node.handles += 1
        return handle

    # -- the control channel -------------------------------------------------------------

    def cut(self) -> dict[str, Any]:
        with self.mutex:
            return self._cut()

    def arm(self, suffix: str, writes: int) -> None:
        """Cut the power right after the `writes`-th write to a file whose name ends
        with `suffix` (e.g. between a WAL write and its fsync)."""
        with self.mutex:
            self.armed = (suffix, writes)

    def room(self, more: int | None) -> dict[str, Any]:
        """Full once the files grow by `more` bytes from now (None: never full)."""
        with self.mutex:
            self.capacity = None if more is None else self.used + more
            return {"used": self.used, "capacity": self.capacity}

    def _grow(self, node: Node, size: int) -> None:
        """Count a file going to `size` bytes; past the capacity, ENOSPC (and nothing
        of the write is taken)."""
        more = size - node.size
        if more > 0 and self.capacity is not None and self.used + more > self.capacity:
            raise fuse.FuseOSError(errno.ENOSPC)
        self.used += more

    def _size(self, path: str) -> int:
        node = self.nodes.get(path)
        if node is not None:
            return node.size
        try:
            return os.lstat(self._real(path)).st_size
        except OSError:
            return 0

    def _cut(self) -> dict[str, Any]:
        if self.last_cut is None:
            self.frozen = True
            pages = Counter({Path(path).name: len(node.dirty)
                             for path, node in self.nodes.items() if node.dirty})
            resized = sum(node.size != node.synced_size or node.backing_limit != node.synced_size
                          for node in self.nodes.values())
            for node in {id(node): node for node in [*self.nodes.values(),
                                                     *self.handles.values()]}.values():
                os.close(node.fd)
            self.nodes.clear()
            self.handles.clear()
            self.last_cut = {"discarded_pages": pages.total(), "discarded_by_file": dict(pages),
                             "files_resized_lost": resized, "fsyncs": dict(self.fsyncs)}
        return self.last_cut

    # -- metadata: straight to the backing directory --------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            self._check()
            try:
                st = os.lstat(self._real(path))
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None
            attrs = {key: getattr(st, key) for key in (
                "st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
            for key in ("st_atime", "st_mtime", "st_ctime"):
                attrs[key] = attrs.pop(key + "_ns")
            node = self.nodes.get(path)
            if node is not None:
                attrs["st_size"] = node.size
            return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        with self.mutex:
            self._check()
            return [".", "..", *os.listdir(self._real(path))]

    def access(self, path: str, amode: int) -> int:
        with self.mutex:
            self._check()
            if not os.access(self._real(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

    def mkdir(self, path: str, mode: int) -> int:
        return self._pass(os.mkdir, self._real(path), mode)

    def rmdir(self, path: str) -> int:
        return self._pass(os.rmdir, self._real(path))

    def chmod(self, path: str, mode: int) -> int:
        return self._pass(os.chmod, self._real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> int:
        return self._pass(os.chown, self._real(path), uid, gid)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        return self._pass(os.utime, self._real(path), ns=times) if times else \
            self._pass(os.utime, self._real(path))

    def statfs(self, path: str) -> dict[str, int]:
        with self.mutex:
            self._check()
            st = os.statvfs(self._real(path))
            found = {key: getattr(st, key) for key in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                "f_files", "f_flag", "f_frsize", "f_namemax")}
            if self.capacity is not None:  # the small disk's own figures
                found["f_blocks"] = self.capacity // st.f_frsize
                found["f_bfree"] = found["f_bavail"] = max(
                    0, self.capacity - self.used) // st.f_frsize
            return found

    def unlink(self, path: str) -> int:
        with self.mutex:
            self._check()
            size = self._size(path)
            self._os(os.unlink, self._real(path))
            self.used -= size
            node = self.nodes.pop(path, None)
            if node is not None and node.handles == 0:
                os.close(node.fd)
            return 0

    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            self._check()
            size = self._size(new) if os.path.isfile(self._real(new)) else 0
            self._os(os.rename, self._real(old), self._real(new))
            self.used -= size
            replaced = self.nodes.pop(new, None)
            if replaced is not None and replaced.handles == 0:
                os.close(replaced.fd)
            node = self.nodes.pop(old, None)
            if node is not None:
                self.nodes[new] = node
            return 0

    def _pass(self, call: Any, *args: Any, **kwargs: Any) -> int:
        with self.mutex:
            self._check()
            self._os(call, *args, **kwargs)
            return 0

    @staticmethod
    def _os(call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None

    # -- files: data in memory until fsync -------------------------------------------

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self.mutex:
            self._check()
            fd = self._os(os.open, self._real(path), os.O_RDWR | os.O_CREAT, mode)
            os.close(fd)
            return self._handle(self._node(path))

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            self._check()
            if not os.path.isfile(self._real(path)):
                raise fuse.FuseOSError(errno.ENOENT)
            node = self._node(path)
            if flags & os.O_TRUNC:
                self._grow(node, 0)
                node.truncate(0)
            return self._handle(node)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            self._check()
            return self.handles[fh].read(size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self._check()
            node = self.handles[fh]
            self._grow(node, max(node.size, offset + len(data)))
            node.write(data, offset)
            if self.armed is not None and path.endswith(self.armed[0]):
                suffix, left = self.armed
                self.armed = (suffix, left - 1) if left > 1 else None
                if left == 1:
                    _say(self._cut())  # this write went through; nothing after it does
            return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check()
            node = self.handles[fh] if fh is not None else self._node(path)
            self.used += length - node.size  # a sparse extension takes no room: never full
            node.truncate(length)
            if fh is None:
                self._forget(path)
            return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            self.handles[fh].sync()
            self.fsyncs[Path(path).name] += 1
            return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            return 0  # directory entries are not held back (see the module's docstring)

    def flush(self, path: str, fh: int) -> int:
        with self.mutex:
            self._check()
            return 0  # close() is not a flush to the disk

    def release(self, path: str, fh: int) -> int:
        with self.mutex:
            node = self.handles.pop(fh, None)
            if node is not None:
                node.handles -= 1
                if self.nodes.get(path) is node:
                    self._forget(path)
                elif node.handles == 0 and not self.frozen:
                    os.close(node.fd)  # unlinked or replaced while open
            return 0


def _say(figures: dict[str, Any]) -> None:
    print(json.dumps(figures), flush=True)


def _control(fs: LazyFS) -> None:
    for line in sys.stdin:
        words = line.split()
        if words == ["cut"]:
            _say(fs.cut())
        elif len(words) == 3 and words[0] == "arm":
            fs.arm(words[1], int(words[2]))
        elif len(words) == 2 and words[0] == "room":
            _say(fs.room(None if words[1] == "none" else int(words[1])))


def main() -> None:
    backing, mount = Path(sys.argv[1]).resolve(), sys.argv[2]
    fs = LazyFS(backing)
    threading.Thread(target=_control, args=(fs,), daemon=True).start()
    # use_ino: a file keeps its backing inode number, which agentbox compares to
    # notice a database file replaced under it. No direct_io: SQLite mmaps its -shm.
    fuse.FUSE(fs, mount, foreground=True, nothreads=False, fsname="lazyfs", use_ino=True)


if __name__ == "__main__":
    main()
