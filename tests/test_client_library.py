"""agentbox.client, the library people import: against a real server, against a
port nothing listens on, and against a recorder of the requests it makes."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox import client, proof
from agentbox.client import (
    RUN_ID,
    START_HINT,
    AgentboxError,
    Client,
    FileUnreadable,
    InvalidRunId,
    Misconfigured,
    NotAgentbox,
    NotFinished,
    NotFound,
    Refused,
    UnexpectedAnswer,
    Unreachable,
    build_event,
    check_run_id,
    segment,
)
from agentbox.models import RunDetail, RunList, RunState, RunView
from tests.conftest import SECRET, Server, free_port, make_event
from tests.support.runs import QUIET

SCRIPT = """
import json, sys
from pathlib import Path
from pydantic import BaseModel
from agentbox.client import Client, build_event

class Took(BaseModel):  # the scripted agent's result
    project_id: str
    attempt: int

with Client(sys.argv[1]) as box:  # the secret and admin token from the configuration
    answer = box.send(build_event("session.exported", "script", "take-1",
                                  {"project_id": "ok", "mix_url": "/mixes/take-1.wav"}))
    run = box.follow(answer.run_id, timeout=60)
    export = box.send_export(Path(sys.argv[2]))
    again = box.send_export(Path(sys.argv[2]))
    mastered = box.send_export(Path(sys.argv[2]), stage="master")
    dead = box.send(build_event("session.exported", "script", "take-2",
                                {"project_id": "always-fail", "mix_url": "/m.wav"}))
    failed = box.follow(dead["run_id"], timeout=60)  # read by name, as before models
    # the agent's result read into its own model (None for the run that failed)
    typed = box.follow(answer.run_id, result=Took)
    typed_failed = box.run(dead.run_id, result=Took)
    replayed = box.replay(dead.run_id)
    found = {"answer": answer, "run": run, "export": export, "again": again,
             "mastered": mastered, "failed": failed, "replayed": replayed}
    print(json.dumps({**{name: model.as_json() for name, model in found.items()},
                      "types": {name: type(model).__name__ for name, model in found.items()},
                      "listed": [r.as_json() for r in box.runs(limit=10).runs],
                      "exports": [e.as_json() for e in box.exports("ok").exports],
                      "typed": [type(typed.result).__name__, typed.result.attempt,
                                typed_failed.result],
                      "cli": "agentbox.cli" in sys.modules,
                      "digest": "agentbox.review.digest" in sys.modules}))
