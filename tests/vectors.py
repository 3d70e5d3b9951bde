"""The signature test vectors (cross-checked with the Standard Webhooks reference
library). The repository carries its own copy, so a clone tests on its own; when
the team's shared/ folder sits beside the clone, the copy must still match it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VECTORS_PATH = HERE / "data" / "signatures.json"
SHARED_VECTORS_PATH = HERE.parents[1] / "shared" / "vectors" / "signatures.json"


def load_vectors() -> dict[str, Any]:
    vectors: dict[str, Any] = json.loads(VECTORS_PATH.read_text())
    return vectors
