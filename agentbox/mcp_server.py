"""`agentbox mcp`: agentbox's tools for an AI assistant on this machine, served over
the Model Context Protocol on stdio with the official MCP Python SDK (`mcp`).

The server is a client of a running agentbox, as `send`, `runs` and `show` are: it
reads the same configuration (the config file, AGENTBOX_URL, `--url`; the webhook
secret it signs with, the admin token it replays with) and talks to agentbox's HTTP
API through `agentbox.client`. It opens no database. A failure comes back as a tool
error carrying the sentence the CLI would print. stdout is the protocol's channel:
the SDK points file descriptor 1 at stderr while it serves, so every log line goes
there.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import AfterValidator, BaseModel, Field, ValidationError

from agentbox import terminal
from agentbox.client import (
    AgentboxError,
    Client,
    NotFinished,
    Refused,
    Unreachable,
    build_event,
    export_event,
    export_id,
)
from agentbox.config import ConfigError, load_settings
from agentbox.logs import one_line, setup_logging
from agentbox.models import Accepted, RunDetail, RunView
from agentbox.review import digest, present
from agentbox.review.answers import ExportView
from agentbox.review.figures import FIGURES
from agentbox.review.genres import GENRES
from agentbox.review.profiles import PROFILES
from agentbox.runs import RunStatus

SOURCE = "mcp"  # the events' `source`: what sent them
SEND_RETRIES = 2  # on 429, 503 and connection errors (0.5 s, then 1 s): an assistant waits
MAX_WAIT_SECONDS = 600.0
MAX_LIMIT = 500
INSTRUCTIONS = (
    "agentbox runs AI agents on events, durably. Its built-in agent reviews a rendered "
    "mix: integrated loudness, true peak, loudness range, clipping, stereo, against a "
    "delivery target, with notes on what to fix first. Send a mix with send_export (or "
    "request_review), then read the review with show_run (or wait for it with "
    "wait_seconds). A project's exports over time: project_history. Failed runs that "
    "wait for a decision: list_dead_letters, then replay_run.")
UNAVAILABLE = ("cannot reach agentbox at {url}, or it stayed busy: is it running (scripts/run, "
               "or agentbox serve)? Another address: AGENTBOX_URL, or agentbox mcp --url.")


# -- what the tools answer (their output schemas) ---------------------------------------------


class RunSummary(BaseModel):
    """One run, in a line and in fields."""

    run_id: str
    status: str
    event_type: str
    agent: str
    project: str | None
    file: str | None = Field(description="the reviewed file's name, when known")
    verdict: str | None = Field(description="pass, warn or fail: a review's verdict")
    headline: str | None = Field(description="integrated loudness, true peak, LRA, PLR")
    accepted_at: str
    completed_at: str | None
    retry_count: int
    error_code: str | None
    line: str = Field(description="the run in one line, as `agentbox runs` tells it")


class RunList(BaseModel):
    runs: list[RunSummary]


class RunReport(RunSummary):
    """A run and its review: what the musician reads, and the structured result."""

    terminal: bool
    figures: dict[str, float] = Field(
        description="the review's measured figures by key (integrated_lufs, "
                    "true_peak_dbtp, loudness_range_lu, ...)")
    # The review's own notes (review.present.NoteLine: severity, text, code), one line each.
    notes: list[present.NoteLine] = Field(description="the review's notes, what to fix first "
                                                  "first: severity (fix, consider or info; "
                                                  "'' when the review has none), text, code")
    review: str = Field(description="the review as `agentbox show` prints it")
    run: dict[str, Any] = Field(description="the run as GET /runs/{run_id}?history=1 "
                                            "answers: result, attempts, history, callbacks")


class SendAnswer(BaseModel):
    """What agentbox answered to an event, and the review if it was waited for."""

    run_id: str = Field(description="the (first) run the event started")
    status: str
    duplicate: bool = Field(description="true: this event was sent before; the first "
                                        "run's id and status")
    runs: list[dict[str, Any]] = Field(description="one run per agent the event reached")
    review: RunReport | None = Field(default=None,
                                     description="with wait_seconds: the finished run")


class ExportSummary(BaseModel):
    run_id: str
    status: str
    accepted_at: str
    finished_at: str | None
    file: str | None
    verdict: str | None
    headline: str | None
    figures: dict[str, float]
    archived: bool = Field(default=False, description="retention removed its run "
                           "(show_run finds it no more); this is what the history kept")


class ProjectHistory(BaseModel):
    project: str
    exports: list[ExportSummary] = Field(description="oldest first")


# -- talking to agentbox ----------------------------------------------------------------------


T = TypeVar("T")


class Agentbox:
    """The running agentbox, reached as the CLI's client commands reach it (the
    same configuration), its failures as tool errors with the CLI's sentences. A
    connection per tool call: an assistant's calls are minutes apart."""

    def __init__(self, url: str, config_file: Path | None = None) -> None:
        self.url = url
        self.config_file = config_file

    def client(self) -> Client:
        return Client(self.url, config_file=self.config_file)

    def ask(self, call: Callable[[Client], T]) -> T:
        """`call(client)`, its failures as tool errors."""
        with tool_errors(), self.client() as client:
            return call(client)

    def send(self, event: dict[str, Any]) -> Accepted:
        """Sign `event` with the configured secret and deliver it as `agentbox send`
        does; a refusal names each field to fix."""
        try:
            with self.client() as client:
                return client.send(event, retries=SEND_RETRIES)
        except Unreachable:
            raise ToolError(UNAVAILABLE.format(url=self.url)) from None
        except Refused as exc:
            raise ToolError(refusal(exc.status, exc.answer)) from None
        except AgentboxError as exc:
            raise ToolError(str(exc)) from None


