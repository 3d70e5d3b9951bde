"""What an audio file's container says of the audio in it, read from its headers
without decoding a sample: whether a writer has finished it (the watcher's
question) and how many frames its header promises against how many its data
holds (the meter's: libsndfile quietly shortens a cut-off file to what is there).

WAV, RF64, W64, AIFF and CAF name the size of their audio chunk; FLAC counts its
samples in STREAMINFO (0 until the encoder finishes); Ogg flags its last page;
an MP3 may carry a Xing/Info frame with its byte count. The RIFF/IFF chunk walk
that WAV and AIFF share is written once (`_chunks`).
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def _chunks(f: BinaryIO, start: int, end: int, big_endian: bool
            ) -> Iterator[tuple[bytes, int, int]]:
    """(id, offset of its data, declared size) of each RIFF/IFF chunk in [start, end)."""
    offset = start
    while offset + 8 <= end:
        f.seek(offset)
        header = f.read(8)
        if len(header) < 8:
            return
        size = struct.unpack(">I" if big_endian else "<I", header[4:])[0]
        yield header[:4], offset + 8, size
        offset += 8 + size + (size & 1)


def audio_complete(path: Path) -> bool | None:
    """Whether the file holds all the audio its header declares: False while a
    writer has not yet filled it in (or it was cut short), None when the file
    says nothing of its length (the time it stays unchanged has to decide).
    WAV, RF64, W64, AIFF and CAF: the audio chunk's size; FLAC: False while its
    sample count is 0; Ogg: the last page whole and flagged end-of-stream; MP3:
    the byte count of its Xing/Info frame."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(40)
            kind, form = head[:4], head[8:12]
            if kind in (b"RIFF", b"RF64") and form == b"WAVE":
                return _wave_complete(f, size, kind == b"RF64")
            if kind == b"FORM" and form in (b"AIFF", b"AIFC"):
                return _data_complete(f, size, b"SSND", big_endian=True)
            if kind == b"fLaC":
                return _flac_complete(head + f.read(30))
            if head[:16] == W64_RIFF and head[24:40] == W64_WAVE:
                return _w64_complete(f, size, int.from_bytes(head[16:24], "little"))
            if kind == b"caff":
                return _caf_complete(f, size)
            if kind == b"OggS":
                return _ogg_complete(f, size)
            if kind[:3] == b"ID3" or (kind[0] == 0xFF and kind[1] & 0xE0 == 0xE0):
                return _mp3_complete(f, size)
    except (OSError, ValueError, IndexError):
        return None
    return None


W64_RIFF = bytes.fromhex("726966662e91cf11a5d628db04c10000")
W64_WAVE = bytes.fromhex("77617665f3acd3118cd100c04f8edb8a")


def _w64_complete(f: BinaryIO, size: int, declared: int) -> bool:
    """Sony Wave64: GUID-named chunks, 64-bit sizes that count their own 24-byte
    header, 8-byte aligned; libsndfile leaves the file's size 0 until it closes."""
    if declared == 0 or declared > size:
        return False
    offset = 40
    while offset + 24 <= size:
        f.seek(offset)
        header = f.read(24)
        length = int.from_bytes(header[16:24], "little")
        if header[:4] == b"data":
            return length > 24 and offset + length <= size
        if length < 24:
            return False
        offset += (length + 7) // 8 * 8
    return False


def _caf_complete(f: BinaryIO, size: int) -> bool | None:
    """CAF: chunks of (type, big-endian int64 size); the audio data's size is -1
    when written "to the end" (then the file says nothing of its length)."""
    offset = 8
    while offset + 12 <= size:
        f.seek(offset)
        header = f.read(12)
        length = int.from_bytes(header[4:], "big", signed=True)
        start = offset + 12
        if header[:4] == b"data":
            if length == -1:
                return None
            end = start + length
            # A size the writer has not filled in yet is short of the audio after it.
            return end <= size and (end == size or _chunk_id(f, end))
        if length < 0:
            return False
        offset = start + length
    return False


def _chunk_id(f: BinaryIO, offset: int) -> bool:
    """Whether a chunk starts at `offset` (its type four printable characters)."""
    f.seek(offset)
    kind = f.read(4)
    return len(kind) == 4 and all(32 < c < 127 for c in kind)


def _ogg_complete(f: BinaryIO, size: int) -> bool:
    """Ogg: the stream's last page, whole and flagged end-of-stream, is written last."""
    start = max(0, size - 70_000)  # a page is at most 65,307 bytes
    f.seek(start)
    tail = f.read()
    at = tail.rfind(b"OggS")
    while at >= 0:
        page = tail[at:]
        if len(page) >= 27 and page[4] == 0 and len(page) >= 27 + page[26]:
            length = 27 + page[26] + sum(page[27:27 + page[26]])
            if at + length == len(tail):
                return bool(page[5] & 0x04)
        at = tail.rfind(b"OggS", 0, at)
    return False


