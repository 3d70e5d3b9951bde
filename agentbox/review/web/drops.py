"""A file dropped or picked on the page, reviewed: `POST /exports`, the home page's
and a project page's form (multipart/form-data: the page's CSRF token, the stage,
on a project page the project, then the file).

The file is taken as a reference track is (references.receive, its limits): written
as it arrives, hashed, at most MAX_REFERENCE_BYTES (413 too_large), never leaving
the disk less free than its margin (507 insufficient_storage, before a byte is
written when the form's length says so). It is kept in the archive's folder, under
`dropped/`, with its own name, as a render is kept in an exports folder; a file
that is not audio is refused there and then (422 not_audio), so that it makes no
project. It is then sent for review as `agentbox send FILE` sends one: a
`session.exported` whose project is the page's (on a project page) or the file's
name, its stage the one chosen (none: as the project and the file say). What it is
follows the one rule of every door (agentbox.review.renders): the very bytes of the
project's latest export are that export (200, `duplicate: true`, its `run_id`; the
copy is not kept), the bytes of an older one a new export of the same audio.

The form is answered with a redirect to the review's page (/ui/runs/{run_id}), where
the review comes in; the page's script and programs (Accept: application/json) get
the receiver's answer. A refusal is said in words: a page for the form, JSON for the
script. Never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any

from pydantic import TypeAdapter, ValidationError
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from agentbox import portable
from agentbox.archive import Archive
from agentbox.archive.blobs import disk_full
from agentbox.archive.keeper import Gone
from agentbox.events import SCHEMA_VERSION, Name
from agentbox.http.access import CSRF_FAILED, Access, page_token_ok
from agentbox.http.errors import error_response
from agentbox.http.pages import StatusPages
from agentbox.review.contract import ProjectName, project_name, project_of_file
from agentbox.review.stage import STAGES
from agentbox.review.web.audio import reviewed
from agentbox.review.web.references import (
    MAX_REFERENCE_BYTES,
    NoRoom,
    TooLarge,
    receive,
)
from agentbox.review.web.rejudge import Refusal, Take, accepted, hand_over
from agentbox.runs import RunStatus
from agentbox.store import Store, Transition

MAX_FILE_NAME_BYTES = 255  # the longest file name most file systems keep (ext4, APFS, NTFS)
DROPPED = "dropped"  # the archive folder's folder of files given on the page
DROP_SOURCE = "agentbox.page"  # the events' source: a file given on the page
DROP_EVENT = "session.exported"  # as `agentbox send FILE` sends one
MAX_DROP_BYTES = MAX_REFERENCE_BYTES  # the limit of an upload, one for both
MAX_FIELD_BYTES = 1024  # the form's other fields: a token, a stage, a project's name
Endpoint = Callable[[Request], Awaitable[Response]]
_NAME: TypeAdapter[str] = TypeAdapter(Name)
_PROJECT: TypeAdapter[str] = TypeAdapter(ProjectName)


@dataclass
class Part:
    """One part of the form as it arrives: its headers, then its data."""

    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    file_name: str | None = None  # None: a field, not a file


async def form_parts(request: Request) -> AsyncIterator[tuple[str, Any]]:
    """A multipart body read as it arrives, without keeping it: ("part", Part) as each
    part's headers end, ("data", bytes) for its data, ("end", None) at its end.
    Refusal for a body that is not multipart/form-data."""
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise Refusal(415, "form_expected", "Send the file as the page's form does "
                      "(multipart/form-data: csrf, stage, project, then file).")
    events: list[tuple[str, Any]] = []
    part, header = Part(), [b"", b""]

    def begin() -> None:
        nonlocal part
        part = Part()

    def header_end() -> None:
        part.headers[header[0].lower()] = header[1]
        header[0] = header[1] = b""

    def headers_done() -> None:
        _, said = parse_options_header(part.headers.get(b"content-disposition", b""))
        part.name = said.get(b"name", b"").decode("utf-8", "replace")
        name = said.get(b"filename")
        part.file_name = None if name is None else name.decode("utf-8", "replace")
        events.append(("part", part))

    def add(index: int) -> Any:
        def keep(data: bytes, start: int, end: int) -> None:
            header[index] += data[start:end]
        return keep

    parser = MultipartParser(boundary, {
        "on_part_begin": begin, "on_header_field": add(0), "on_header_value": add(1),
        "on_header_end": header_end, "on_headers_finished": headers_done,
        "on_part_data": lambda data, start, end: events.append(("data", data[start:end])),
        "on_part_end": lambda: events.append(("end", None))})
    async for chunk in request.stream():
        parser.write(chunk)
        for event in events:
            yield event
        events.clear()
    parser.finalize()
    for event in events:
        yield event


@dataclass
class Given:
    """What the form gave: its fields, and the file it carried (kept where)."""

    fields: dict[str, str] = field(default_factory=dict)
    file_name: str | None = None
    path: Path | None = None


class DropRoutes:
    def __init__(self, archive: Archive, access: Access, csrf: str,
                 pages: StatusPages, store: Store, take: Take) -> None:
        self.take = take  # the host's: the page vouches for a dropped file's event
        self.archive = archive
        self.access = access
        self.csrf = csrf  # the page's
        self.pages = pages
        self.store = store
        self._tidying: set[asyncio.Task[None]] = set()

    def on_transition(self, t: Transition) -> None:
        """A dropped file's review succeeded: once the archive holds the bytes it heard
        (the page plays and re-judges those), its copy under dropped/ goes. With the
        archive off, the copy is the file the page plays: it stays."""
        if t.source != DROP_SOURCE or t.status != RunStatus.SUCCEEDED or not self.archive.on:
            return
        task = asyncio.get_running_loop().create_task(self._tidy(t.run_id, t.event_id))
        self._tidying.add(task)
        task.add_done_callback(self._tidying.discard)

    async def _tidy(self, run_id: str, event_id: str) -> None:
        run = await self.store.get_run(run_id)
        heard = reviewed(run.result) if run is not None else None
        if heard is None:
            return
        kept = await self.archive.audio(heard)  # waits for the archive's copy to finish
        if isinstance(kept, Gone):
            return  # not in the archive: the dropped copy stays
        os.close(kept.fd)
        folder = self.archive.blobs.root / DROPPED / event_id
        await asyncio.to_thread(shutil.rmtree, folder, True)

    def or_read(self, read: Endpoint) -> Endpoint:
        """`/exports` as one route (its Allow header names both): POST sends a file,
        GET (`read`) lists exports."""
        async def exports(request: Request) -> Response:
            return await (self.drop(request) if request.method == "POST" else read(request))
        return exports

    async def drop(self, request: Request) -> Response:
        """`POST /exports`: the file reviewed, or why not, in words."""
        as_page = "text/html" in request.headers.get("accept", "")
        folder: Path | None = None
        try:
            folder = await self._folder()
            given = await self._receive(request, folder)
            result = await hand_over(self.take, _envelope(given), "The file cannot be "
                                     "reviewed")
        except Refusal as refused:
            if folder is not None:
                await asyncio.to_thread(shutil.rmtree, folder, True)
            if as_page:
                return self.pages.error(refused.status, refused.message)
            return error_response(refused.status, refused.code, refused.message)
        run_id = result.runs[0].run_id
        if result.duplicate:  # the project's latest export already (renders.py): its review
            await asyncio.to_thread(shutil.rmtree, folder, True)
        if as_page:
            return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)
        return JSONResponse(accepted(result), status_code=200 if result.duplicate else 202)

    async def _folder(self) -> Path:
        """A new folder of its own for the file (its own name is kept)."""
        incoming = await self.archive.upload_folder()
        if incoming is None:
            raise Refusal(503, "archive_unavailable", "The archive's folder cannot be made "
                          "or written: see agentbox's log.")
        folder = self.archive.blobs.root / DROPPED / uuid.uuid4().hex
        try:
            for made in (folder.parent, folder):  # each its user's alone
                await asyncio.to_thread(portable.private_directory, made)
        except OSError as exc:
            if disk_full(exc):
                raise self._no_room() from None
            raise Refusal(503, "archive_unavailable", "The archive's folder cannot be "
                          f"written ({exc.strerror or exc}): see agentbox's log.") from None
        return folder

    async def _receive(self, request: Request, folder: Path) -> Given:
        self._room_for(request)
        given, parts = Given(), form_parts(request)
        try:
            async for kind, value in parts:
                if kind == "part" and value.file_name is not None:
                    self._check_caller(request, given.fields)
                    if given.path is not None:
                        raise Refusal(422, "one_file", "Send one file at a time.")
                    given.file_name = _file_name(value.file_name)
                    given.path = folder / given.file_name
                    await self._write(request, parts, given.path)
                elif kind == "part":
                    await _field(parts, value.name, given.fields)
        except ClientDisconnect:
            raise Refusal(400, "upload_incomplete", "The file did not arrive whole; send "
                          "it again.") from None
        except MultipartParseError:
            raise Refusal(400, "form_malformed", "The form did not arrive as a form; "
                          "send it again from the page.") from None
        if given.path is None:
            self._check_caller(request, given.fields)
            raise Refusal(422, "file_missing", "Choose an audio file to review first.")
        await _audio_only(given.path, given.file_name or "")
        return given

    def _room_for(self, request: Request) -> None:
        """Refused before a byte is read, when the form's length says it is too much."""
        declared = _declared_length(request)
        if declared is None:
            return
        if declared > MAX_DROP_BYTES + MAX_FIELD_BYTES * 8:
            raise _too_large()
        if shutil.disk_usage(self.archive.blobs.root).free - declared \
                < self.archive.min_free_bytes:
            raise self._no_room()

    def _check_caller(self, request: Request, fields: dict[str, str]) -> None:
        """The page's own form: its CSRF token (a field before the file), from this
        site; without one, the admin token (a program) or X-CSRF-Token."""
        if "csrf" not in fields:
            if self.access.may_change(request, self.csrf):
                return
            raise Refusal(401, "admin_token_required", "Send the admin token (agentbox "
                          "token) as a Bearer token, or the page's form.")
        if not page_token_ok(request, fields["csrf"], self.csrf):
            raise Refusal(403, "csrf_failed", CSRF_FAILED)

    async def _write(self, request: Request, parts: AsyncIterator[tuple[str, Any]],
                     path: Path) -> None:
        try:
            await receive(request, path, self.archive.min_free_bytes, _file_data(parts))
        except TooLarge:
            raise _too_large() from None
        except NoRoom:
            raise self._no_room() from None
        except OSError as exc:
            if not disk_full(exc):
                raise
            raise self._no_room() from None
        settled = time.time() - 3600  # whole: arrived, not being written
        os.utime(path, (settled, settled))

    def _no_room(self) -> Refusal:
        return Refusal(507, "insufficient_storage", (
            "There is no room to keep the file: it would leave less than "
            f"{self.archive.min_free_bytes // 1_000_000} MB free on the disk "
            "(AGENTBOX_MIN_FREE_MB). Free some space, or remove a project you no longer "
            "need."))


