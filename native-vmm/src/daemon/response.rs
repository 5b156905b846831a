//! The daemon's side of the protocol: building every response frame (PROTOCOL.md).

use crate::daemon::executor::{ExecuteError, Execution, ExecutionLimits, Health, PoolStats, TemplateInfo};
use crate::daemon::request::PROTOCOL_VERSION;
use crate::json::Value;
use crate::status::RunStatus;

/// The `code` of an error frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadFrame,
    BadRequest,
    UnsupportedProtocol,
    UnknownTemplate,
    Unavailable,
    Busy,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedProtocol => "unsupported_protocol",
            ErrorCode::UnknownTemplate => "unknown_template",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Busy => "busy",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether the same request may succeed later.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::Unavailable | ErrorCode::Busy | ErrorCode::Internal)
    }
}

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

fn id_value(id: Option<u64>) -> Value {
    id.map_or(Value::Null, Value::from)
}

pub fn error(id: Option<u64>, code: ErrorCode, message: &str) -> Value {
    Value::object([
        ("id", id_value(id)),
        ("type", Value::from("error")),
        ("code", Value::from(code.as_str())),
        ("message", Value::from(message)),
        ("retryable", Value::Bool(code.retryable())),
    ])
}

pub fn hello() -> Value {
    Value::object([("type", Value::from("hello")), ("protocol", Value::from(PROTOCOL_VERSION)), ("server", Value::from(concat!("sandfork-vmm ", env!("CARGO_PKG_VERSION"))))])
}

pub fn templates(id: u64, templates: &[TemplateInfo]) -> Value {
    let list = templates
        .iter()
        .map(|t| {
            Value::object([
                ("name", Value::from(t.name.as_str())),
                ("content_hash", Value::from(t.content_hash.as_str())),
                ("language", Value::from(t.language.as_str())),
                ("ready", Value::Bool(t.ready)),
            ])
        })
        .collect::<Vec<_>>();
    Value::object([("id", Value::from(id)), ("type", Value::from("templates")), ("templates", Value::from(list))])
}

/// `kvm` is "available" or "unavailable: <reason>"; `ok` says executions can run now.
pub fn health(id: u64, health: &Health) -> Value {
    let kvm = match &health.kvm {
        Ok(()) => "available".to_owned(),
        Err(reason) => format!("unavailable: {reason}"),
    };
    let ok = health.kvm.is_ok() && health.templates > 0;
    Value::object([
        ("id", Value::from(id)),
        ("type", Value::from("health")),
        ("ok", Value::Bool(ok)),
        ("kvm", Value::from(kvm)),
        ("templates", Value::from(health.templates as u64)),
    ])
}

pub fn stats(id: u64, executions: u64, in_flight: u64, pools: &[PoolStats]) -> Value {
    let pools = pools
        .iter()
        .map(|p| {
            Value::object([
                ("template", Value::from(p.template.as_str())),
                ("ready", Value::from(p.ready)),
                ("target", Value::from(p.target)),
                ("forks", Value::from(p.forks)),
                ("fork_us_mean", Value::from(p.fork_us_mean)),
                ("resets", Value::from(p.resets)),
                ("reset_us_mean", Value::from(p.reset_us_mean)),
                ("served", Value::from(p.served)),
            ])
        })
        .collect::<Vec<_>>();
    Value::object([
        ("id", Value::from(id)),
        ("type", Value::from("stats")),
        ("executions", Value::from(executions)),
        ("in_flight", Value::from(in_flight)),
        ("pools", Value::from(pools)),
    ])
}

fn limits_value(limits: &ExecutionLimits) -> Value {
    Value::object([("timeout_ms", Value::from(limits.timeout_ms)), ("memory_mib", Value::from(limits.memory_mib)), ("output_bytes", Value::from(limits.output_bytes))])
}

fn micros(d: std::time::Duration) -> Value {
    Value::from(d.as_micros().min(u64::MAX as u128) as u64)
}

