"""Projects' reference tracks: `GET|PUT|DELETE /projects/{project}/reference`, its
audio at `/projects/{project}/reference/audio`, and `GET /references`.

A reference arrives as the body of a PUT (the CLI's `agentbox reference add`, or
the project page's form, which sends the file it was given with the page's CSRF
token), at most MAX_REFERENCE_BYTES. It is written into the archive's incoming
folder as it arrives (hashed on the way), measured once by the analysis
processes, kept under its hash, and made the project's reference: every later
review of the project compares with those measurements.

A reference counts in the archive's size and is never let go, so one the archive
cannot hold beside the other references is refused, as is one that would leave the
disk less free space than its margin (AGENTBOX_MIN_FREE_MB): 507
insufficient_storage, before its body is read when its length is declared, else as
soon as it would, and for a disk that fills anyway. Never a 500: the database needs
that room for the promise of every 202.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import time
import unicodedata
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from agentbox.archive import Archive, Gone
from agentbox.archive.blobs import disk_full
from agentbox.archive.records import ProjectReference
from agentbox.engine.agents import AgentError
from agentbox.events import Name, ProjectName
from agentbox.http.access import Access, token_required
from agentbox.http.errors import error_response
from agentbox.review.analysis import Analysis
from agentbox.review.answers import ReferenceOut
from agentbox.review.web.audio import answer, audio_type
from agentbox.store import iso

MAX_REFERENCE_BYTES = 1 << 30  # 1 GiB: ten minutes of 96 kHz 32-bit stereo is 460 MB
WRITE_BYTES = 1 << 20  # an upload is written to disk this much at a time
Endpoint = Callable[[Request], Awaitable[Response]]
_PROJECT = TypeAdapter(ProjectName)
_NAME = TypeAdapter(Name)
# What a reference's JSON shows of its measurements (the rest is the review's).
SHOWN = tuple(name for name in ReferenceOut.model_fields if name not in (
    "project", "name", "sha256", "size_bytes", "added_at", "audio_url"))


def view(reference: ProjectReference) -> dict[str, Any]:
    """A reference as the API shows it (ReferenceOut)."""
    measured = reference.measurements
    return ReferenceOut.model_validate({
        "project": reference.project, "name": reference.name, "sha256": reference.sha256,
        "size_bytes": reference.size, "added_at": iso(reference.added_at),
        "audio_url": f"/projects/{quote(reference.project, safe='')}/reference/audio",
        **{key: measured.get(key) for key in SHOWN},
        "octave_bands": measured.get("octave_bands") or []}).model_dump(mode="json")


class TooLarge(Exception):
    pass


class NoRoom(Exception):
    """The upload would leave the disk less free than its margin (or filled it)."""


class ReferenceRoutes:
    def __init__(self, archive: Archive, analysis: Analysis, access: Access,
                 csrf: str, project_page: Endpoint) -> None:
        self.history = archive.history
        self.archive = archive
        self.analysis = analysis
        self.access = access
        self.csrf = csrf  # the page's (its form sends the file with it)
        # A project whose own name ends in /reference: its page, not a reference.
        self.project_page = project_page

    async def listing(self, request: Request) -> Response:
        """`GET /references`: every project's reference track."""
        return JSONResponse({"references": [view(r) for r in await self.history.references()]})

    async def reference(self, request: Request) -> Response:
        """`GET|PUT|DELETE /projects/{project}/reference`."""
        if not _routed_to(request, b"/reference"):
            return await self._page_of(request, "/reference")
        project = _project(request)
        if isinstance(project, Response):
            return project
        if request.method == "GET":
            found = await self.history.reference(project)
            return _not_found(project) if found is None else JSONResponse(view(found))
        if not self._may_change(request):
            return token_required()
        if request.method == "DELETE":
            removed = await self.archive.remove_reference(project)
            return _not_found(project) if removed is None else JSONResponse(
                {"removed": view(removed)})
        return await self._add(request, project)

    async def audio(self, request: Request) -> Response:
        """`GET /projects/{project}/reference/audio`: its bytes, for the A/B player."""
        if not _routed_to(request, b"/reference/audio"):
            return await self._page_of(request, "/reference/audio")
        project = _project(request)
        if isinstance(project, Response):
            return project
        found = await self.history.reference(project)
        if found is None:
            return _not_found(project)
        played = await self.archive.reference_audio(found)
        if isinstance(played, Gone):
            return error_response(404, "audio_gone", f"{found.name}: {played.reason}.")
        return answer(played, audio_type(found.name), request.headers)

    async def _page_of(self, request: Request, tail: str) -> Response:
        """The path named a project whose name ends in `tail` (its slashes were
        percent-encoded, as the pages write them): that project's page."""
        if request.method != "GET":
            return error_response(405, "method_not_allowed", "A project's page is read only.")
        request.scope["path_params"] = {"project": request.path_params["project"] + tail}
        return await self.project_page(request)

    def _may_change(self, request: Request) -> bool:
        """The admin token (the CLI), or the page's own form: its CSRF token, sent by
        the page's script from this site."""
        return self.access.may_change(request, self.csrf)

    async def _add(self, request: Request, project: str) -> Response:
        try:
            name = _NAME.validate_python(Path(request.query_params.get("name", "")).name
                                         or "reference")
        except ValidationError:
            return error_response(422, "invalid_request", (
                "?name= is the reference's file name: text without control characters."))
        folder = await self.archive.upload_folder()
        if folder is None:
            return error_response(503, "archive_unavailable", (
                "The archive's folder cannot be made or written: see agentbox's log."))
        declared = _declared_length(request)
        if declared is not None:
            refused = await self.archive.reference_refusal(project, declared)
            if refused is not None:
                return _no_room(name, refused)
        upload = self.archive.blobs.new_upload()
        try:
            sha256, size = await receive(request, upload, self.archive.min_free_bytes)
            refused = await self.archive.reference_refusal(project, size, arrived=True)
            if refused is not None:
                return _no_room(name, refused)
            measured = await self._measure(upload, name, sha256)
            if isinstance(measured, Response):
                return measured
            reference = await self.archive.add_reference(
                project=project, name=name, upload=upload, sha256=sha256, size=size,
                measurements=measured)
        except TooLarge:
            return error_response(413, "reference_too_large", (
                f"A reference track may be at most {MAX_REFERENCE_BYTES >> 20} MiB: send "
                "a shorter or compressed (FLAC) file."))
        except ClientDisconnect:
            return error_response(400, "upload_incomplete", "The file did not arrive whole.")
        except NoRoom:
            return _no_room(name, (
                f"it would leave less than {self.archive.min_free_bytes // 1_000_000} MB free "
                "on the disk (AGENTBOX_MIN_FREE_MB)"))
        except OSError as exc:
            if not disk_full(exc):
                raise
            return _no_room(name, "the disk is full")
        finally:
            with contextlib.suppress(OSError):
                upload.unlink()  # kept, it was moved; refused, it goes
        return JSONResponse(view(reference), status_code=201)

    async def _measure(self, upload: Path, name: str, sha256: str
                       ) -> dict[str, Any] | Response:
        if upload.stat().st_size == 0:
            return error_response(422, "reference_unreadable", f"{name} is empty.")
        settled = time.time() - 3600  # whole: arrived, not being written
        os.utime(upload, (settled, settled))
        try:
            raw, file = await self.analysis.measure(upload, name, None)
        except AgentError as exc:  # (said without the folder it was written to)
            said = str(exc).replace(str(upload), name).removeprefix(f"{name}: ")
            return error_response(422, "reference_unreadable", (
                f"{name} cannot be used as a reference: {said}"))
        if file.sha256 != sha256:  # written to while it was measured: not ours to keep
            return error_response(409, "upload_incomplete", "The file changed; send it again.")
        return raw


