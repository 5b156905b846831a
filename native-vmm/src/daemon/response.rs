//! The daemon's side of the protocol: building every response frame (PROTOCOL.md).

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::daemon::executor::{
    ExecuteError, Execution, ExecutionLimits, Health, PoolStats, TemplateInfo, Usage,
};
use crate::daemon::wire::PROTOCOL_VERSION;
pub use crate::daemon::wire::{BusyReason, ErrorCode};
use crate::process::Stream;
use crate::status::RunStatus;

impl From<&ExecuteError> for ErrorCode {
    fn from(e: &ExecuteError) -> ErrorCode {
        match e {
            ExecuteError::UnknownTemplate(_) => ErrorCode::UnknownTemplate,
            ExecuteError::Unavailable(_) => ErrorCode::Unavailable,
            ExecuteError::Rejected(_) => ErrorCode::BadRequest,
            ExecuteError::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// One frame the daemon sends: `id`, `type`, then the fields of that type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    /// The request's id. The hello has none (the key is absent); an error about a frame whose
    /// id could not be read has `"id": null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<Option<u64>>,
    #[serde(flatten)]
    body: Body,
}

impl Response {
    /// The id of the request this answers, if any.
    pub fn id(&self) -> Option<u64> {
        self.id.flatten()
    }

    /// The bound a `busy` answer met; None for any other frame.
    pub fn busy_reason(&self) -> Option<BusyReason> {
        match self.body {
            Body::Error {
                code: ErrorCode::Busy(reason),
                ..
            } => Some(reason),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Body {
    Hello {
        protocol: u64,
        server: &'static str,
    },
    Error {
        code: ErrorCode,
        message: String,
        retryable: bool,
        /// Only on `busy`: the bound it met.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<BusyReason>,
    },
    Templates {
        templates: Vec<TemplateInfo>,
    },
    Health {
        ok: bool,
        kvm: String,
        templates: u64,
    },
    Stats {
        executions: u64,
        in_flight: u64,
        syscalls: u64,
        thread_switches: u64,
        admission: Admission,
        pools: Vec<PoolStats>,
    },
    Execution(Box<ExecutionBody>),
    Output {
        stream: &'static str,
        data: String,
    },
    /// Session replies (PROTOCOL.md, Sessions): their fields are built by `daemon::sessions`.
    Session(Map<String, Value>),
    Checkpoint(Map<String, Value>),
    SessionFile(Map<String, Value>),
    SessionTemplate(Map<String, Value>),
}

/// The `execution` response's fields: status from `RunStatus::kind`, `exit_code` only for an
/// exit, `fault` only for a crash, output decoded as lossy UTF-8.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct ExecutionBody {
    status: &'static str,
    exit_code: Option<i64>,
    stdout: String,
    stderr: String,
    truncated: bool,
    fault: Option<Fault>,
    limits: ExecutionLimits,
    vm: Vm,
    timings: Timings,
    usage: Usage,
    /// What a script's agent published: its last value and rich results (PROTOCOL.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<ScriptResult>,
    /// The files under /work/out, when the program left that folder.
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<Vec<FileOut>>,
    /// A session execution's own fields (`session`, `result`, `session_state`); none for
    /// `execute`.
    #[serde(flatten)]
    session: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct ScriptResult {
    value: Option<String>,
    results: Vec<crate::agent::RichResult>,
}

/// An output file: `content` (base64) is null when the files before it filled the budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct FileOut {
    path: String,
    bytes: u64,
    content: Option<String>,
}

/// Where the execution's VM came from (PROTOCOL.md, `vm`).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Vm {
    origin: &'static str,
    resets: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Fault {
    vector: u64,
    name: &'static str,
    rip: u64,
    address: Option<u64>,
}

/// Microseconds (PROTOCOL.md, `timings`).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Timings {
    queue_us: u64,
    fork_us: u64,
    exec_us: u64,
    total_us: u64,
}

fn reply(id: u64, body: Body) -> Response {
    Response {
        id: Some(Some(id)),
        body,
    }
}

pub fn error(id: Option<u64>, code: ErrorCode, message: &str) -> Response {
    Response {
        id: Some(id),
        body: Body::Error {
            code,
            message: message.to_owned(),
            retryable: code.retryable(),
            reason: match code {
                ErrorCode::Busy(reason) => Some(reason),
                _ => None,
            },
        },
    }
}

/// Part of a streamed execution's output, as written (before its `execution` answer).
pub fn output(id: u64, stream: Stream, data: String) -> Response {
    let stream = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    reply(id, Body::Output { stream, data })
}

pub fn hello() -> Response {
    Response {
        id: None,
        body: Body::Hello {
            protocol: PROTOCOL_VERSION,
            server: concat!("sandfork-vmm ", env!("CARGO_PKG_VERSION")),
        },
    }
}

pub fn templates(id: u64, templates: &[TemplateInfo]) -> Response {
    reply(
        id,
        Body::Templates {
            templates: templates.to_vec(),
        },
    )
}

/// `kvm` is "available" or "unavailable: <reason>"; `ok` says executions can run now.
pub fn health(id: u64, health: &Health) -> Response {
    let kvm = match &health.kvm {
        Ok(()) => "available".to_owned(),
        Err(reason) => format!("unavailable: {reason}"),
    };
    let ok = health.kvm.is_ok() && health.templates > 0;
    reply(
        id,
        Body::Health {
            ok,
            kvm,
            templates: health.templates as u64,
        },
    )
}

/// Daemon-wide counters for `stats`: executions run, in flight now, and the system calls and
/// thread switches of all executions so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub executions: u64,
    pub in_flight: u64,
    pub syscalls: u64,
    pub thread_switches: u64,
}

/// `stats`' `admission`: executions running and waiting, waiting per template, and the `busy`
/// answers so far by reason (PROTOCOL.md, `stats`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Admission {
    pub running: u64,
    pub queued: u64,
    pub queued_by_template: Map<String, Value>,
    pub busy: Map<String, Value>,
}

impl Admission {
    pub fn new(
        depths: &crate::daemon::admission::Depths,
        busy: impl Fn(BusyReason) -> u64,
    ) -> Admission {
        Admission {
            running: depths.running as u64,
            queued: depths.queued as u64,
            queued_by_template: depths
                .queued_by_template
                .iter()
                .map(|(template, n)| (template.clone(), Value::from(*n as u64)))
                .collect(),
            busy: BusyReason::ALL
                .into_iter()
                .map(|reason| (reason.as_str().to_owned(), Value::from(busy(reason))))
                .collect(),
        }
    }
}

pub fn stats(id: u64, totals: Totals, admission: Admission, pools: &[PoolStats]) -> Response {
    let Totals {
        executions,
        in_flight,
        syscalls,
        thread_switches,
    } = totals;
    reply(
        id,
        Body::Stats {
            executions,
            in_flight,
            syscalls,
            thread_switches,
            admission,
            pools: pools.to_vec(),
        },
    )
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

/// Time spent on one request outside the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimes {
    /// From the frame's arrival to the executor's start (`queue_us` adds the executor's own
    /// wait for a pool worker, `Execution::queue`).
    pub queue: Duration,
    /// From the frame's arrival to the response being built.
    pub total: Duration,
}

pub fn execution(
    id: u64,
    run: &Execution,
    limits: &ExecutionLimits,
    times: RequestTimes,
) -> Response {
    session_execution(id, run, limits, times, Map::new())
}

/// The kinds of session reply (PROTOCOL.md, Sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionReply {
    Session,
    Checkpoint,
    SessionFile,
    SessionTemplate,
}