"""


def test_a_script_sends_and_follows_with_the_library_alone(server: Server,
                                                           tmp_path: Path) -> None:
    mix = tmp_path / "ok.wav"
    mix.write_bytes(b"a render (the scripted agent does not read it)")
    done = subprocess.run([sys.executable, "-c", SCRIPT, server.url, str(mix)],
                          env=server.env, cwd=server.home, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    assert told["answer"]["status"] == "accepted" and told["answer"]["duplicate"] is False
    assert told["run"]["run_id"] == told["answer"]["run_id"]
    assert told["run"]["status"] == "succeeded" and told["run"]["terminal"] is True
    assert server.run(told["answer"]["run_id"])["source"] == "script"  # signed: taken
    assert told["again"]["duplicate"] is True  # the same file: its first run
    assert told["again"]["run_id"] == told["export"]["run_id"]
    # the same file asked another way (a stage): a review of its own
    assert told["mastered"]["duplicate"] is False
    assert told["mastered"]["run_id"] != told["export"]["run_id"]
    assert told["failed"]["status"] == "dead_lettered"
    assert told["replayed"]["status"] == "accepted"  # the admin token, from the config
    assert {r["run_id"] for r in told["listed"]} >= {told["answer"]["run_id"],
                                                     told["export"]["run_id"]}
    assert told["exports"][0]["project"] == "ok"
    assert told["types"] == {"answer": "Accepted", "run": "RunDetail", "export": "Accepted",
                             "again": "Accepted", "mastered": "Accepted",
                             "failed": "RunDetail", "replayed": "RunView"}
    assert told["run"] == server.run(told["answer"]["run_id"])  # the answer as it came
    assert told["cli"] is False and told["digest"] is False  # the library alone
    assert told["typed"] == ["Took", 1, None]


def test_each_refusal_is_its_own_error(server_factory: Any) -> None:
    server = server_factory({"AGENTBOX_MAX_PENDING": "1"}).start()
    said: list[str] = []
    with Client(server.url, secret=SECRET, admin_token=server.admin_token(),
                progress=said.append, retries=1) as box:
        with pytest.raises(Refused) as refused:
            box.send(make_event(payload={"project_id": "ok"}))  # no mix_url
        assert refused.value.status == 422 and refused.value.error_code == "invalid_event"
        assert [e["loc"] for e in refused.value.errors] == [["payload", "mix_url"]]
        assert not isinstance(refused.value, NotFound) and said == []
        with pytest.raises(NotFound) as missing:
            box.run("run_nope")
        assert missing.value.status == 404 and missing.value.error_code == "run_not_found"
        assert str(missing.value) == "404: No run has the id 'run_nope'."
        with pytest.raises(NotFound) as no_project:
            box.exports("never exported")
        assert no_project.value.error_code == "project_not_found"
        busy = box.send(make_event(project_id="sleep-30"))  # the one run that may wait
        with pytest.raises(NotFinished) as unfinished:
            box.follow(busy.run_id, timeout=0.3)
        assert unfinished.value.run is not None and not unfinished.value.run.terminal
        with pytest.raises(Unreachable) as full:
            box.send(make_event())
    assert full.value.status == 429 and full.value.error_code == "too_many_pending"
    assert said == [f"429 too_many_pending; trying again in {max(0.5, full.value.retry_after):g} s"]
    assert str(full.value).endswith("runs are waiting (AGENTBOX_MAX_PENDING); retry later.")


def test_an_agentbox_that_is_not_there_is_unreachable_and_waited_for() -> None:
    said: list[str] = []
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, secret="s", retries=1, progress=said.append) as box:
        with pytest.raises(Unreachable) as gone:
            box.send(make_event())
        assert gone.value.status is None and "Start it with: agentbox serve" in str(gone.value)
        assert said == [f"cannot reach agentbox at {url} (nothing answers there); trying "
                        f"again in 0.5 s. {START_HINT}"]  # how to start it, at once
        with pytest.raises(Unreachable):
            box.run("run_1")
        said.clear()
        with pytest.raises(Unreachable):
            box.follow("run_1", unreachable_timeout=0.3, sleep=lambda s: None)
        assert said[0] == f"cannot reach agentbox at {url} (ConnectError); waiting for it"
    assert issubclass(Unreachable, AgentboxError) and issubclass(NotFound, Refused)


# -- what goes into a request's path --------------------------------------------------------


RECORDER_TOKEN = "the-recorder-s-admin-token-0123"


class Recorder(http.server.BaseHTTPRequestHandler):
    """A server that writes down every request line and answers 404 as agentbox does
    (and proves itself as agentbox does, with RECORDER_TOKEN: agentbox.proof)."""

    seen: ClassVar[list[str]] = []
    protocol_version = "HTTP/1.1"  # kept alive, as uvicorn's: the proof's connection serves on

    def _proved(self) -> bool:
        """Whether this was the proof asked before any request, now answered."""
        if not self.path.startswith(proof.PROOF_PATH):
            return False
        nonce = parse_qs(urlsplit(self.path).query)["nonce"][0]
        body = json.dumps(proof.answer(RECORDER_TOKEN.encode(), nonce,
                                       self.server.server_address[:2])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def _answer(self) -> None:
        if self._proved():
            return
        self.seen.append(f"{self.command} {self.path}")
        body = json.dumps({"error_code": "run_not_found", "message": "no such run"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def recorder() -> Iterator[str]:
    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{served.server_address[1]}"
    served.shutdown()
    served.server_close()


HOSTILE = ["../prune?", "run_1/replay", "run_1?history=1", "run_1#x", "run_%2e%2e",
           "run_1/../../prune", "", "run_", "run_ 1", "run_1\n", "RUN_1", "run_é"]


@pytest.mark.parametrize("run_id", HOSTILE)
def test_what_is_not_a_run_id_is_never_sent(recorder: str, run_id: str) -> None:
    Recorder.seen.clear()
    with Client(recorder, secret="s", admin_token=RECORDER_TOKEN) as box:
        for call in (box.run, box.replay, box.follow):
            with pytest.raises(InvalidRunId) as refused:
                call(run_id)
            assert "is not a run id" in str(refused.value)
    assert Recorder.seen == []


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_a_run_id_reaches_its_own_path_or_none(recorder: str, run_id: str) -> None:
    Recorder.seen.clear()
    with Client(recorder, admin_token=RECORDER_TOKEN) as box:
        try:
            box.replay(run_id)
        except InvalidRunId:
            assert not RUN_ID.fullmatch(run_id)
            assert Recorder.seen == []
        except NotFound:
            assert Recorder.seen == [f"POST /runs/{run_id}/replay"]
        else:
            raise AssertionError("the recorder answers 404 to everything")


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda t: "\x00" not in t))
def test_a_project_name_reaches_the_query_as_it_is(recorder: str, project: str) -> None:
    Recorder.seen.clear()
    with Client(recorder, admin_token=RECORDER_TOKEN) as box, pytest.raises(NotFound):
        box.exports(project)
    method, target = Recorder.seen[0].split(" ", 1)
    parts = urlsplit(target)
    assert (method, parts.path) == ("GET", "/exports")
    assert parse_qs(parts.query, keep_blank_values=True)["project"] == [project]


@given(st.text())
def test_a_segment_holds_no_separator_and_reads_back(text: str) -> None:
    quoted = segment(text)
    assert not set(quoted) & set("/?#;&= \n")
    assert unquote(quoted) == text
    if RUN_ID.fullmatch(text):
        assert check_run_id(text) == quoted == text  # a run id needs no quoting


def test_the_store_s_run_ids_are_run_ids() -> None:
    from agentbox.store.ingest import new_run_id

    assert all(RUN_ID.fullmatch(new_run_id()) for _ in range(100))
    assert RUN_ID.fullmatch("run_" + uuid.uuid4().hex)  # as they were made before


def test_an_event_is_built_with_its_idempotency_key() -> None:
    event = build_event("session.exported", "daw", "take-1", {"project_id": "p"},
                        callback_url="https://studio.example/cb")
    assert event["idempotency_key"] == "daw:session.exported:take-1"
    assert event["timestamp"].endswith("Z") and event["callback_url"].startswith("https")


# -- typed answers and errors -------------------------------------------------------------


def test_a_file_that_cannot_be_read_is_an_agentbox_error(recorder: str,
                                                         tmp_path: Path) -> None:
    Recorder.seen.clear()
    missing = tmp_path / "never rendered.wav"
    with Client(recorder, secret="s", admin_token=RECORDER_TOKEN) as box:
        for send in (box.send_export, lambda path: box.add_reference(path, "p")):
            with pytest.raises(FileUnreadable) as unread:
                send(missing)
            assert isinstance(unread.value, AgentboxError) and isinstance(unread.value,
                                                                          OSError)
            assert unread.value.filename == str(missing)
            assert str(unread.value) == f"cannot read {missing}: No such file or directory"
    assert Recorder.seen == []  # nothing was sent


class Stranger(Recorder):
    """JSON that is not agentbox's answer (a field missing)."""

    def _answer(self) -> None:
        if self._proved():
            return
        body = json.dumps({"runs": [{"run_id": "run_1"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer


@pytest.mark.parametrize("read", ["runs", "runs_json"])
def test_json_of_another_shape_is_not_agentbox_s_answer(read: str) -> None:
    """Read into the models, or as sent (`runs_json`, checked without pydantic): the
    same refusal, in the model's words."""
    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stranger)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{served.server_address[1]}",
                    admin_token=RECORDER_TOKEN) as box, \
                pytest.raises(UnexpectedAnswer) as odd:
            getattr(box, read)()
    finally:
        served.shutdown()
        served.server_close()
    assert isinstance(odd.value, NotAgentbox) and isinstance(odd.value, AgentboxError)
    assert "not agentbox's RunList (runs.0.status: Field required)" in str(odd.value)
    assert odd.value.answer == {"runs": [{"run_id": "run_1"}]}


def test_the_fields_runs_json_checks_are_the_run_view_s() -> None:
    """client.RUN_FIELDS, which `runs_json` checks an answer by without pydantic, names
    RunView's fields, those it requires, and each one's types."""
    fields = RunView.model_fields
    assert set(client.RUN_FIELDS) == set(fields)
    for name, (types, required) in client.RUN_FIELDS.items():
        assert required == fields[name].is_required(), name
        annotation = fields[name].annotation
        if annotation is Any:
            assert types == (object,), name
            continue
        if get_origin(annotation) is Literal:  # the run's state: text, one of RUN_STATES
            listed = {type(value) for value in get_args(annotation)}
        else:
            listed = set(get_args(annotation)) if get_args(annotation) else {annotation}
        assert listed == set(types), name
    assert set(get_args(RunState)) == client.RUN_STATES


# A run as GET /runs lists it (an app's field, `project`, among them).
QUIET_VIEW = {key: value for key, value in QUIET.items() if key != "callbacks"}


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) \
        | st.text(max_size=3)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=2)
                        | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=4)


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(sorted(RunView.model_fields)),
                               json_values() | st.sampled_from(["succeeded", "retrying"]),
                               max_size=3),
       dropped=st.sets(st.sampled_from(sorted(RunView.model_fields)), max_size=2))
