"""The review's part of the OpenAPI document (App.api): a project's exports, its
reference track, and the audio a review heard."""

from __future__ import annotations

from typing import Any

from agentbox.events import MAX_ID_LENGTH
from agentbox.http.openapi import ApiPart, audio_answer, errors, json_answer, limit_parameter
from agentbox.review.answers import (
    ExportList,
    ExportView,
    ProjectChanged,
    ReferenceList,
    ReferenceOut,
    ReferenceRemoved,
)
from agentbox.review.model import MixReview

# The receiver's request example in the document: an export, as a DAW's script sends it.
EXAMPLE_EVENT = {
    "schema_version": "v1", "event_id": "export-a81f",
    "idempotency_key": "studio-api:session.exported:export-a81f",
    "event_type": "session.exported", "source": "studio-api",
    "timestamp": "2026-07-27T15:42:00Z",
    "payload": {"project_id": "night-drive", "mix_url": "/home/me/Mixes/night-drive.wav"}}

# The review's field of a run's view (its tables' run_fields): the event's
# payload.project_id (NFC), if it names one.
RUN_FIELDS = {"project": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
                          "title": "Project"}}


def api() -> ApiPart:
    run_id = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
    project = {"name": "project", "in": "path", "required": True,
               "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
               "description": "the project's name (payload.project_id), slashes included "
                             "as %2F"}
    admin: list[dict[str, list[str]]] = [{"admin": []}]
    paths: dict[str, Any] = {
        "/exports": {"get": {
            "summary": "A project's exports over time; without project, each project's "
                       "latest",
            "parameters": [{"name": "project", "in": "query", "required": False,
                            "schema": {"type": "string", "minLength": 1,
                                       "maxLength": MAX_ID_LENGTH},
                            "description": "the project (payload.project_id, compared in "
                                           "Unicode NFC): its exports, newest first. "
                                           "Without it: the latest export of each "
                                           "project, newest first, a page of them "
                                           "(limit, cursor)"}, limit_parameter(),
                           {"name": "cursor", "in": "query", "required": False,
                            "schema": {"type": "string"},
                            "description": "the next_cursor of the page before (without "
                                           "project only)"}],
            "responses": {"200": json_answer("ExportList", "exports, newest first"),
                          **errors(404, 422)},
        }, "post": {
            "summary": "Review an audio file sent as a form (the home page's and a "
                       "project page's; admin, or the page's form with its csrf field)",
            "description": "The file is kept in the archive's folder (at most 1 GiB, "
                           "leaving the disk its margin: 507) and reviewed as `agentbox "
                           "send FILE` sends one: a session.exported whose project is "
                           "`project`, else the file's name, at `stage` (none: as the "
                           "project and the file say). A file that is not audio is "
                           "refused (422 not_audio) and makes no project. The very "
                           "bytes of the project's latest export are that export (200, "
                           "duplicate: true, its run_id); those of an older one, a new "
                           "export (same_audio_as in the project's list). The page's "
                           "form (Accept: text/html) is answered with a redirect to "
                           "the review's page, a refusal with a page that says why.",
            "security": admin,
            "requestBody": {"required": True, "content": {"multipart/form-data": {
                "schema": {"type": "object", "required": ["file"], "properties": {
                    "csrf": {"type": "string", "description": "the page's token"},
                    "stage": {"type": "string", "enum": ["mix", "master"]},
                    "project": {"type": "string", "minLength": 1, "maxLength": 256},
                    "file": {"type": "string", "format": "binary"}}}}}},
            "responses": {"202": json_answer("Accepted", "the review, accepted"),
                          "200": json_answer("Accepted", "the project's latest export "
                                                         "already: its review"),
                          **errors(400, 401, 403, 413, 415, 422, 429, 503, 507)},
        }},
        "/references": {"get": {
            "summary": "Every project's reference track",
            "responses": {"200": json_answer("ReferenceList", "by project")},
        }},
        "/projects/{project}/reference": {
            "get": {
                "summary": "A project's reference track: every review of the project "
                           "compares with it",
                "parameters": [project],
                "responses": {"200": json_answer("ReferenceOut", "the project's reference"),
                              **errors(404)},
            },
            "put": {
                "summary": "Make an audio file the project's reference track (admin, or "
                           "the project page's form with its X-CSRF-Token)",
                "description": "The body is the file (at most 1 GiB). It is measured "
                               "once and kept in the archive; the reference it "
                               "replaces goes.",
                "security": admin,
                "parameters": [project, {"name": "name", "in": "query",
                                         "required": False,
                                         "schema": {"type": "string", "maxLength": 256},
                                         "description": "the file's name"}],
                "requestBody": {"required": True, "content": {
                    "application/octet-stream": {"schema": {"type": "string",
                                                            "format": "binary"}},
                    "audio/*": {"schema": {"type": "string", "format": "binary"}}}},
                "responses": {"201": json_answer("ReferenceOut", "the project's reference now"),
                              **errors(400, 401, 404, 409, 413, 422, 503, 507)},
            },
            "delete": {
                "summary": "The project no longer has a reference track (admin)",
                "security": admin, "parameters": [project],
                "responses": {"200": json_answer("ReferenceRemoved", "the one it had"),
                              **errors(401, 404)},
            },
        },
        "/projects/{project}/reference/audio": {"get": {
            "summary": "A project's reference track's bytes (the page's A/B player)",
            "parameters": [project, {"name": "Range", "in": "header", "required": False,
                                     "schema": {"type": "string"},
                                     "description": "bytes=first-last"}],
            "responses": {"200": audio_answer("the whole file"),
                          "206": audio_answer("the range asked for"),
                          "304": {"description": "unchanged (If-None-Match: its ETag)"},
                          **errors(404, 416)},
        }},
        **{f"/projects/{{project}}/{action}": {"post": {
            "summary": summary, "security": admin, "parameters": [project],
            "requestBody": {"required": action != "remove", "content": {
                "application/json": {"schema": {"type": "object", "properties": body}}}},
            "responses": {"200": json_answer("ProjectChanged", "done"),
                          **errors(401, 404, 409, 422)},
        }} for action, summary, body in (
            ("rename", "Rename a project (admin, or the project page's form)",
             {"to": {"type": "string", "maxLength": 256}}),
            ("merge", "Merge a project into another (admin, or the project page's form)",
             {"into": {"type": "string", "maxLength": 256}}),
            ("remove", "Remove a project: its exports leave the pages, its audio the "
                       "archive (admin, or the project page's form)", {}))},
        "/runs/{run_id}/rejudge": {"post": {
            "summary": "Judge a finished mix review again at the other stage (admin, "
                       "or the review page's form)",
            "description": "A new review of the bytes the review heard (the archive's "
                           "copy), judged at `stage`, beside the first: a "
                           "mix.review_requested whose result's stage_source is "
                           "rejudge. Asked again for the same review and stage: the "
                           "first re-judgment (200, duplicate); at the stage the "
                           "review already has: 409 same_stage, unless the review asks (its "
                           "stage inferred from split evidence: either stage settles "
                           "it). The page's form (its "
                           "CSRF token) is answered with a redirect to the new "
                           "review's page.",
            "security": admin, "parameters": [run_id],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"type": "object", "required": ["stage"], "properties": {
                    "stage": {"type": "string", "enum": ["mix", "master"]}}}}}},
            "responses": {"202": json_answer("Accepted", "the new review, accepted"),
                          "200": json_answer("Accepted", "asked before: the first one"),
                          **errors(401, 404, 409, 410, 422, 429, 503)},
        }},
        "/runs/{run_id}/dismiss": {"post": {
            "summary": "Stop listing a file that could not be reviewed as audio (admin, "
                       "or the home page's form)",
            "description": "A file whose review found no audio in it (mix_unreadable) "
                           "is no export of its project and is listed apart on the home "
                           "page, as couldn't review, until dismissed. 404 not_listed: "
                           "no such file is listed under this run. The page's form (its "
                           "CSRF token) is answered with a redirect home.",
            "security": admin, "parameters": [run_id],
            "responses": {"200": {"description": "dismissed", "content": {
                "application/json": {"schema": {"type": "object", "properties": {
                    "run_id": {"type": "string"}, "dismissed": {"type": "boolean"}}}}}},
                          **errors(401, 403, 404)},
        }},
        "/runs/{run_id}/audio": {"get": {
            "summary": "The mix a finished mix review listened to (the page's players)",
            "description": "The bytes the review heard, from the archive of exports "
                           "(or, with the archive off, the file at the review's path "
                           "while it is still the one reviewed); never a path the "
                           "request names. One byte range for seeking; a Range header "
                           "that is not one range in bytes is ignored (200). 404 "
                           "audio_gone when the archive let them go or the file "
                           "changed.",
            "parameters": [run_id, {"name": "Range", "in": "header", "required": False,
                                    "schema": {"type": "string"},
                                    "description": "bytes=first-last"}],
            "responses": {"200": audio_answer("the whole file"),
                          "206": audio_answer("the range asked for"),
                          "304": {"description": "unchanged (If-None-Match: its ETag, "
                                                 "the SHA-256 of its bytes)"},
                          **errors(404, 416)},
        }},
    }
    # MixReview: what a review's run answers as its `result` (the engine's RunView
    # says only "any"), for scripts that read it.
    return ApiPart(models=(ExportView, ExportList, ReferenceOut, ReferenceList,
                           ReferenceRemoved, ProjectChanged, MixReview), paths=paths,
                   run_fields=RUN_FIELDS, event_example=EXAMPLE_EVENT)