async def _file_data(parts: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[bytes]:
    """The data of the part that began last, up to its end."""
    async for kind, value in parts:
        if kind == "end":
            return
        if kind == "data":
            yield value


async def _field(parts: AsyncIterator[tuple[str, Any]], name: str,
                 fields: dict[str, str]) -> None:
    data = bytearray()
    async for chunk in _file_data(parts):
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            # a field past what the form documents (a project's name: 256 characters)
            # is an invalid form, as one within the limit but too long is
            raise Refusal(422, "form_field_too_large", f"The form's {name[:40]!r} is "
                          "longer than a form of the page's sends.")
    fields[name] = data.decode("utf-8", "replace")


def _file_name(given: str) -> str:
    """The file's own name (a browser sends it without folders; Windows' may have
    some), as a name agentbox keeps."""
    name = PurePath(given.replace("\\", "/")).name.strip()
    if name in (".", "..") or len(name.encode()) > MAX_FILE_NAME_BYTES:
        raise Refusal(422, "invalid_request", "The file's name cannot be kept: name it "
                      f"something other than . or .., within {MAX_FILE_NAME_BYTES} bytes.")
    try:
        return _NAME.validate_python(name or "mix.wav")
    except ValidationError:
        raise Refusal(422, "invalid_request", "The file's name cannot be kept: name it "
                      "without control characters.") from None


async def _audio_only(path: Path, name: str) -> None:
    """Refuse a file that is not audio (or is empty) before it makes a project."""
    said = await asyncio.to_thread(_not_audio, path)
    if said is not None:
        raise Refusal(422, "not_audio", f"{name} cannot be reviewed: {said}. Choose an "
                      "audio file (WAV, AIFF, FLAC, MP3, Ogg).")


def _not_audio(path: Path) -> str | None:
    import soundfile  # (here: the server's pages load without the audio libraries)

    if path.stat().st_size == 0:
        return "it is empty (0 bytes)"
    try:
        info = soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError, OSError):
        return "it is not an audio file agentbox can read"
    if info.frames <= 0 or info.channels <= 0:
        return "it holds no audio"
    return None