/// Time spent on one request outside the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimes {
    /// From the frame's arrival to the executor's start (`queue_us` adds the executor's own
    /// wait for a pool worker, `Execution::queue`).
    pub queue: std::time::Duration,
    /// From the frame's arrival to the response being built.
    pub total: std::time::Duration,
}

/// The `execution` response: status from `RunStatus::kind`, `exit_code` only for an exit,
/// `fault` only for a crash, output decoded as lossy UTF-8.
pub fn execution(id: u64, run: &Execution, limits: &ExecutionLimits, times: RequestTimes) -> Value {
    let exit_code = match run.status {
        RunStatus::Exited { code } => Value::from(i64::from(code)),
        _ => Value::Null,
    };
    let fault = match &run.status {
        RunStatus::Crashed { fault } => Value::object([
            ("vector", Value::from(u64::from(fault.vector))),
            ("name", Value::from(fault.name())),
            ("rip", Value::from(fault.rip)),
            ("address", fault.address.map_or(Value::Null, Value::from)),
        ]),
        _ => Value::Null,
    };
    let usage = &run.usage;
    Value::object([
        ("id", Value::from(id)),
        ("type", Value::from("execution")),
        ("status", Value::from(run.status.kind())),
        ("exit_code", exit_code),
        ("stdout", Value::from(String::from_utf8_lossy(&run.stdout).into_owned())),
        ("stderr", Value::from(String::from_utf8_lossy(&run.stderr).into_owned())),
        ("truncated", Value::Bool(matches!(run.status, RunStatus::OutputLimit { .. }))),
        ("fault", fault),
        ("limits", limits_value(limits)),
        ("vm", Value::object([("origin", Value::from(run.vm.name())), ("resets", Value::from(run.vm.resets()))])),
        (
            "timings",
            Value::object([("queue_us", micros(times.queue + run.queue)), ("fork_us", micros(run.vm_setup)), ("exec_us", micros(run.run)), ("total_us", micros(times.total))]),
        ),
        (
            "usage",
            Value::object([
                ("wall_us", Value::from(usage.wall_us)),
                ("cpu_us", Value::from(usage.cpu_us)),
                ("peak_memory_bytes", Value::from(usage.peak_memory_bytes)),
                ("pages_copied", Value::from(usage.pages_copied)),
                ("syscalls", Value::from(usage.syscalls)),
                ("exits", Value::from(usage.exits)),
            ]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::daemon::executor::{Usage, VmOrigin};
    use crate::status::GuestFault;

    const LIMITS: ExecutionLimits = ExecutionLimits { timeout_ms: 1000, memory_mib: 64, output_bytes: 10 };
    /// The server's wait for a slot; the executor waited 5 µs more for a pool worker.
    const TIMES: RequestTimes = RequestTimes { queue: Duration::from_micros(7), total: Duration::from_micros(1380) };

    fn run(status: RunStatus, stdout: &[u8]) -> Value {
        let usage = Usage { wall_us: 1360, cpu_us: 900, peak_memory_bytes: 18_350_080, pages_copied: 0, syscalls: 31, exits: 33 };
        let finished = Execution { status, stdout: stdout.to_vec(), stderr: b"err".to_vec(), queue: Duration::from_micros(5), vm_setup: Duration::from_micros(410), run: Duration::from_micros(950), usage, vm: VmOrigin::Reset { resets: 3 } };
        execution(7, &finished, &LIMITS, TIMES)
    }

    #[test]
    fn an_exit_maps_to_ok_or_error_with_its_code() {
        let ok = run(RunStatus::Exited { code: 0 }, b"42\n");
        assert_eq!(
            ok.to_json(),
            concat!(
                r#"{"id":7,"type":"execution","status":"ok","exit_code":0,"stdout":"42\n","stderr":"err","truncated":false,"fault":null,"#,
                r#""limits":{"timeout_ms":1000,"memory_mib":64,"output_bytes":10},"vm":{"origin":"reset","resets":3},"timings":{"queue_us":12,"fork_us":410,"exec_us":950,"total_us":1380},"#,
                r#""usage":{"wall_us":1360,"cpu_us":900,"peak_memory_bytes":18350080,"pages_copied":0,"syscalls":31,"exits":33}}"#
            )
        );
        let error = run(RunStatus::Exited { code: -3 }, b"");
        assert_eq!((error.get("status"), error.get("exit_code")), (Some(&Value::from("error")), Some(&Value::from(-3i64))));
    }

    #[test]
    fn other_statuses_have_no_exit_code_and_only_a_crash_has_a_fault() {
        let fault = GuestFault { vector: 14, error_code: 6, rip: 0x40_1000, address: Some(0) };
        let cases = [
            (RunStatus::Timeout { limit_ms: 1000 }, "timeout"),
            (RunStatus::OutOfMemory { limit_bytes: 64 << 20 }, "out_of_memory"),
            (RunStatus::OutputLimit { cap_bytes: 10 }, "output_limit"),
            (RunStatus::Crashed { fault }, "crashed"),
            (RunStatus::Unsupported { syscall: 41, name: "socket" }, "unsupported"),
        ];
        for (status, kind) in cases {
            let v = run(status, b"");
            assert_eq!(v.get("status"), Some(&Value::from(kind)));
            assert_eq!(v.get("exit_code"), Some(&Value::Null), "{kind}");
            assert_eq!(v.get("truncated"), Some(&Value::Bool(kind == "output_limit")), "{kind}");
            let fault = v.get("fault").unwrap();
            if kind == "crashed" {
                assert_eq!(fault.to_json(), r#"{"vector":14,"name":"segmentation fault (page fault)","rip":4198400,"address":0}"#);
            } else {
                assert!(fault.is_null(), "{kind}");
            }
        }
        let no_address = run(RunStatus::Crashed { fault: GuestFault { vector: 6, error_code: 0, rip: 1, address: None } }, b"");
        assert_eq!(no_address.get("fault").and_then(|f| f.get("address")), Some(&Value::Null));
    }

    #[test]
    fn output_is_lossy_utf8() {
        let v = run(RunStatus::Exited { code: 0 }, b"ok \xff\xfe \xc3\xa9 \xe2\x82");
        assert_eq!(v.get("stdout").and_then(Value::as_str), Some("ok \u{fffd}\u{fffd} é \u{fffd}"));
    }

    #[test]
    fn errors_carry_code_retryability_and_id() {
        assert_eq!(error(None, ErrorCode::BadFrame, "m").to_json(), r#"{"id":null,"type":"error","code":"bad_frame","message":"m","retryable":false}"#);
        let retryable: Vec<&str> = [ErrorCode::BadFrame, ErrorCode::BadRequest, ErrorCode::UnsupportedProtocol, ErrorCode::UnknownTemplate, ErrorCode::Unavailable, ErrorCode::Busy, ErrorCode::Internal]
            .into_iter()
            .filter(|c| c.retryable())
            .map(ErrorCode::as_str)
            .collect();
        assert_eq!(retryable, ["unavailable", "busy", "internal"]);
        assert_eq!(ErrorCode::from(&ExecuteError::Rejected("x".into())), ErrorCode::BadRequest);
        assert_eq!(error(Some(9), ErrorCode::from(&ExecuteError::UnknownTemplate("ruby".into())), "m").get("code"), Some(&Value::from("unknown_template")));
    }

    #[test]
    fn health_is_ok_only_when_vms_can_run() {
        let up = health(2, &Health { kvm: Ok(()), templates: 1 });
        assert_eq!(up.to_json(), r#"{"id":2,"type":"health","ok":true,"kvm":"available","templates":1}"#);
        let down = health(2, &Health { kvm: Err("/dev/kvm is missing".into()), templates: 1 });
        assert_eq!((down.get("ok"), down.get("kvm").and_then(Value::as_str)), (Some(&Value::Bool(false)), Some("unavailable: /dev/kvm is missing")));
        assert_eq!(health(2, &Health { kvm: Ok(()), templates: 0 }).get("ok"), Some(&Value::Bool(false)));
    }
}
