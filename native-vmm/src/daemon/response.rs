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
    /// From the frame's arrival to the executor's start.
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
        (
            "timings",
            Value::object([("queue_us", micros(times.queue)), ("fork_us", micros(run.vm_setup)), ("exec_us", micros(run.run)), ("total_us", micros(times.total))]),
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