def _mp3_complete(f: BinaryIO, size: int) -> bool | None:
    """MP3: a Xing/Info frame (or VBRI) at the start says how many bytes follow; an
    encoder fills its counts in when it finishes. Without one, None."""
    f.seek(0)
    head = f.read(10)
    start = 0
    if head[:3] == b"ID3":  # a tag first: its size is four 7-bit bytes
        start = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10]))
        start += 10 if head[5] & 0x10 else 0  # a footer too
    f.seek(start)
    frame = f.read(200)
    if len(frame) < 4 or frame[0] != 0xFF or frame[1] & 0xE0 != 0xE0:
        return None
    at = max(frame.find(b"Xing"), frame.find(b"Info"))
    if at >= 0:
        flags = int.from_bytes(frame[at + 4:at + 8], "big")
        fields = frame[at + 8:at + 16]
        frames = int.from_bytes(fields[:4], "big") if flags & 1 else None
        total = int.from_bytes(fields[4:8] if flags & 1 else fields[:4], "big") \
            if flags & 2 else None
        if frames == 0 or total == 0:
            return False
        return total is None or start + total <= size
    at = frame.find(b"VBRI")
    if at >= 0:
        total = int.from_bytes(frame[at + 10:at + 14], "big")
        return total > 0 and start + total <= size
    return None


def _flac_complete(head: bytes) -> bool | None:
    """False while STREAMINFO's total samples is 0 (libFLAC fills it in when it
    finishes); otherwise unknown: FLAC's frames cannot be counted cheaply."""
    if len(head) < 8 + 18 or head[4] & 0x7F != 0:  # the first block must be STREAMINFO
        return None
    total = int.from_bytes(head[8 + 10:8 + 18], "big") & ((1 << 36) - 1)
    return False if total == 0 else None


def _wave_complete(f: BinaryIO, size: int, rf64: bool) -> bool:
    if not rf64:
        return _data_complete(f, size, b"data", big_endian=False)
    declared = None
    for chunk, start, length in _chunks(f, 12, size, big_endian=False):
        if chunk == b"ds64" and length >= 16:
            f.seek(start + 8)  # after the RIFF size: the data size
            declared = struct.unpack("<Q", f.read(8))[0]
        elif chunk == b"data":
            return declared is not None and start + declared <= size
    return False


def _data_complete(f: BinaryIO, size: int, data_id: bytes, big_endian: bool) -> bool:
    for chunk, start, length in _chunks(f, 12, size, big_endian):
        if chunk == data_id:
            # 0 or 0xFFFFFFFF with audio after it: a size the writer fills in at the end.
            placeholder = length in (0, 0xFFFFFFFF) and start < size
            return not placeholder and start + length <= size
    return False  # no audio chunk yet


# -- frames promised and frames there ------------------------------------------------------------


def declared_frames(path: str | Path | BinaryIO) -> tuple[int, int] | None:
    """(frames the header promises, frames the file's data holds) for WAV and AIFF,
    read from the chunks themselves. None when the header does not say (streamed
    writes, RF64, other formats). Given an open file, reads it from its start (and
    leaves it open)."""
    try:
        with contextlib.nullcontext(path) if not isinstance(path, (str, Path)) \
                else open(path, "rb") as f:
            f.seek(0)
            head = f.read(12)
            size = os.fstat(f.fileno()).st_size
            if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
                return _wav_frames(f, size)
            if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
                return _aiff_frames(f, size)
    except (OSError, struct.error):
        return None
    return None


def _wav_frames(f: BinaryIO, size: int) -> tuple[int, int] | None:
    block_align = 0
    for chunk, start, length in _chunks(f, 12, size, big_endian=False):
        if chunk == b"fmt " and length >= 14:
            f.seek(start + 12)
            block_align = struct.unpack("<H", f.read(2))[0]
        elif chunk == b"data":
            if not block_align or length in (0, 0xFFFFFFFF):
                return None  # a streamed write: the length is not known in the header
            present = max(0, size - start)
            return length // block_align, min(length, present) // block_align
    return None


def _aiff_frames(f: BinaryIO, size: int) -> tuple[int, int] | None:
    frames = frame_bytes = 0
    for chunk, start, length in _chunks(f, 12, size, big_endian=True):
        if chunk == b"COMM" and length >= 8:
            f.seek(start)
            channels, frames, bits = struct.unpack(">hIh", f.read(8))
            frame_bytes = channels * ((bits + 7) // 8)
        elif chunk == b"SSND":
            f.seek(start)
            offset = struct.unpack(">I", f.read(4))[0]  # then the block size, unused
            if not frame_bytes:
                return None
            present = max(0, size - start - 8 - offset)
            return frames, min(frames, present // frame_bytes)
    return None