async def receive(request: Request, path: Path, min_free_bytes: int = 0,
                  chunks: AsyncIterable[bytes] | None = None) -> tuple[str, int]:
    """Write a request's body (or `chunks`, a file of a form it carries) to `path`
    (private), hashing it on the way, in blocks written off the event loop;
    (SHA-256, size). TooLarge past MAX_REFERENCE_BYTES; NoRoom when a block would
    leave less than `min_free_bytes` free on the disk, or the disk has no room for it."""
    digest, size, pending = hashlib.sha256(), 0, bytearray()
    room = (path.parent, min_free_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                 0o600)
    with os.fdopen(fd, "wb") as out:
        async for chunk in request.stream() if chunks is None else chunks:
            size += len(chunk)
            if size > MAX_REFERENCE_BYTES:
                raise TooLarge
            pending += chunk
            if len(pending) >= WRITE_BYTES:
                await asyncio.to_thread(_write, out, digest, bytes(pending), room)
                pending.clear()
        await asyncio.to_thread(_write, out, digest, bytes(pending), room)
        await asyncio.to_thread(_flush, out)
    return digest.hexdigest(), size


def _write(out: Any, digest: Any, block: bytes, room: tuple[Path, int]) -> None:
    folder, min_free_bytes = room
    if shutil.disk_usage(folder).free - len(block) < min_free_bytes:
        raise NoRoom
    digest.update(block)
    try:
        out.write(block)
    except OSError as exc:
        if disk_full(exc):
            raise NoRoom from exc
        raise


def _flush(out: Any) -> None:
    try:
        out.flush()
    except OSError as exc:
        if disk_full(exc):
            raise NoRoom from exc
        raise


def _declared_length(request: Request) -> int | None:
    try:
        return max(int(request.headers.get("content-length", "")), 0)
    except ValueError:
        return None


def _no_room(name: str, why: str) -> Response:
    return error_response(507, "insufficient_storage", (
        f"{name} cannot be kept as a reference track: {why}. Free some space, or remove "
        "another project's reference."))


def _routed_to(request: Request, tail: bytes) -> bool:
    """Whether the path as sent ends in `tail` itself (not in %2Freference, part of a
    project's name)."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return bool(raw.split(b"?", 1)[0].endswith(tail))


def _project(request: Request) -> str | Response:
    raw = request.path_params["project"]
    try:
        return str(_PROJECT.validate_python(unicodedata.normalize("NFC", raw[:1024])))
    except ValidationError:
        return error_response(404, "reference_not_found", "No project has that name.")


def _not_found(project: str) -> Response:
    return error_response(404, "reference_not_found", (
        f"Project {project[:200]!r} has no reference track: add one with agentbox reference "
        "add FILE --project NAME, or on the project's page."))
