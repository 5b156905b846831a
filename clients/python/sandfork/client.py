"""A client of the Sandfork gateway's HTTP API on the standard library (urllib, json).

Executions (plain and streamed as Server-Sent Events), templates, sessions (cells, checkpoints,
pause, resume, fork, files, delete) and the agent tools. Answers are the gateway's JSON as typed
dictionaries (types.py); a problem+json answer raises SandforkError.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast, overload

from .types import (
    Cell,
    Checkpoint,
    Execution,
    ExecutionFile,
    ForkedSessions,
    JsonObject,
    NetworkRequest,
    Problem,
    RichResult,
    SessionFile,
    SessionInfo,
    StreamEvent,
    Template,
    TemplateBuild,
    ToolFormat,
)


class SandforkError(Exception):
    """A problem+json answer, or an `error` event of a stream."""

    def __init__(self, status: int, problem: Problem) -> None:
        detail = problem.get("detail")
        super().__init__(
            f"{problem['title']}{'' if detail is None else ': ' + detail} ({problem['type']})"
        )
        self.status = status
        self.problem = problem

    @property
    def slug(self) -> str:
        """The problem type's last segment, e.g. `insufficient-credits`."""
        return self.problem["type"].rsplit("/", 1)[-1]

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later unchanged."""
        return bool(self.problem.get("retryable", False))


def decode_result(result: RichResult) -> bytes:
    """A rich result's bytes: base64-decoded for binary types (image/png), UTF-8 for text ones."""
    if result["type"].startswith("image/") and result["type"] != "image/svg+xml":
        return base64.b64decode(result["data"], validate=True)
    return result["data"].encode("utf-8")


def _without_none(fields: Mapping[str, Any]) -> JsonObject:
    return {name: value for name, value in fields.items() if value is not None}


def _problem_of(status: int, reason: str, body: bytes) -> Problem:
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and "type" in parsed and "title" in parsed:
            return cast(Problem, parsed)
    except ValueError:
        pass
    return {
        "type": "about:blank",
        "title": reason,
        "status": status,
        "detail": body.decode("utf-8", "replace"),
        "retryable": False,
    }


def server_sent_events(lines: Iterator[bytes]) -> Iterator[tuple[str, str]]:
    """(event, data) of each event of a text/event-stream body read line by line."""
    event = "message"
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)


