"""Agent plugins, fan-out and agent-to-agent chains, end to end against a real server.

The agents are in tests/support/agents.py; the plugin is a real installed
distribution (a dist-info folder with its entry points) on the server's path.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server, make_event, wait_until
from tests.support.callback_receiver import CallbackReceiver
from tests.test_callbacks import CALLBACK_SECRET, wait_callbacks

AGENTS = "tests.support.agents"
CHAIN = f"chain.ping={AGENTS}:ping_agent,chain.pong={AGENTS}:pong_agent"


def ping(label: str = "hello", **extra: Any) -> dict[str, Any]:
    return make_event(event_type="chain.ping", payload={"label": label}, **extra)


def runs_of_chain(server: Server, root_event_id: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = server.client.get(
        "/runs", params={"correlation_id": root_event_id, "limit": 500}).json()["runs"]
    return sorted(runs, key=lambda r: r["hop"])


def test_a_chain_that_comes_back_to_an_agent_is_stopped(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_AGENTS": CHAIN}).start()
    # the other chain's first event names its chain itself: its followers carry that name
    root, other = ping(), ping("another chain", correlation_id="tour-2026")
    response = server.post(root)
    assert response.status_code == 202, response.text
    assert server.post(other).status_code == 202

    def settled(chain: str) -> list[dict[str, Any]] | None:
        runs = runs_of_chain(server, chain)
        return runs if len(runs) == 3 and all(r["terminal"] for r in runs) else None

    a, b, again = wait_until(lambda: settled(root["event_id"]), 20, "the chain to settle")
    others = wait_until(lambda: settled("tour-2026"), 20, "the other chain to settle")
    assert others[0]["event_id"] == other["event_id"]
    assert runs_of_chain(server, other["event_id"]) == []  # not the chain's name
    assert not {r["run_id"] for r in others} & {a["run_id"], b["run_id"], again["run_id"]}
    for bad in ("", "x" * 257):
        refused = server.client.get("/runs", params={"correlation_id": bad})
        assert refused.status_code == 422 and refused.json()["error_code"] == "invalid_query"
    assert (a["agent"], a["status"], a["hop"]) == (f"{AGENTS}:ping_agent", "succeeded", 0)
    assert (b["agent"], b["event_type"], b["status"], b["hop"]) == (
        f"{AGENTS}:pong_agent", "chain.pong", "succeeded", 1)
    assert b["correlation_id"] == root["event_id"] and b["causation_id"] == root["event_id"]
    assert b["event_id"] == a["result"]["emitted"] == f"{a['run_id']}.e0"
    assert b["source"] == "agentbox"
    assert (again["agent"], again["event_type"], again["status"], again["error_code"]) == (
        f"{AGENTS}:ping_agent", "chain.ping", "dead_lettered", "loop_detected")
    assert again["hop"] == 2 and again["causation_id"] == b["event_id"]
    assert "already handled chain.ping" in again["error_message"]
    assert again["attempt"] == 0  # recorded, never run
    dead = server.client.get("/runs", params={"status": "dead_lettered"}).json()["runs"]
    assert {r["run_id"] for r in dead} == {again["run_id"], others[2]["run_id"]}
    in_chain = server.client.get("/runs", params={"status": "dead_lettered",
                                                  "correlation_id": root["event_id"]})
    assert [r["run_id"] for r in in_chain.json()["runs"]] == [again["run_id"]]


def test_a_chain_longer_than_max_hops_is_stopped(server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_AGENTS": CHAIN, "AGENTBOX_MAX_HOPS": "1"}).start()
    root = ping(correlation_id="session-42")
    server.post(root)

    def settled() -> list[dict[str, Any]] | None:
        runs = runs_of_chain(server, "session-42")
        return runs if len(runs) == 3 and all(r["terminal"] for r in runs) else None

    _, pong, stopped = wait_until(settled, 20, "the chain to settle")
    assert pong["correlation_id"] == "session-42"  # the sender's correlation carries on
    assert stopped["error_code"] == "loop_detected"
    assert "AGENTBOX_MAX_HOPS is 1" in stopped["error_message"]


def test_an_incoming_event_past_the_hop_limit_is_stopped(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_AGENTS": CHAIN, "AGENTBOX_MAX_HOPS": "3"}).start()
    response = server.post(ping(hop=4, correlation_id="c1", causation_id="x"))
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "dead_lettered"
    run = server.run(response.json()["run_id"])
    assert (run["status"], run["error_code"], run["attempt"]) == (
        "dead_lettered", "loop_detected", 0)


def test_an_invalid_emitted_payload_fails_the_run(server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_AGENTS": f"chain.ping={AGENTS}:bad_emitter,"
                                                f"chain.pong={AGENTS}:pong_agent"}).start()
    run = server.wait_terminal(server.post(ping()).json()["run_id"])
    assert (run["status"], run["error_code"]) == ("failed_permanent", "invalid_emit")
    assert "payload.label" in run["error_message"]


def test_emitting_a_type_nobody_handles_fails_the_run(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory({"AGENTBOX_AGENTS": f"chain.ping={AGENTS}:ping_agent"}).start()
    run = server.wait_terminal(server.post(ping()).json()["run_id"])
    assert (run["status"], run["error_code"]) == ("failed_permanent", "emit_unhandled")


def test_emitting_a_type_only_a_subscribed_agent_receives_runs_that_agent(
        server_factory: Callable[..., Server]) -> None:
    """chain.pong has no agent in the configuration; one agent subscribes to it with
    ctx.subscribe. Emitting it then succeeds and runs that agent; before the
    subscription it fails the run as emit_unhandled."""
    subscriber = f"{AGENTS}:subscribing"
    server = server_factory({"AGENTBOX_AGENTS": f"chain.ping={AGENTS}:ping_agent,"
                                                f"session.exported={subscriber}"}).start()
    before = server.wait_terminal(server.post(ping()).json()["run_id"])
    assert (before["status"], before["error_code"]) == ("failed_permanent", "emit_unhandled")
    assert "no agent handles or subscribed to" in before["error_message"]

    changed = server.post(make_event(project_id="subscribe-pong")).json()["run_id"]
    assert server.wait_terminal(changed)["status"] == "succeeded"
    root = ping("after")
    run = server.wait_terminal(server.post(root).json()["run_id"])
    assert (run["status"], run["error_code"]) == ("succeeded", None), run
    chain = wait_until(lambda: (found := runs_of_chain(server, root["event_id"]))
                       and len(found) == 2 and found, 10, "the chain.pong run")
    pong = server.wait_terminal(chain[1]["run_id"])
    assert (pong["event_type"], pong["agent"], pong["status"]) == (
        "chain.pong", subscriber, "succeeded")
    assert pong["result"] == {"agent": "subscribing", "label": "after"}


def test_fan_out_of_three_agents_with_one_failing(
        server_factory: Callable[..., Server]) -> None:
    receiver = CallbackReceiver(CALLBACK_SECRET)
    try:
        server = server_factory({
            "AGENTBOX_AGENTS": f"session.exported={AGENTS}:scripted,"
                               f"session.exported={AGENTS}:second,"
                               f"session.exported={AGENTS}:always_permanent",
            "AGENTBOX_CALLBACK_ALLOWED": receiver.origin,
            "AGENTBOX_CALLBACK_SECRET": CALLBACK_SECRET,
        }).start()
        response = server.post(make_event(project_id="fail-1", callback_url=receiver.url("/ok")))
        assert response.status_code == 202
        runs = response.json()["runs"]
        assert [r["agent"].rsplit(":", 1)[1] for r in runs] == [
            "scripted", "second", "always_permanent"]
        final = {r["agent"].rsplit(":", 1)[1]: server.wait_terminal(r["run_id"]) for r in runs}
        assert (final["scripted"]["status"], final["scripted"]["retry_count"]) == ("succeeded", 1)
        assert (final["second"]["status"], final["second"]["retry_count"]) == ("succeeded", 0)
        assert final["always_permanent"]["status"] == "failed_permanent"
        # each run has its own callbacks
        counts = {"scripted": 4, "second": 2, "always_permanent": 2}
        for name, run in final.items():
            shown = wait_callbacks(server, run["run_id"], counts[name], "delivered")
            assert all(c["run_id"] == run["run_id"] for c in shown)
        assert f"{final['always_permanent']['run_id']}:failed_permanent:0" in \
            receiver.delivered_ids()
    finally:
        receiver.close()


# -- plugins --------------------------------------------------------------------------------


@pytest.fixture
def plugin_path(tmp_path: Path) -> Iterator[Path]:
    """A pip-installed plugin as Python sees one: a package and its dist-info."""
    site = tmp_path / "site"
    (site / "stemcheck").mkdir(parents=True)
    (site / "stemcheck" / "__init__.py").write_text(textwrap.dedent('''
        from pydantic import BaseModel
        from agentbox import AgentPlugin

        class StemBounced(BaseModel):
            stem: str
            peak_dbfs: float

        async def check_stem(event, ctx):
            p = event.payload
            return {"stem": p.stem, "too_hot": p.peak_dbfs > -1.0}

        plugin = AgentPlugin(check_stem, event_types=("stem.bounced",),
                             payload_models={"stem.bounced": StemBounced})
    '''))
    info = site / "stemcheck-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stemcheck\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[agentbox.engine.agents]\nstems = stemcheck:plugin\n")
    yield site


def test_an_installed_plugin_brings_its_agent_and_event_type(
        server_factory: Callable[..., Server], plugin_path: Path) -> None:
    server = server_factory()
    server.env["PYTHONPATH"] = f"{plugin_path}:{server.env['PYTHONPATH']}"
    server.start()
    event = make_event(event_type="stem.bounced", payload={"stem": "drums", "peak_dbfs": -0.2})
    response = server.post(event)
    assert response.status_code == 202, response.text
    run = server.wait_terminal(response.json()["run_id"])
    assert run["status"] == "succeeded" and run["agent"] == "stemcheck:check_stem"
    assert run["result"] == {"stem": "drums", "too_hot": True}
    # validated as strictly as the built-in types
    for payload in ({"stem": "drums", "peak_dbfs": "-0.2"},
                    {"stem": "drums", "peak_dbfs": -3, "extra": 1}):
        refused = server.post(make_event(event_type="stem.bounced", payload=payload))
        assert refused.status_code == 422, refused.text


def test_a_broken_plugin_refuses_to_start(server_factory: Callable[..., Server],
                                         plugin_path: Path) -> None:
    (plugin_path / "stemcheck" / "__init__.py").write_text("plugin = 42\n")
    server = server_factory()
    server.env["PYTHONPATH"] = f"{plugin_path}:{server.env['PYTHONPATH']}"
    with pytest.raises(AssertionError) as failed:
        server.start()
    assert "agent plugin stems (stemcheck:plugin) is not an" in str(failed.value)
