"""events.md's curl + openssl sender, run as written against a real agentbox (only its
address and the path of the agentbox command put in): taken, 202. And the pitfall it
warns of: the same request with `curl -d @event.json` is refused, its newlines gone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, Server

pytestmark = pytest.mark.skipif(not (shutil.which("curl") and shutil.which("openssl")),
                                reason="curl and openssl are the example's tools")


def sender_block() -> str:
    text = (ROOT / "agentbox" / "docs" / "events.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "openssl dgst" in b]
    assert len(blocks) == 1
    return blocks[0]


def run(server: Server, script: str) -> subprocess.CompletedProcess[str]:
    script = (script.replace("http://127.0.0.1:8000", server.url)
              .replace(".venv/bin/agentbox", f"{sys.executable} -m agentbox"))
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=server.env,
                          cwd=server.home, capture_output=True, text=True, timeout=60)


def test_the_manuals_curl_and_openssl_sender_is_taken(server: Server) -> None:
    block = sender_block()
    assert "--data-binary @event.json" in block
    sent = run(server, block)
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert answer["status"] == "accepted" and answer["duplicate"] is False
    run_id = answer["run_id"]
    assert server.run(run_id)["source"] == "studio-sh"
    assert "\n" in (server.home / "event.json").read_text().strip()  # several lines
    # The pitfall: -d strips the newlines, and the signature no longer matches.
    stripped = run(server, block.replace("--data-binary @event.json", "-d @event.json"))
    assert json.loads(stripped.stdout)["error_code"] == "signature_invalid"
