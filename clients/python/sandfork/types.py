"""The gateway's JSON answers as typed dictionaries.

They are the answers as the gateway sends them (json.loads of the body): a field the gateway adds
later is there too, unlisted. Field names follow the OpenAPI document (GET /openapi.json; types.test.ts compares them). The
annotations are evaluated (no `from __future__ import annotations`), so that `NotRequired` is
seen at run time.
"""

from typing import Any, Literal, NotRequired, TypedDict, Union

ExecutionStatus = Literal[
    "running",
    "completed",
    "timed_out",
    "memory_exceeded",
    "output_exceeded",
    "crashed",
    "unsupported_syscall",
    "deadlocked",
    "network_exceeded",
    "aborted",
]


class ExecutionFile(TypedDict):
    """A file placed under /work before the program starts."""

    path: str
    content: str
    encoding: NotRequired[Literal["utf8", "base64"]]


class Timings(TypedDict):
    queue_ms: float
    fork_ms: float
    exec_ms: float
    total_ms: float


class NetworkRequest(TypedDict):
    """A call's network: rules `host[:ports]` (`example.com`, `*.example.com`, `203.0.113.0/24`)
    narrowing the key's policy; asking for it on a key without one is refused (403)."""

    allow: list[str]
    max_connections: NotRequired[int]
    max_bytes: NotRequired[int]


class NetworkUsage(TypedDict):
    """What a run did on the network: payload bytes, connections, what the policy refused."""

    bytes_in: int
    bytes_out: int
    connections: int
    refused: int
    dns_queries: int


class ExecutionUsage(TypedDict):
    unit: str
    reserved_units: int
    units: int | None
    network: NetworkUsage | None


RichResultType = Literal[
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
]


class RichResult(TypedDict):
    """One rich result (a chart, a table) of an answer's `results`: its MIME type and its data
    (base64 for binary types). Answers carry them as the gateway sends them."""

    type: RichResultType
    data: str


class OutputFile(TypedDict):
    """A file the program left under /work/out; `Sandfork.file(url)` downloads it while kept."""

    path: str
    size: int
    url: str | None
    expires_at: str | None
    reason: NotRequired[Literal["not_transferred", "invalid_path", "quota_exceeded", "store_failed"]]


class Execution(TypedDict):
    id: str
    template: str
    status: ExecutionStatus
    exit_code: int | None
    stdout: str | None
    stderr: str | None
    truncated: bool | None
    timings: Timings | None
    usage: ExecutionUsage
    created_at: str
    finished_at: str | None
    results: NotRequired[list[RichResult]]
    files: NotRequired[list[OutputFile]]


class Price(TypedDict):
    unit: str
    base_units: int
    units_per_second: int
    units_per_network_mib: int


class Template(TypedDict):
    name: str
    language: str
    languages: list[str]
    content_hash: str
    ready: bool
    price: Price


SessionState = Literal["running", "paused", "ended", "deleted"]


class CheckpointRef(TypedDict):
    checkpoint: int
    sha256: str


class SessionUsage(TypedDict):
    unit: str
    units: int
    running_gib_seconds: float
    checkpoint_gib_hours: float


class SessionInfo(TypedDict):
    id: str
    template: str
    state: SessionState
    memory_mib: int
    idle_timeout_s: int
    max_lifetime_s: int
    last_checkpoint: CheckpointRef | None
    checkpoint_bytes: int
    cells: int
    usage: SessionUsage
    ended_reason: str | None
    created_at: str
    last_active_at: str


class ForkedSessions(TypedDict):
    """The sessions one fork request with `count` made."""

    sessions: list[SessionInfo]


class CellError(TypedDict):
    name: str
    message: str


class Cell(TypedDict):
    """A cell's outcome: the last expression's repr as `value`, or the exception as `error`."""

    value: str | None
    error: CellError | None
    results: list[RichResult]
    resumed: bool
    execution: Execution
    session: SessionInfo


class CheckpointTimings(TypedDict):
    capture_ms: float
    write_ms: float


class Checkpoint(TypedDict):
    checkpoint: int
    sha256: str
    file_bytes: int
    dirty_bytes: int
    timings: CheckpointTimings
    session: SessionInfo


class TemplateBuild(TypedDict):
    """A template built through the API, or saved from a session (`from_session`)."""

    id: str
    name: str
    version: str
    description: str | None
    from_session: str | None
    status: Literal["queued", "building", "ready", "failed"]
    step: str | None
    error: str | None
    logs: str
    image_bytes: int | None
    snapshot_bytes: int | None
    published: bool
    created_at: str
    finished_at: str | None


class SessionFile(TypedDict):
    path: str
    bytes: int


class Problem(TypedDict):
    """An RFC 9457 problem body; `type` is https://sandfork.dev/problems/<slug>."""

    type: str
    title: str
    status: int
    detail: NotRequired[str]
    instance: NotRequired[str]
    retryable: bool


class StartedEvent(TypedDict):
    event: Literal["started"]
    id: str


class OutputEvent(TypedDict):
    event: Literal["output"]
    stream: Literal["stdout", "stderr"]
    data: str


class ExecutionEvent(TypedDict):
    event: Literal["execution"]
    execution: Execution


StreamEvent = Union[StartedEvent, OutputEvent, ExecutionEvent]
"""One event of a streamed execution, in order: started, output..., then execution."""

ToolFormat = Literal["openai", "anthropic"]

JsonObject = dict[str, Any]
