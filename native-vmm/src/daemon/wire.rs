//! The daemon protocol's wire vocabulary (PROTOCOL.md): the version, the error codes, the
//! integer and limit rules and the field types that the execute request (`request`), the
//! session requests (`session_protocol`) and the responses (`response`) share. It imports none
//! of them, so each builds on it without importing the others back.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::agent::{truncate, MAX_QUOTED_CHARS};
use crate::daemon::executor::ExecutionLimits;

/// The `code` of an error frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadFrame,
    BadRequest,
    UnsupportedProtocol,
    UnknownTemplate,
    Unavailable,
    /// A bound of the daemon's is reached; the frame's `reason` says which.
    Busy(BusyReason),
    Internal,
    /// No such session, checkpoint or session file.
    NotFound,
    /// The session's VM ended (its program exited or failed, or the daemon restarted before
    /// the session had a checkpoint): it can only be deleted, or forked from a checkpoint.
    SessionEnded,
}

/// The bound a `busy` answer met (its `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BusyReason {
    /// `--max-concurrency` run and `--max-queue` wait.
    QueueFull,
    /// `--max-queue-per-template` of the request's template wait.
    TemplateQueueFull,
    /// `--max-queue-per-key` of the request's `key_id` wait.
    KeyQueueFull,
    /// The daemon serves its maximum of connections.
    ConnectionsFull,
    /// `--max-sessions` hold a VM.
    SessionsFull,
}

impl BusyReason {
    pub const ALL: [BusyReason; 5] = [
        BusyReason::QueueFull,
        BusyReason::TemplateQueueFull,
        BusyReason::KeyQueueFull,
        BusyReason::ConnectionsFull,
        BusyReason::SessionsFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BusyReason::QueueFull => "queue_full",
            BusyReason::TemplateQueueFull => "template_queue_full",
            BusyReason::KeyQueueFull => "key_queue_full",
            BusyReason::ConnectionsFull => "connections_full",
            BusyReason::SessionsFull => "sessions_full",
        }
    }
}

impl Serialize for BusyReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl ErrorCode {
    /// Whether the same request may succeed later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Unavailable | ErrorCode::Busy(_) | ErrorCode::Internal
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedProtocol => "unsupported_protocol",
            ErrorCode::UnknownTemplate => "unknown_template",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Busy(_) => "busy",
            ErrorCode::Internal => "internal",
            ErrorCode::NotFound => "not_found",
            ErrorCode::SessionEnded => "session_ended",
        }
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The protocol version this daemon speaks.
pub const PROTOCOL_VERSION: u64 = 1;
/// The largest integer a request may carry (JavaScript's Number.MAX_SAFE_INTEGER).
pub const MAX_INTEGER: u64 = (1 << 53) - 1;
/// Template names.
pub const MAX_TEMPLATE_NAME_BYTES: usize = 255;
/// Below this the Python agent cannot reach its ready point (it needs 25–32 MiB with its
/// standard-library warm-up on the development machine, more where numpy is installed and
/// imported); a request asking for less gets this much.
pub const MIN_MEMORY_MIB: u64 = 64;

/// Default and maximum limits of a daemon (`serve --max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitPolicy {
    pub default: ExecutionLimits,
    pub max: ExecutionLimits,
}

impl LimitPolicy {
    /// Defaults are `preferred` clamped to `max`.
    pub fn new(preferred: ExecutionLimits, max: ExecutionLimits) -> LimitPolicy {
        let default = ExecutionLimits {
            timeout_ms: preferred.timeout_ms.min(max.timeout_ms),
            memory_mib: preferred.memory_mib.min(max.memory_mib),
            output_bytes: preferred.output_bytes.min(max.output_bytes),
            processes: preferred.processes.min(max.processes),
        };
        LimitPolicy { default, max }
    }
}

/// Why a frame was refused, with the request's `id` when it could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
}

pub(crate) fn bad(id: Option<u64>, message: impl Into<String>) -> RequestError {
    RequestError {
        id,
        code: ErrorCode::BadRequest,
        message: message.into(),
    }
}

/// Reads `frame` as a `T`; a refusal names where in the frame it lies ("limits.timeout_ms: ...").
/// serde quotes the offending key or value whole, so the message is cut (a hostile frame may
/// carry megabytes there).
pub(crate) fn typed<'a, T: Deserialize<'a>>(
    frame: &'a Value,
    id: Option<u64>,
) -> Result<T, RequestError> {
    serde_path_to_error::deserialize(frame).map_err(|e| {
        let path = e.path().to_string();
        let message = if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        };
        bad(id, truncate(&message, 4 * MAX_QUOTED_CHARS))
    })
}

