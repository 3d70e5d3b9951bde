"""The audio the page plays: `GET /runs/{run_id}/audio`, the bytes a review heard
(agentbox.archive finds them), in byte ranges as an `<audio>` element or the A/B
player asks for them.

Only what a review recorded is served, never a path a request names; and never
an open path: the file is opened once, as it is checked (no symlink followed),
and served from that descriptor.

The answer's type comes from the file's name, which the sender chose: only an
audio type is ever answered as such. Anything else (a WAV named `evil.html`) is
`application/octet-stream` with `Content-Disposition: attachment`, so that no
browser renders a sender's bytes as a page of this site.
"""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentbox.archive import Archive, Gone, Playable, Reviewed
from agentbox.engine.agents import PermanentAgentError
from agentbox.http.errors import error_response
from agentbox.review.analysis import local_path
from agentbox.review.model import as_review
from agentbox.store import Store

AUDIO_TYPES = {".wav": "audio/wav", ".wave": "audio/wav", ".flac": "audio/flac",
               ".mp3": "audio/mpeg", ".ogg": "audio/ogg", ".oga": "audio/ogg",
               ".aif": "audio/aiff", ".aiff": "audio/aiff", ".m4a": "audio/mp4"}
CHUNK_BYTES = 256 * 1024  # read and sent at a time
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


DOWNLOAD_TYPE = "application/octet-stream"  # what is not audio: saved, never shown


def audio_type(name: str) -> str:
    """The type a file of this name is served as: an audio type, else DOWNLOAD_TYPE."""
    suffix = Path(name).suffix.lower()
    guessed = AUDIO_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or DOWNLOAD_TYPE
    return guessed if guessed.startswith("audio/") else DOWNLOAD_TYPE


def reviewed(result: Any) -> Reviewed | None:
    """What a stored result says of the file it reviewed; None: not a mix review."""
    review = as_review(result)
    if review is None:
        return None
    path = None
    with contextlib.suppress(PermanentAgentError):  # a URL no local path can name
        path = local_path(review.mix_url) if review.mix_url else None
    file = review.file
    return Reviewed(name=file.name if file else (path.name if path else "mix"),
                    sha256=file.sha256 if file else None,
                    size=file.size_bytes if file else None,
                    modified_ns=file.modified_ns if file else None, path=path)


class AudioRoutes:
    def __init__(self, store: Store, archive: Archive) -> None:
        self.store = store
        self.archive = archive
        self.history = archive.history

    async def run_audio(self, request: Request) -> Response:
        """The mix a review heard: its run's (or, after retention removed the run, its
        project's history's) record says which bytes; the archive has them."""
        run_id = request.path_params["run_id"]
        run = await self.store.get_run(run_id)
        result = run["result"] if run is not None else None
        if run is None:
            kept = await self.history.archived_export(run_id)
            result = kept.result if kept is not None else None
        heard = reviewed(result)
        if heard is None:
            return error_response(404, "audio_not_found",
                                  "Only the mix of a finished mix review can be played; "
                                  f"{run_id[:100]!r} is not one.")
        return await self.play(request, heard)

    async def play(self, request: Request, heard: Reviewed) -> Response:
        found = await self.archive.audio(heard)
        if isinstance(found, Gone):
            return error_response(404, "audio_gone", f"{heard.name}: {found.reason}.")
        return answer(found, audio_type(heard.name), request.headers)


def answer(file: Playable, media_type: str, headers: Any) -> Response:
    """The open file's bytes, or 416 for a range past its end (the descriptor closed)."""
    wanted = headers.get("range")
    if headers.get("if-range", f'"{file.sha256}"') != f'"{file.sha256}"':
        wanted = None  # another version was asked about: the whole of this one
    try:
        unsatisfiable = bool(wanted) and byte_range(wanted, file.size) is None
    except ValueError:
        unsatisfiable = False
    if unsatisfiable:
        os.close(file.fd)
        return error_response(416, "range_not_satisfiable", (
            f"The file is {file.size} bytes: ask for a range within them."),
            headers={"Content-Range": f"bytes */{file.size}"})
    return OpenFileResponse(file, media_type, headers)


class OpenFileResponse(Response):
    """An open file's bytes, whole (200) or one byte range (206, as browsers ask when
    they seek), from the descriptor it was checked with; the descriptor is closed
    when the answer is sent. Tagged with the bytes' hash, so that a page loading the
    same export again is told 304."""

    def __init__(self, file: Playable, media_type: str, headers: Any) -> None:
        super().__init__(None, media_type=media_type)
        self.file = file
        tag = f'"{file.sha256}"'
        self.headers["accept-ranges"] = "bytes"
        self.headers["etag"] = tag
        self.headers["cache-control"] = "private, no-cache"
        self.headers["x-content-type-options"] = "nosniff"
        if not media_type.startswith("audio/"):
            self.headers["content-disposition"] = (
                f"attachment; filename*=UTF-8''{quote(file.name, safe='')}")
        self.start, self.end = 0, file.size  # [start, end)
        if headers.get("if-none-match") == tag:
            self.status_code, self.end = 304, 0
            del self.headers["content-type"]
            return
        wanted = headers.get("range")
        if wanted and headers.get("if-range", tag) == tag:
            self._range(wanted)
        self.headers["content-length"] = str(self.end - self.start)

    def _range(self, wanted: str) -> None:
        size = self.file.size
        try:
            span = byte_range(wanted, size)
        except ValueError:
            return  # not one range in bytes: the whole file (a server may ignore it)
        if span is not None:  # (None, past the end, is answered 416 before this)
            self.status_code = 206
            self.start, self.end = span
            self.headers["content-range"] = f"bytes {span[0]}-{span[1] - 1}/{size}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            if scope.get("method") == "HEAD" or self.end <= self.start:
                await send({"type": "http.response.body", "body": b""})
                return
            offset = self.start
            while offset < self.end:
                chunk = await asyncio.to_thread(
                    _read_at, self.file.fd, offset, min(CHUNK_BYTES, self.end - offset))
                if not chunk:  # cut short under us: end the answer where the bytes end
                    break
                offset += len(chunk)
                await send({"type": "http.response.body", "body": chunk,
                            "more_body": offset < self.end})
            if offset < self.end:
                await send({"type": "http.response.body", "body": b""})
        finally:
            os.close(self.file.fd)


def _read_at(fd: int, offset: int, size: int) -> bytes:
    os.lseek(fd, offset, os.SEEK_SET)  # the descriptor is this answer's alone
    return os.read(fd, size)


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """The one range a Range header asks for, as [start, end) within `size` bytes;
    None when it cannot be satisfied (416). ValueError for what is not one range in
    bytes (several, another unit, nonsense)."""
    found = _RANGE.fullmatch(header.strip())
    if found is None or not any(found.groups()):
        raise ValueError(f"not one byte range: {header[:80]!r}")
    first, last = found.groups()
    if not first:  # the last N bytes
        n = int(last)
        return (max(0, size - n), size) if n > 0 and size > 0 else None
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    if start >= size or (last and int(last) < start):
        return None
    return (start, end)