class Sandfork:
    """The gateway at `base_url` (e.g. http://127.0.0.1:8787) as `api_key` (sfk_... or a token).

    `timeout` bounds each request's socket waits, in seconds.
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    # ---- executions ----

    def execute(
        self,
        template: str,
        code: str,
        *,
        language: str | None = None,
        stdin: str | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        files: Sequence[ExecutionFile] | None = None,
        timeout_ms: int | None = None,
        memory_mb: int | None = None,
        max_processes: int | None = None,
        network: NetworkRequest | None = None,
        idempotency_key: str | None = None,
    ) -> Execution:
        """Runs code in a fresh sandbox of `template` and waits for its end."""
        body = self._execution_body(
            template,
            code,
            language,
            stdin,
            args,
            env,
            files,
            timeout_ms,
            memory_mb,
            max_processes,
            network,
        )
        return cast(
            Execution,
            self._json("POST", "/v1/executions", body, idempotency_key=idempotency_key),
        )

    def stream(
        self,
        template: str,
        code: str,
        *,
        language: str | None = None,
        stdin: str | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        files: Sequence[ExecutionFile] | None = None,
        timeout_ms: int | None = None,
        memory_mb: int | None = None,
        max_processes: int | None = None,
        network: NetworkRequest | None = None,
        idempotency_key: str | None = None,
    ) -> Iterator[StreamEvent]:
        """Runs code and yields its output as the program writes it, ending with the execution."""
        body = self._execution_body(
            template,
            code,
            language,
            stdin,
            args,
            env,
            files,
            timeout_ms,
            memory_mb,
            max_processes,
            network,
        )
        with self._send(
            "POST",
            "/v1/executions",
            body,
            accept="text/event-stream",
            idempotency_key=idempotency_key,
        ) as response:
            for event, data in server_sent_events(iter(response.readline, b"")):
                payload = json.loads(data)
                if event == "started":
                    yield {"event": "started", "id": payload["id"]}
                elif event == "output":
                    yield {"event": "output", "stream": payload["stream"], "data": payload["data"]}
                elif event == "execution":
                    yield {"event": "execution", "execution": cast(Execution, payload)}
                    return
                elif event == "error":
                    raise SandforkError(int(payload.get("status", 0)), cast(Problem, payload))
        raise SandforkError(
            0,
            {
                "type": "about:blank",
                "title": "the event stream ended before the execution's final event",
                "status": 0,
                "retryable": True,
            },
        )

    def execution(self, execution_id: str) -> Execution:
        """A stored execution."""
        return cast(Execution, self._json("GET", f"/v1/executions/{_segment(execution_id)}"))

    def file(self, url: str) -> bytes:
        """An execution's output file, by its `files[].url`."""
        with self._send("GET", url, None, accept="application/octet-stream") as response:
            return cast(bytes, response.read())

    def templates(self) -> list[Template]:
        return cast(list[Template], self._json("GET", "/v1/templates")["templates"])

    # ---- sessions ----

    def create_session(
        self,
        template: str,
        *,
        idle_timeout_s: int | None = None,
        max_lifetime_s: int | None = None,
        memory_mib: int | None = None,
    ) -> Session:
        """A new session of `template`: a sandbox whose interpreter keeps its state across cells."""
        body = _without_none(
            {
                "template": template,
                "idle_timeout_s": idle_timeout_s,
                "max_lifetime_s": max_lifetime_s,
                "memory_mib": memory_mib,
            }
        )
        return Session(self, cast(SessionInfo, self._json("POST", "/v1/sessions", body)))

    def sessions(self) -> list[SessionInfo]:
        """The key's sessions (not deleted), newest first."""
        return cast(list[SessionInfo], self._json("GET", "/v1/sessions")["sessions"])

    def session(self, session_id: str) -> Session:
        """An existing session, by id."""
        return Session(self, self._session_info(session_id))

    def _session_info(self, session_id: str) -> SessionInfo:
        return cast(SessionInfo, self._json("GET", _session_path(session_id)))

    # ---- agent tools ----

    def tools(self, format: ToolFormat) -> list[JsonObject]:
        """The agent tools' definitions, for an OpenAI or Anthropic request's `tools`."""
        query = urllib.parse.urlencode({"format": format})
        return cast(list[JsonObject], self._json("GET", f"/v1/tools?{query}")["tools"])

    def tool_call(
        self, call: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> JsonObject:
        """Runs a model's tool call: an OpenAI `tool_calls[]` item or an Anthropic `tool_use` block.

        The answer is the message (OpenAI) or `tool_result` block (Anthropic) to send back.
        """
        if call.get("type") == "function":
            function = call["function"]
            body: JsonObject = {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]},
            }
        else:
            body = {
                "type": "tool_use",
                "id": call["id"],
                "name": call["name"],
                "input": call.get("input"),
            }
        return self._json("POST", "/v1/tool-calls", body, idempotency_key=idempotency_key)

    # ---- HTTP ----

    @staticmethod
    def _execution_body(
        template: str,
        code: str,
        language: str | None,
        stdin: str | None,
        args: Sequence[str] | None,
        env: Mapping[str, str] | None,
        files: Sequence[ExecutionFile] | None,
        timeout_ms: int | None,
        memory_mb: int | None,
        max_processes: int | None,
        network: NetworkRequest | None,
    ) -> JsonObject:
        return _without_none(
            {
                "template": template,
                "code": code,
                "language": language,
                "stdin": stdin,
                "args": None if args is None else list(args),
                "env": None if env is None else dict(env),
                "files": None if files is None else list(files),
                "timeout_ms": timeout_ms,
                "memory_mb": memory_mb,
                "max_processes": max_processes,
                "network": network,
            }
        )

    def _json(
        self,
        method: str,
        path: str,
        body: JsonObject | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        data = None if body is None else json.dumps(body).encode("utf-8")
        with self._send(
            method, path, data, content_type="application/json", idempotency_key=idempotency_key
        ) as response:
            return cast(JsonObject, json.loads(response.read()))

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | JsonObject | None,
        *,
        accept: str = "application/json",
        content_type: str = "application/json",
        idempotency_key: str | None = None,
    ) -> Any:
        if isinstance(body, dict):
            body = json.dumps(body).encode("utf-8")
        headers = {"Authorization": f"Bearer {self.api_key}", "Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        request = urllib.request.Request(
            self.base_url + path, data=body, headers=headers, method=method
        )
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            with error:
                raise SandforkError(
                    error.code, _problem_of(error.code, str(error.reason), error.read())
                ) from None


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _session_path(session_id: str) -> str:
    return f"/v1/sessions/{_segment(session_id)}"