@contextmanager
def tool_errors() -> Iterator[None]:
    try:
        yield
    except AgentboxError as exc:
        raise ToolError(str(exc)) from None


def refusal(status_code: int, answer: Mapping[str, Any]) -> str:
    """`agentbox refused the event (422 invalid_event): ...` with each field's error."""
    told = (f"agentbox refused the event ({status_code} "
            f"{one_line(answer.get('error_code', ''))}): "
            f"{one_line(answer.get('message', ''))}")
    errors = answer.get("errors")
    if isinstance(errors, list):
        fields = [f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg', '')}"
                  for e in errors if isinstance(e, Mapping)]
        told += "".join(f"\n  {one_line(field)}" for field in fields[:20])
    return told


# -- reading runs as people do ---------------------------------------------------------------


def figures(result: Any) -> dict[str, float]:
    """The review's numbers the page names (figures.FIGURES), those it has."""
    review = present.read(result)
    found = {key: review.figure(key) for key, *_ in FIGURES} if review else {}
    return {key: value for key, value in found.items() if value is not None}


def notes(result: Any) -> list[present.NoteLine]:
    """The review's notes, each text one line (as digest.notes says them)."""
    review = present.read(result)
    return [replace(n, text=one_line(n.text)) for n in review.notes] if review else []


def verdict_and_headline(status: str, result: Any) -> tuple[str | None, str | None]:
    """A succeeded review's verdict and headline figures (None, None for anything else)."""
    review = present.read(result) if status == "succeeded" else None
    if review is None or not review.metrics:
        return None, None
    return review.verdict, digest.headline(result) or None


def summary(run: RunView) -> RunSummary:
    seen = run.as_json()  # as the review's digest reads a run
    verdict, headline = verdict_and_headline(run.status, run.result)
    return RunSummary(
        run_id=run.run_id, status=run.status, event_type=run.event_type,
        agent=run.agent, project=digest.project_of(seen) or None,
        file=digest.file_name(seen) or None, verdict=verdict, headline=headline,
        accepted_at=run.accepted_at, completed_at=run.completed_at,
        retry_count=run.retry_count, error_code=run.error_code,
        line=digest.short(seen))


def report(run: RunDetail) -> RunReport:
    base = summary(run)
    if run.terminal:
        review = "\n".join(terminal.told(run))
    else:
        review = (f"{base.file or run.run_id}: {run.status} (not finished yet: ask "
                  "show_run again in a few seconds)")
    return RunReport(**base.model_dump(), terminal=run.terminal,
                     figures=figures(run.result) if base.verdict else {},
                     notes=notes(run.result) if base.verdict else [],
                     review=review, run=run.as_json())


def answer(text: str, model: BaseModel) -> CallToolResult:
    """What people read first, then the structured answer (also as JSON text, for
    clients that read only the text)."""
    structured = model.model_dump(mode="json")
    return CallToolResult(content=[TextContent(text=text),
                                   TextContent(text=json.dumps(structured))],
                          structured_content=structured)