/// An integer in 0..=MAX_INTEGER: what every JSON client represents exactly.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "u64")]
pub(crate) struct SafeInteger(pub(crate) u64);

impl TryFrom<u64> for SafeInteger {
    type Error = String;

    fn try_from(n: u64) -> Result<SafeInteger, String> {
        if n <= MAX_INTEGER {
            Ok(SafeInteger(n))
        } else {
            Err(format!("{n} is above {MAX_INTEGER}"))
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Encoding {
    Utf8,
    Base64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
pub(crate) struct LimitFields {
    pub(crate) timeout_ms: Option<SafeInteger>,
    pub(crate) memory_mib: Option<SafeInteger>,
    pub(crate) output_bytes: Option<SafeInteger>,
    pub(crate) processes: Option<SafeInteger>,
}

/// `network`: the allowlists the run is under (each narrowing the ones before; none given, or
/// an empty list of them: no network) and its limits.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
pub(crate) struct NetworkFields {
    allowlists: Vec<Vec<String>>,
    max_connections: Option<SafeInteger>,
    max_bytes: Option<SafeInteger>,
}

/// Allowlists one request may stack.
const MAX_ALLOWLISTS: usize = 4;
/// Connections at once a request may ask for at most.
const MAX_CONNECTIONS: u64 = 1024;

/// The grant `network` asks for: every rule read (`bad_request` naming the first that is not
/// one), the connection count clamped to `MAX_CONNECTIONS`.
pub(crate) fn network_grant(
    fields: Option<NetworkFields>,
    id: Option<u64>,
) -> Result<crate::net::Grant, RequestError> {
    let Some(fields) = fields else {
        return Ok(crate::net::Grant::default());
    };
    if fields.allowlists.len() > MAX_ALLOWLISTS {
        return Err(bad(
            id,
            format!("network.allowlists: at most {MAX_ALLOWLISTS} lists"),
        ));
    }
    let mut lists = Vec::new();
    for (i, list) in fields.allowlists.iter().enumerate() {
        lists.push(
            crate::net::Allowlist::parse(list)
                .map_err(|why| bad(id, format!("network.allowlists[{i}]: {why}")))?,
        );
    }
    let defaults = crate::net::Limits::default();
    Ok(crate::net::Grant {
        policy: crate::net::Policy::new(lists),
        limits: crate::net::Limits {
            connections: fields
                .max_connections
                .map_or(u64::from(defaults.connections), |SafeInteger(n)| {
                    n.min(MAX_CONNECTIONS)
                }) as u32,
            bytes: fields.max_bytes.map_or(defaults.bytes, |SafeInteger(n)| n),
        },
    })
}

/// `env`: an object of strings, kept in the client's order (the program sees its environment
/// in that order). The frame reader has already refused duplicate names.
pub(crate) struct Environment(pub(crate) Vec<(String, String)>);

impl<'de> Deserialize<'de> for Environment {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Environment, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = Environment;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Environment, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(Environment(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

pub(crate) fn clamp_limits(
    fields: LimitFields,
    id: Option<u64>,
    policy: &LimitPolicy,
) -> Result<ExecutionLimits, RequestError> {
    let pick =
        |name: &str, value: Option<SafeInteger>, min: u64, default: u64, max: u64| match value {
            Some(SafeInteger(n)) if n < min => Err(bad(
                id,
                format!("limits.{name} must be an integer from {min} to {MAX_INTEGER}"),
            )),
            Some(SafeInteger(n)) => Ok(n.min(max)),
            None => Ok(default),
        };
    let (default, max) = (policy.default, policy.max);
    Ok(ExecutionLimits {
        timeout_ms: pick(
            "timeout_ms",
            fields.timeout_ms,
            1,
            default.timeout_ms,
            max.timeout_ms,
        )?,
        // The maximum is at least MIN_MEMORY_MIB (`serve` checks it), so this stays within it.
        memory_mib: pick(
            "memory_mib",
            fields.memory_mib,
            1,
            default.memory_mib,
            max.memory_mib,
        )?
        .max(MIN_MEMORY_MIB),
        output_bytes: pick(
            "output_bytes",
            fields.output_bytes,
            0,
            default.output_bytes,
            max.output_bytes,
        )?,
        processes: pick(
            "processes",
            fields.processes,
            1,
            default.processes,
            max.processes,
        )?,
    })
}