class Session:
    """A session: its last known state in `info`, and its operations.

    As a context manager it is deleted when the block ends.
    """

    def __init__(self, client: Sandfork, info: SessionInfo) -> None:
        self.client = client
        self.info = info

    @property
    def id(self) -> str:
        return self.info["id"]

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.info["state"] != "deleted":
            self.delete()

    def run(
        self,
        code: str,
        *,
        timeout_ms: int | None = None,
        max_processes: int | None = None,
        network: NetworkRequest | None = None,
    ) -> Cell:
        """Runs `code` as the next cell; earlier cells' variables and imports are there."""
        body = _without_none(
            {
                "code": code,
                "timeout_ms": timeout_ms,
                "max_processes": max_processes,
                "network": network,
            }
        )
        cell = cast(Cell, self.client._json("POST", f"{self._path}/executions", body))
        self.info = cell["session"]
        return cell

    def checkpoint(self) -> Checkpoint:
        """A durable checkpoint; the session runs on."""
        return self._checkpoint("checkpoints")

    def pause(self) -> Checkpoint:
        """A checkpoint, then its VM is released (the next call resumes it)."""
        return self._checkpoint("pause")

    def resume(self) -> SessionInfo:
        self.info = cast(SessionInfo, self.client._json("POST", f"{self._path}/resume"))
        return self.info

    @overload
    def fork(self, checkpoint: int | None = None) -> Session: ...

    @overload
    def fork(self, checkpoint: int | None = None, *, count: int) -> list[Session]: ...

    def fork(
        self, checkpoint: int | None = None, *, count: int | None = None
    ) -> Session | list[Session]:
        """A new session from a checkpoint (default: the last); with `count`, that many at once
        (all or none)."""
        body = _without_none({"checkpoint": checkpoint, "count": count})
        answer = self.client._json("POST", f"{self._path}/fork", body)
        if count is None:
            return Session(self.client, cast(SessionInfo, answer))
        forked = cast(ForkedSessions, answer)
        return [Session(self.client, info) for info in forked["sessions"]]

    def save_template(
        self, name: str, version: str | None = None, description: str | None = None
    ) -> TemplateBuild:
        """Saves the session's state (variables, imports, /work files) as template
        `name@version` of the account (version: the next whole number when None), ready when this
        answers: executions and sessions then name it as their template. Needs the templates
        scope."""
        body = _without_none({"name": name, "version": version, "description": description})
        return cast(TemplateBuild, self.client._json("POST", f"{self._path}/template", body))

    def refresh(self) -> SessionInfo:
        self.info = self.client._session_info(self.id)
        return self.info

    def delete(self) -> SessionInfo:
        """Ends the session and removes its checkpoints; its final usage."""
        self.info = cast(SessionInfo, self.client._json("DELETE", self._path))
        return self.info

    def write_file(self, path: str, content: bytes) -> SessionFile:
        """Puts `content` at /work/`path`."""
        with self.client._send(
            "PUT", self._file_path(path), content, content_type="application/octet-stream"
        ) as response:
            return cast(SessionFile, json.loads(response.read()))

    def read_file(self, path: str) -> bytes:
        with self.client._send(
            "GET", self._file_path(path), None, accept="application/octet-stream"
        ) as response:
            return cast(bytes, response.read())

    def delete_file(self, path: str) -> None:
        with self.client._send("DELETE", self._file_path(path), None):
            pass

    @property
    def _path(self) -> str:
        return _session_path(self.id)

    def _file_path(self, path: str) -> str:
        return f"{self._path}/files/{urllib.parse.quote(path, safe='/')}"

    def _checkpoint(self, action: str) -> Checkpoint:
        taken = cast(Checkpoint, self.client._json("POST", f"{self._path}/{action}"))
        self.info = taken["session"]
        return taken