def runs_text(runs: list[RunSummary], empty: str) -> str:
    return "\n".join(f"{r.run_id}  {r.line}" for r in runs) if runs else empty


# -- the server -------------------------------------------------------------------------------

RunId = Annotated[str, Field(min_length=1, max_length=256,
                             description="a run's id (run_…), as send_export or list_runs "
                                         "gave it")]
MixPath = Annotated[str, Field(min_length=1, description=(
    "the rendered mix on this machine: an absolute path (~ allowed), e.g. "
    "/Users/me/Music/exports/night-drive.wav; WAV, AIFF, FLAC, MP3, Ogg, CAF..."))]
Profile = Annotated[str | None, Field(description=(
    "the delivery target to review against: " + ", ".join(PROFILES)
    + " (default: agentbox's configured one)"))]


def _a_genre(name: str) -> str:
    if name not in GENRES:
        raise ValueError("unknown genre")  # told from the schema's enum (argument_errors)
    return name


# The names are the schema's enum, so an assistant is offered them and a wrong one is
# told as one of them; checked here too, before anything is sent.
Genre = Annotated[Annotated[str, Field(json_schema_extra={"enum": list(GENRES)}),
                            AfterValidator(_a_genre)] | None, Field(description=(
    "the music's genre, for the tonal advice: its curve, and the parts of the arrangement "
    "the notes name (default: the one last given for the project, else none: only "
    "extreme departures from an average curve are noted)"))]
WaitSeconds = Annotated[float, Field(ge=0, le=MAX_WAIT_SECONDS, description=(
    "wait up to this many seconds for the run to finish and answer its review "
    "(0: answer at once; read it later with show_run)"))]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description="how many, at most")]


# -- arguments that do not fit, told as the CLI tells a bad option --------------------------


class ToolServer(MCPServer[Any]):
    """The SDK's server, whose argument errors (pydantic's text) are told as the CLI
    tells a bad option: which argument, what it must be, what it got."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None
                        ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            schema = next((tool.input_schema for tool in await self.list_tools()
                           if tool.name == name), {})
            raise ToolError(argument_errors(name, cause, schema)) from cause


def argument_errors(tool: str, error: ValidationError, schema: Mapping[str, Any]) -> str:
    """`list_runs: limit must be a whole number from 1 to 500 (got 0)`, a line for
    each argument that does not fit (its first problem)."""
    told: dict[str, str] = {}
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else "arguments"
        if name in told:
            continue
        field = _field_schema(schema, name)
        if problem["type"] == "missing":
            description = field.get("description")
            told[name] = f"{name} is missing: {expected(field)}" + (
                f", {description}" if isinstance(description, str) else "")
        elif not field:
            told[name] = f"{name} is not an argument of {tool}"
        else:
            got = one_line(json.dumps(problem.get("input"), default=str))
            got = got if len(got) <= 60 else got[:57] + "..."
            told[name] = f"{name} must be {expected(field)}, not {got}"
    return f"{tool}: " + "; ".join(told.values())


def _field_schema(schema: Mapping[str, Any], name: str) -> dict[str, Any]:
    """An argument's JSON schema, its enum resolved and `null` (left out) dropped."""
    field = dict(schema.get("properties", {}).get(name) or {})
    choices = [c for c in field.pop("anyOf", []) if c.get("type") != "null"]
    if len(choices) == 1:
        field = {**choices[0], **field}
    ref = field.pop("$ref", None)
    if isinstance(ref, str):
        field = {**schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {}), **field}
    return field


def expected(field: Mapping[str, Any]) -> str:
    """What an argument must be, from its JSON schema: `a whole number from 1 to 500`."""
    kind = field.get("type")
    if "enum" in field:
        return "one of " + ", ".join(str(v) for v in field["enum"])
    if kind in ("integer", "number"):
        low, high = field.get("minimum"), field.get("maximum")
        what = "a whole number" if kind == "integer" else "a number"
        if low is not None and high is not None:
            return f"{what} from {low:g} to {high:g}"
        return what if low is None else f"{what} of at least {low:g}"
    if kind == "string":
        shortest, longest = field.get("minLength") or 0, field.get("maxLength")
        if longest is not None:
            return f"text of {shortest} to {longest} characters"
        return "text (not empty)" if shortest else "text"
    return "a JSON object" if kind == "object" else "what the tool's schema says"