def test_a_listing_runs_json_takes_as_sent_is_one_the_model_reads_alike(
        changes: dict[str, Any], dropped: set[str]) -> None:
    """What the check without pydantic passes, the model reads, to the same JSON; what
    it refuses goes to the model, which says what is amiss (or reads it)."""
    run = {key: value for key, value in {**QUIET_VIEW, **changes}.items()
           if key not in dropped}
    answer = {"runs": [run]}
    listed = client.listed_runs(answer)
    if listed is not None:
        assert [r.as_json() for r in RunList.model_validate(answer).runs] == listed


def test_a_newer_agentbox_s_field_is_kept_and_given_back() -> None:
    from tests.support.runs import QUIET

    sent = {**QUIET, "file": None, "the_next_field": [1, None]}
    run = RunDetail.model_validate(sent)
    # The apps' fields of a run (the review's project) are extra fields too.
    assert run.model_extra == {"project": QUIET["project"], "the_next_field": [1, None]}
    assert run.project == QUIET["project"] == run.get("project")  # read by attribute
    assert run.as_json() == sent and run["the_next_field"] == [1, None]
    assert run["status"] == run.status and run.get("attempts") is None
    with pytest.raises(KeyError):
        run["attempts"]  # left out of the answer (no ?history=1): not there, as before