def _envelope(given: Given) -> bytes:
    """The review's event, as `agentbox send FILE` sends one: the page's project or
    the file's name, the stage asked for (none: as the project and file say)."""
    assert given.path is not None
    fields = given.fields
    project = fields.get("project", "").strip()
    try:
        project = project_name(_PROJECT.validate_python(project)) if project \
            else project_of_file(given.path)
    except ValidationError:
        raise Refusal(422, "invalid_request", "project: a project's name, 1 to 256 "
                      "characters without control characters.") from None
    stage = fields.get("stage", "")
    if stage and stage not in STAGES:
        raise Refusal(422, "invalid_stage", f"stage must be {' or '.join(STAGES)}, or "
                      "none (as the project and the file say).")
    payload = {"project_id": project, "mix_url": str(given.path),
               **({"stage": stage} if stage else {})}
    event_id = given.path.parent.name
    return json.dumps({
        "schema_version": SCHEMA_VERSION, "event_id": event_id,
        "idempotency_key": f"{DROP_SOURCE}:{DROP_EVENT}:{event_id}",
        "event_type": DROP_EVENT, "source": DROP_SOURCE,
        "timestamp": datetime.now(UTC).isoformat(), "payload": payload,
    }, separators=(",", ":"), ensure_ascii=False).encode()


def _declared_length(request: Request) -> int | None:
    with contextlib.suppress(ValueError):
        return max(int(request.headers.get("content-length", "")), 0)
    return None


def _too_large() -> Refusal:
    return Refusal(413, "file_too_large", f"The file is larger than {MAX_DROP_BYTES >> 20} MiB, "
                   "the most agentbox takes from the page: export a shorter or compressed "
                   "(FLAC) file.")