def _mix_file(mix_path: str) -> Path:
    path = Path(mix_path).expanduser()
    if not path.is_absolute():
        raise ToolError(f"mix_path must be an absolute path (this server's working directory "
                        f"is not yours): {one_line(mix_path)[:200]!r}")
    if not path.is_file():
        raise ToolError(f"no file at {one_line(path)[:300]!r}")
    return path


# What each tool does to agentbox, for clients that ask before a call (the MCP
# tool annotations): reading changes nothing; sending adds a run, and the same
# export or event sent again is a duplicate answering the first, while every review
# requested is a run of its own; a replay gives a run that failed for good another
# go (nothing is deleted, but it runs the agent again). None reaches beyond agentbox.
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
SENDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                        open_world_hint=False)
REQUESTS = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                           idempotent_hint=False, open_world_hint=False)  # each a new run
REPLAYS = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                          idempotent_hint=False, open_world_hint=False)


def build_server(box: Agentbox) -> ToolServer:
    """The MCP server and its tools, each a thin shell over agentbox's HTTP API."""
    server = ToolServer(name="agentbox", version=_version(), instructions=INSTRUCTIONS)

    def sent(event: dict[str, Any], wait_seconds: float) -> CallToolResult:
        got = box.send(event)
        result = SendAnswer(run_id=got.run_id, status=got.status, duplicate=got.duplicate,
                            runs=[run.as_json() for run in got.runs])
        what = "already sent before: run" if got.duplicate else "accepted: run"
        text = f"{what} {got.run_id} ({got.status})"
        if wait_seconds > 0:
            try:
                with box.client() as client:
                    client.follow(got.run_id, wait_seconds)
            except NotFinished:
                text += (f"; not finished after {wait_seconds:g} s: ask show_run "
                         f"{got.run_id} later")
            except AgentboxError as exc:
                raise ToolError(str(exc)) from None
            else:
                result.review = report(box.ask(lambda c: c.run(got.run_id, history=True)))
                text += "\n" + result.review.review
        else:
            text += f"; its review: show_run {got.run_id}"
        return answer(text, result)

    @server.tool(annotations=SENDS)
    def send_export(mix_path: MixPath,
                    project: Annotated[str | None, Field(
                        description="the project (song) it belongs to; default: the file's "
                                    "name without its extension")] = None,
                    profile: Profile = None, genre: Genre = None,
                    wait_seconds: WaitSeconds = 0) -> Annotated[CallToolResult, SendAnswer]:
        """Send a rendered mix to agentbox for review, as a DAW's export script does
        (`agentbox send --type session.exported`). Sending the same unchanged file
        again the same way (project, profile, genre) is a duplicate: it answers the
        first run; with another profile, genre or project it is a review of its own."""
        path = _mix_file(mix_path)
        asked = {**({"profile": profile} if profile else {}),
                 **({"genre": genre} if genre else {})}
        event = export_event(path, export_id(path, project, **asked), project, SOURCE,
                             **asked)
        return sent(event, wait_seconds)

    @server.tool(annotations=REQUESTS)
    def request_review(mix_path: MixPath,
                       project: Annotated[str, Field(min_length=1, max_length=256)],
                       requested_by: Annotated[str, Field(
                           min_length=1, max_length=256, description="who asks")],
                       note: Annotated[str | None, Field(
                           max_length=4096, description="what to listen for")] = None,
                       profile: Profile = None, genre: Genre = None,
                       wait_seconds: WaitSeconds = 0
                       ) -> Annotated[CallToolResult, SendAnswer]:
        """Ask for a (new) review of a mix (event mix.review_requested); every request
        is a new run."""
        from agentbox.events import project_name

        path = _mix_file(mix_path)
        payload = {"project_id": project_name(project), "mix_url": str(path.resolve()),
                   "requested_by": requested_by,
                   **({"note": note} if note else {}), **({"profile": profile} if profile else {}),
                   **({"genre": genre} if genre else {})}
        event = build_event("mix.review_requested", SOURCE, uuid.uuid4().hex, payload)
        return sent(event, wait_seconds)

    @server.tool(annotations=SENDS)
    def send_event(event: Annotated[dict[str, Any], Field(description=(
                       "a complete v1 envelope: schema_version, event_id, idempotency_key "
                       "(source:event_type:event_id), event_type, source, timestamp "
                       "(with a time zone), payload; optional callback_url, correlation_id, "
                       "causation_id, hop. Sent as given, signed."))],
                   wait_seconds: WaitSeconds = 0) -> Annotated[CallToolResult, SendAnswer]:
        """Send any event agentbox knows (see GET /openapi.json), signed with the
        configured secret. A refusal names each field to fix."""
        return sent(event, wait_seconds)

    @server.tool(annotations=READS)
    def list_runs(status: Annotated[RunStatus | None, Field(
                      description="only runs in this state")] = None,
                  limit: Limit = 20,
                  correlation_id: Annotated[str | None, Field(
                      min_length=1, max_length=256,
                      description="only the runs of one agent chain")] = None
                  ) -> Annotated[CallToolResult, RunList]:
        """The newest runs, newest first: project, file, verdict and loudness of each
        (what `agentbox runs` lists)."""
        chain = {} if correlation_id is None else {"correlation_id": correlation_id}
        listed = box.ask(lambda c: c.runs(limit, None if status is None else status.value,
                                                 **chain))
        found = [summary(r) for r in listed.runs]
        return answer(runs_text(found, "no runs" + (f" {status.value}" if status else "")),
                      RunList(runs=found))

    @server.tool(annotations=READS)
    def show_run(run_id: RunId) -> Annotated[CallToolResult, RunReport]:
        """One run and its review: the verdict, the headline figures and the notes in
        order (what the musician reads), the comparison with the project's previous
        export, and the whole result, attempts and history."""
        found = report(box.ask(lambda c: c.run(run_id, history=True)))
        return answer(found.review, found)

    @server.tool(annotations=READS)
    def list_dead_letters(limit: Limit = 50) -> Annotated[CallToolResult, RunList]:
        """Runs that failed for good and wait for a decision (replay_run), newest
        first; those discarded on the status page are left out."""
        listed = box.ask(lambda c: c.runs(limit, "dead_lettered", discarded="false"))
        found = [summary(r) for r in listed.runs]
        return answer(runs_text(found, "no dead letters waiting for a decision"),
                      RunList(runs=found))

    @server.tool(annotations=REPLAYS)
    def replay_run(run_id: RunId) -> Annotated[CallToolResult, RunSummary]:
        """Send a dead-lettered or permanently failed run back to the queue (same run
        id, a new attempt), as `agentbox replay` does."""
        found = summary(box.ask(lambda c: c.replay(run_id)))
        return answer(f"{found.run_id} is {found.status} again: follow it with show_run",
                      found)

    @server.tool(annotations=READS)
    def project_history(project: Annotated[str, Field(min_length=1, max_length=256)],
                        limit: Limit = 50) -> Annotated[CallToolResult, ProjectHistory]:
        """A project's exports over time, oldest first, each with its verdict and
        headline figures (the project page's history): how the mix has moved."""
        exports = box.ask(lambda c: c.exports(project, limit)).exports
        history = ProjectHistory(project=exports[0].project if exports else project,
                                 exports=[export_summary(e) for e in reversed(exports)])
        lines = [f"{e.accepted_at[:16].replace('T', ' ')}  {e.file or e.run_id}: "
                 + (f"{e.verdict} · {e.headline}" if e.verdict else e.status)
                 + (" (run removed by retention)" if e.archived else "")
                 for e in history.exports]
        return answer(f"{history.project}: {len(lines)} export(s), oldest first\n"
                      + "\n".join(lines), history)

    return server


def export_summary(export: ExportView) -> ExportSummary:
    verdict, headline = verdict_and_headline(export.status, export.result)
    return ExportSummary(run_id=export.run_id, status=export.status,
                         accepted_at=export.accepted_at, finished_at=export.finished_at,
                         file=digest.file_name({"result": export.result}) or None,
                         verdict=verdict, headline=headline,
                         figures=figures(export.result) if verdict else {},
                         archived=export.archived)


def _version() -> str:
    try:
        return version("agentbox")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "0"


def serve(url: str, config_file: Path | None = None) -> None:
    """Serve the tools on stdin/stdout until the client closes them. The log (stderr)
    is agentbox's, JSON lines unless a person reads it: the SDK's own handler, which
    writes plain lines, is taken off."""
    root = logging.getLogger()
    before = set(root.handlers)
    server = build_server(Agentbox(url, config_file))
    for handler in set(root.handlers) - before:
        root.removeHandler(handler)
    try:
        settings = load_settings(config_file)
        setup_logging(settings.log_level, settings.log_format)
    except ConfigError:  # (said by the first tool that needs the configuration)
        setup_logging()
    server.run("stdio")