pub fn session_reply(id: u64, kind: SessionReply, fields: Map<String, Value>) -> Response {
    reply(
        id,
        match kind {
            SessionReply::Session => Body::Session(fields),
            SessionReply::Checkpoint => Body::Checkpoint(fields),
            SessionReply::SessionFile => Body::SessionFile(fields),
            SessionReply::SessionTemplate => Body::SessionTemplate(fields),
        },
    )
}

/// An `execution` with a session execution's fields after the usual ones.
pub fn session_execution(
    id: u64,
    run: &Execution,
    limits: &ExecutionLimits,
    times: RequestTimes,
    session: Map<String, Value>,
) -> Response {
    let exit_code = match run.status {
        RunStatus::Exited { code } => Some(i64::from(code)),
        _ => None,
    };
    let fault = match &run.status {
        RunStatus::Crashed { fault } => Some(Fault {
            vector: u64::from(fault.vector),
            name: fault.name(),
            rip: fault.rip,
            address: fault.address,
        }),
        _ => None,
    };
    reply(
        id,
        Body::Execution(Box::new(ExecutionBody {
            status: run.status.kind(),
            exit_code,
            stdout: String::from_utf8_lossy(&run.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&run.stderr).into_owned(),
            truncated: matches!(run.status, RunStatus::OutputLimit { .. }),
            fault,
            limits: *limits,
            vm: Vm {
                origin: run.vm.name(),
                resets: run.vm.resets(),
            },
            timings: Timings {
                queue_us: micros(times.queue + run.queue),
                fork_us: micros(run.vm_setup),
                exec_us: micros(run.run),
                total_us: micros(times.total),
            },
            usage: run.usage.clone(),
            result: run.result.as_ref().map(|r| ScriptResult {
                value: r.value.clone(),
                results: r.results.clone(),
            }),
            files: run.files.as_ref().map(|files| {
                files
                    .iter()
                    .map(|f| FileOut {
                        path: f.path.clone(),
                        bytes: f.bytes,
                        content: f.contents.as_deref().map(::base64::encode),
                    })
                    .collect()
            }),
            session,
        })),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::daemon::executor::VmOrigin;
    use crate::status::GuestFault;

    const LIMITS: ExecutionLimits = ExecutionLimits {
        timeout_ms: 1000,
        memory_mib: 64,
        output_bytes: 10,
        processes: 3,
    };
    /// The server's wait for a slot; the executor waited 5 µs more for a pool worker.
    const TIMES: RequestTimes = RequestTimes {
        queue: Duration::from_micros(7),
        total: Duration::from_micros(1380),
    };

    fn run(status: RunStatus, stdout: &[u8]) -> Value {
        let usage = Usage {
            wall_us: 1360,
            cpu_us: 900,
            peak_memory_bytes: 18_350_080,
            pages_copied: 0,
            syscalls: 31,
            exits: 33,
            threads_created: 2,
            thread_switches: 9,
            network: Default::default(),
            processes_created: 2,
        };
        let finished = Execution {
            status,
            stdout: stdout.to_vec(),
            stderr: b"err".to_vec(),
            queue: Duration::from_micros(5),
            vm_setup: Duration::from_micros(410),
            run: Duration::from_micros(950),
            usage,
            vm: VmOrigin::Reset { resets: 3 },
            result: None,
            files: None,
        };
        json(&execution(7, &finished, &LIMITS, TIMES))
    }

    fn json(response: &Response) -> Value {
        serde_json::to_value(response).unwrap()
    }

    #[test]
    fn a_published_result_and_output_files_are_carried_only_when_present() {
        let without = run(RunStatus::Exited { code: 0 }, b"");
        assert!(without.get("result").is_none() && without.get("files").is_none());
        let finished = Execution {
            status: RunStatus::Exited { code: 0 },
            stdout: vec![],
            stderr: vec![],
            queue: Duration::ZERO,
            vm_setup: Duration::ZERO,
            run: Duration::ZERO,
            usage: Usage::default(),
            vm: VmOrigin::Fresh,
            result: Some(crate::agent::CellResult {
                value: Some("42".into()),
                error: None,
                results: vec![crate::agent::RichResult {
                    mime: "image/png".into(),
                    data: "iVBORw0K".into(),
                }],
            }),
            files: Some(vec![
                crate::agent::OutputFile {
                    path: "plots/a.txt".into(),
                    bytes: 2,
                    contents: Some(b"hi".to_vec()),
                },
                crate::agent::OutputFile {
                    path: "big.bin".into(),
                    bytes: 3 << 20,
                    contents: None,
                },
            ]),
        };
        let answer = json(&execution(7, &finished, &LIMITS, TIMES));
        assert_eq!(
            answer["result"],
            serde_json::json!({"value": "42", "results": [{"type": "image/png", "data": "iVBORw0K"}]})
        );
        assert_eq!(
            answer["files"],
            serde_json::json!([
                {"path": "plots/a.txt", "bytes": 2, "content": "aGk="},
                {"path": "big.bin", "bytes": 3 << 20, "content": null}
            ])
        );
    }

    #[test]
    fn an_exit_maps_to_ok_or_error_with_its_code() {
        let ok = run(RunStatus::Exited { code: 0 }, b"42\n");
        assert_eq!(
            ok.to_string(),
            concat!(
                r#"{"id":7,"type":"execution","status":"ok","exit_code":0,"stdout":"42\n","stderr":"err","truncated":false,"fault":null,"#,
                r#""limits":{"timeout_ms":1000,"memory_mib":64,"output_bytes":10,"processes":3},"vm":{"origin":"reset","resets":3},"timings":{"queue_us":12,"fork_us":410,"exec_us":950,"total_us":1380},"#,
                r#""usage":{"wall_us":1360,"cpu_us":900,"peak_memory_bytes":18350080,"pages_copied":0,"syscalls":31,"exits":33,"threads_created":2,"thread_switches":9,"processes_created":2,"network":{"bytes_in":0,"bytes_out":0,"connections":0,"refused":0,"dns_queries":0}}}"#
            )
        );
        let error = run(RunStatus::Exited { code: -3 }, b"");
        assert_eq!(
            (error.get("status"), error.get("exit_code")),
            (Some(&Value::from("error")), Some(&Value::from(-3i64)))
        );
    }

    #[test]
    fn other_statuses_have_no_exit_code_and_only_a_crash_has_a_fault() {
        let fault = GuestFault {
            vector: 14,
            error_code: 6,
            rip: 0x40_1000,
            address: Some(0),
        };
        let cases = [
            (RunStatus::Timeout { limit_ms: 1000 }, "timeout"),
            (
                RunStatus::OutOfMemory {
                    limit_bytes: 64 << 20,
                },
                "out_of_memory",
            ),
            (RunStatus::OutputLimit { cap_bytes: 10 }, "output_limit"),
            (RunStatus::Crashed { fault }, "crashed"),
            (
                RunStatus::Unsupported {
                    syscall: 41,
                    name: "socket",
                },
                "unsupported",
            ),
        ];
        for (status, kind) in cases {
            let v = run(status, b"");
            assert_eq!(v.get("status"), Some(&Value::from(kind)));
            assert_eq!(v.get("exit_code"), Some(&Value::Null), "{kind}");
            assert_eq!(
                v.get("truncated"),
                Some(&Value::Bool(kind == "output_limit")),
                "{kind}"
            );
            let fault = v.get("fault").unwrap();
            if kind == "crashed" {
                assert_eq!(
                    fault.to_string(),
                    r#"{"vector":14,"name":"segmentation fault (page fault)","rip":4198400,"address":0}"#
                );
            } else {
                assert!(fault.is_null(), "{kind}");
            }
        }
        let no_address = run(
            RunStatus::Crashed {
                fault: GuestFault {
                    vector: 6,
                    error_code: 0,
                    rip: 1,
                    address: None,
                },
            },
            b"",
        );
        assert_eq!(
            no_address.get("fault").and_then(|f| f.get("address")),
            Some(&Value::Null)
        );
    }

    #[test]
    fn output_is_lossy_utf8() {
        let v = run(
            RunStatus::Exited { code: 0 },
            b"ok \xff\xfe \xc3\xa9 \xe2\x82",
        );
        assert_eq!(
            v.get("stdout").and_then(Value::as_str),
            Some("ok \u{fffd}\u{fffd} é \u{fffd}")
        );
    }

    #[test]
    fn errors_carry_code_retryability_and_id() {
        assert_eq!(
            json(&error(None, ErrorCode::BadFrame, "m")).to_string(),
            r#"{"id":null,"type":"error","code":"bad_frame","message":"m","retryable":false}"#
        );
        let retryable: Vec<Value> = [
            ErrorCode::BadFrame,
            ErrorCode::BadRequest,
            ErrorCode::UnsupportedProtocol,
            ErrorCode::UnknownTemplate,
            ErrorCode::Unavailable,
            ErrorCode::Busy(BusyReason::QueueFull),
            ErrorCode::Internal,
        ]
        .into_iter()
        .filter(|c| c.retryable())
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
        assert_eq!(retryable, ["unavailable", "busy", "internal"]);
        assert_eq!(
            serde_json::to_string(&ErrorCode::UnsupportedProtocol).unwrap(),
            r#""unsupported_protocol""#
        );
        assert_eq!(
            ErrorCode::from(&ExecuteError::Rejected("x".into())),
            ErrorCode::BadRequest
        );
        assert_eq!(
            json(&error(
                Some(9),
                ErrorCode::from(&ExecuteError::UnknownTemplate("ruby".into())),
                "m"
            ))
            .get("code"),
            Some(&Value::from("unknown_template"))
        );
        let busy = error(Some(9), ErrorCode::Busy(BusyReason::KeyQueueFull), "m");
        assert_eq!(busy.id(), Some(9));
        assert_eq!(busy.busy_reason(), Some(BusyReason::KeyQueueFull));
        assert_eq!(json(&busy)["reason"], "key_queue_full");
        assert_eq!(
            json(&error(None, ErrorCode::Internal, "m")).get("reason"),
            None
        );
        assert_eq!(
            json(&hello()).to_string(),
            concat!(
                r#"{"type":"hello","protocol":1,"server":"sandfork-vmm "#,
                env!("CARGO_PKG_VERSION"),
                r#""}"#
            )
        );
        assert_eq!(hello().id(), None);
    }

    /// tests/fixtures/protocol/: PROTOCOL.md's examples, which runtime/protocol.test.ts reads too.
    const FIXTURES: [(&str, &str); 6] = [
        (
            "hello",
            include_str!("../../tests/fixtures/protocol/hello.json"),
        ),
        (
            "health",
            include_str!("../../tests/fixtures/protocol/health.json"),
        ),
        (
            "execute",
            include_str!("../../tests/fixtures/protocol/execute.json"),
        ),
        (
            "output",
            include_str!("../../tests/fixtures/protocol/output.json"),
        ),
        (
            "error",
            include_str!("../../tests/fixtures/protocol/error.json"),
        ),
        (
            "busy",
            include_str!("../../tests/fixtures/protocol/busy.json"),
        ),
    ];

    fn reply(name: &str) -> Value {
        let (_, text) = FIXTURES.iter().find(|(n, _)| *n == name).unwrap();
        serde_json::from_str::<Value>(text).unwrap()["reply"].clone()
    }

    #[test]
    fn the_shared_protocol_examples_are_what_the_daemon_answers() {
        let finished = Execution {
            status: RunStatus::Exited { code: 0 },
            stdout: b"42\n".to_vec(),
            stderr: vec![],
            queue: Duration::from_micros(5),
            vm_setup: Duration::from_micros(410),
            run: Duration::from_micros(950),
            usage: Usage {
                wall_us: 1360,
                cpu_us: 900,
                peak_memory_bytes: 18_350_080,
                pages_copied: 212,
                syscalls: 31,
                exits: 33,
                threads_created: 0,
                thread_switches: 0,
                network: Default::default(),
                processes_created: 0,
            },
            vm: VmOrigin::Reset { resets: 41 },
            result: None,
            files: None,
        };
        let limits = ExecutionLimits {
            timeout_ms: 10_000,
            memory_mib: 256,
            output_bytes: 1 << 20,
            processes: 64,
        };
        assert_eq!(
            json(&execution(7, &finished, &limits, TIMES)),
            reply("execute")
        );
        assert_eq!(
            json(&output(7, Stream::Stdout, "line 1\n".into())),
            reply("output")
        );
        let health_reply = health(
            2,
            &Health {
                kvm: Ok(()),
                templates: 1,
            },
        );
        assert_eq!(json(&health_reply), reply("health"));
        let unknown = error(
            Some(7),
            ErrorCode::UnknownTemplate,
            "no template named 'ruby'",
        );
        assert_eq!(json(&unknown), reply("error"));
        let busy = error(
            Some(8),
            ErrorCode::Busy(BusyReason::KeyQueueFull),
            "4 executions of this key_id already wait for a slot",
        );
        assert_eq!(json(&busy), reply("busy"));
        // The example names a version; ours is this build's.
        let mut ours = json(&hello());
        assert!(ours["server"]
            .as_str()
            .unwrap()
            .starts_with("sandfork-vmm "));
        ours["server"] = reply("hello")["server"].clone();
        assert_eq!(ours, reply("hello"));
    }

    /// Each frame of the fixtures is shown in PROTOCOL.md, so the document and the tests agree.
    #[test]
    fn protocol_md_shows_the_shared_examples() {
        let doc = include_str!("../../PROTOCOL.md");
        let shown: Vec<Value> = doc
            .split("```json\n")
            .skip(1)
            .flat_map(|block| {
                let block = block.split("```").next().unwrap_or_default();
                serde_json::Deserializer::from_str(block)
                    .into_iter::<Value>()
                    .map_while(Result::ok)
                    .collect::<Vec<_>>()
            })
            .collect();
        for (name, text) in FIXTURES {
            let fixture: Value = serde_json::from_str(text).unwrap();
            for part in ["request", "reply"] {
                if let Some(frame) = fixture.get(part) {
                    assert!(
                        shown.contains(frame),
                        "the {part} of {name}.json is not in PROTOCOL.md: {frame}"
                    );
                }
            }
        }
    }

    #[test]
    fn health_is_ok_only_when_vms_can_run() {
        let up = json(&health(
            2,
            &Health {
                kvm: Ok(()),
                templates: 1,
            },
        ));
        assert_eq!(
            up.to_string(),
            r#"{"id":2,"type":"health","ok":true,"kvm":"available","templates":1}"#
        );
        let down = json(&health(
            2,
            &Health {
                kvm: Err("/dev/kvm is missing".into()),
                templates: 1,
            },
        ));
        assert_eq!(
            (down.get("ok"), down.get("kvm").and_then(Value::as_str)),
            (
                Some(&Value::Bool(false)),
                Some("unavailable: /dev/kvm is missing")
            )
        );
        assert_eq!(
            json(&health(
                2,
                &Health {
                    kvm: Ok(()),
                    templates: 0
                }
            ))
            .get("ok"),
            Some(&Value::Bool(false))
        );
    }
}