def test_the_package_says_it_is_typed() -> None:
    root = Path(__file__).resolve().parent.parent
    assert (root / "agentbox" / "py.typed").is_file()
    assert '"py.typed"' in (root / "pyproject.toml").read_text()


def test_a_credential_that_cannot_be_kept_is_misconfigured(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    """The secret and the token are made on first use in the config directory: one
    that cannot be made (a file stands there) is said as Misconfigured, an
    AgentboxError, naming the variable that gives it instead."""
    (tmp_path / "config").write_text("a file where the config directory would be")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("AGENTBOX_WEBHOOK_SECRET", "AGENTBOX_ADMIN_TOKEN", "AGENTBOX_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    with Client(f"http://127.0.0.1:{free_port()}", environ={}) as box:
        for call, variable in ((box.signing_secret, "AGENTBOX_WEBHOOK_SECRET"),
                               (lambda: box.replay("run_1"), "AGENTBOX_ADMIN_TOKEN")):
            with pytest.raises(Misconfigured) as unkept:
                call()
            assert f"give it in {variable}" in str(unkept.value)


class ClosingAfterProof(Recorder):
    """agentbox at its connections' limit: it proves itself, then closes."""

    def end_headers(self) -> None:
        if self.path.startswith(proof.PROOF_PATH):
            self.send_header("Connection", "close")
        super().end_headers()


def test_a_connection_closed_after_its_proof_is_not_used_for_the_request() -> None:
    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ClosingAfterProof)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    Recorder.seen.clear()
    try:
        with Client(f"http://127.0.0.1:{served.server_address[1]}",
                    admin_token=RECORDER_TOKEN) as box, pytest.raises(Unreachable):
            box.runs()
    finally:
        served.shutdown()
        served.server_close()
    assert Recorder.seen == []  # proved each time, closed each time: never asked
