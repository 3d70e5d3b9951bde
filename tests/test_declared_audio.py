"""No file costs more analysis than its real size: a small WAV whose header declares
hours of audio is refused at once (cut short) or measured for what it holds, never
decoded for what it declares (agentbox.review.meter)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from agentbox.review import meter

RATE, CHANNELS, BITS = 48_000, 2, 16
BLOCK = CHANNELS * BITS // 8
HELD = 4000  # bytes of audio the file really holds: 1,000 frames
DECLARED = min(int(3.9 * 3600 * RATE) * BLOCK, 0xFFFFFFF0)  # 3.9 hours, as the header says
FMT = b"fmt " + struct.pack("<IHHIIHH", 16, 1, CHANNELS, RATE, RATE * BLOCK, BLOCK, BITS)


def riff(body: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


FILES = {
    "declared-hours": riff(FMT + b"data" + struct.pack("<I", DECLARED) + bytes(HELD)),
    "streamed": riff(FMT + b"data" + struct.pack("<I", 0xFFFFFFFF) + bytes(HELD)),
    "rf64": b"RF64" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"ds64"
    + struct.pack("<IQQQI", 28, DECLARED + 36, DECLARED, DECLARED // BLOCK, 0) + FMT
    + b"data" + struct.pack("<I", 0xFFFFFFFF) + bytes(HELD),
}


@pytest.mark.parametrize("kind", list(FILES))
def test_a_header_declaring_hours_costs_only_what_the_file_holds(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / f"{kind}.wav"
    path.write_bytes(FILES[kind])
    fed: list[int] = []
    feed = meter._Meter.feed

    def counted(self: meter._Meter, block: object) -> None:
        fed.append(len(block))  # type: ignore[arg-type]
        feed(self, block)  # type: ignore[arg-type]

    monkeypatch.setattr(meter._Meter, "feed", counted)
    try:
        measured = meter.measure(str(path))
    except meter.AudioError as exc:
        assert exc.code == "mix_truncated" and "the header promises 234:00.0" in str(exc)
    else:
        assert measured.frames_read == HELD // BLOCK  # what it holds, measured
    assert sum(fed) <= HELD // BLOCK  # decoded: at most the frames it holds
