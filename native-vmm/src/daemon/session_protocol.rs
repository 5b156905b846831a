//! The session requests of the daemon protocol (PROTOCOL.md, Sessions): parsing them with the
//! same policy as `execute` (`request`: unknown fields refused, limits clamped) and answering
//! them from `sessions::Sessions`.

use std::time::{Duration, Instant};

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::daemon::base64;
use crate::daemon::executor::ExecutionLimits;
use crate::daemon::response::{self, RequestTimes, Response, SessionReply};
use crate::daemon::sessions::{
    check_session_id, CheckpointInfo, SessionError, SessionInfo, SessionState, Sessions,
    TakenCheckpoint,
};
use crate::daemon::wire::{
    bad, clamp_limits, network_grant, typed, Encoding, Environment, LimitFields, LimitPolicy,
    NetworkFields, RequestError, SafeInteger,
};

/// One validated session request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOp {
    Create {
        session: String,
        template: String,
        memory_mib: Option<u64>,
    },
    Execute {
        session: String,
        code: String,
        env: Vec<(String, String)>,
        limits: ExecutionLimits,
        network: crate::net::Grant,
    },
    WriteFile {
        session: String,
        path: String,
        content: Vec<u8>,
    },
    ReadFile {
        session: String,
        path: String,
    },
    DeleteFile {
        session: String,
        path: String,
    },
    Checkpoint {
        session: String,
    },
    Pause {
        session: String,
    },
    Resume {
        session: String,
    },
    Fork {
        session: String,
        from: String,
        checkpoint: u64,
    },
    Delete {
        session: String,
    },
    /// `session_template`: the session saved as template `name`, then served.
    SaveTemplate {
        session: String,
        name: String,
    },
    Info {
        session: String,
    },
    List,
}

impl SessionOp {
    /// Whether it runs guest code (and so takes an execution slot).
    pub fn runs_code(&self) -> bool {
        matches!(self, SessionOp::Execute { .. })
    }
}

/// The fields every session request shares, and each type's own (absent and null are None).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct Fields {
    #[serde(rename = "id")]
    _id: IgnoredAny,
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    session: Option<String>,
    template: Option<String>,
    memory_mib: Option<SafeInteger>,
    code: Option<String>,
    env: Option<Environment>,
    limits: Option<LimitFields>,
    network: Option<NetworkFields>,
    path: Option<String>,
    content: Option<String>,
    encoding: Option<Encoding>,
    from: Option<String>,
    checkpoint: Option<SafeInteger>,
    name: Option<String>,
}

/// Which fields each type takes besides `session` (which all but `session_list` require).
fn allowed(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "session_create" => &["template", "memory_mib"],
        "session_execute" => &["code", "env", "limits", "network"],
        "session_write_file" => &["path", "content", "encoding"],
        "session_read_file" | "session_delete_file" => &["path"],
        "session_fork" => &["from", "checkpoint"],
        "session_template" => &["name"],
        "session_checkpoint" | "session_pause" | "session_resume" | "session_delete"
        | "session_info" | "session_list" => &[],
        _ => return None,
    })
}

/// Parses a request whose type starts with `session_`.
pub fn parse(
    kind: &str,
    frame: &Value,
    id: u64,
    policy: &LimitPolicy,
) -> Result<SessionOp, RequestError> {
    let id = Some(id);
    let Some(allowed) = allowed(kind) else {
        return Err(bad(
            id,
            format!(
                "unknown request type '{}'",
                kind.chars().take(64).collect::<String>()
            ),
        ));
    };
    if let Value::Object(members) = frame {
        let own = |key: &str| {
            key == "id"
                || key == "type"
                || (key == "session" && kind != "session_list")
                || allowed.contains(&key)
        };
        if let Some(key) = members.keys().find(|key| !own(key)) {
            return Err(bad(
                id,
                format!(
                    "{}: unknown field for {kind}",
                    key.chars().take(64).collect::<String>()
                ),
            ));
        }
        if members.get("limits").is_some_and(Value::is_array) {
            return Err(bad(
                id,
                "limits: invalid type: sequence, expected an object",
            ));
        }
    }
    let fields: Fields = typed(frame, id)?;
    if kind == "session_list" {
        return Ok(SessionOp::List);
    }
    let required = |value: Option<String>, name: &str| {
        value.ok_or_else(|| bad(id, format!("missing field `{name}`")))
    };
    let session = required(fields.session, "session")?;
    check_session_id(&session).map_err(|why| bad(id, format!("session: {why}")))?;
    Ok(match kind {
        "session_create" => SessionOp::Create {
            session,
            template: required(fields.template, "template")?,
            memory_mib: fields.memory_mib.map(|SafeInteger(n)| n),
        },
        "session_execute" => {
            let limits = match fields.limits {
                Some(limits) if limits.memory_mib.is_some() => {
                    return Err(bad(
                        id,
                        "limits.memory_mib: a session's memory is set when it is created",
                    ))
                }
                Some(limits) => clamp_limits(limits, id, policy)?,
                None => policy.default,
            };
            SessionOp::Execute {
                session,
                code: required(fields.code, "code")?,
                env: fields
                    .env
                    .map(|Environment(pairs)| pairs)
                    .unwrap_or_default(),
                limits,
                network: network_grant(fields.network, id)?,
            }
        }
        "session_write_file" => {
            let text = required(fields.content, "content")?;
            let content = match fields.encoding.unwrap_or(Encoding::Utf8) {
                Encoding::Utf8 => text.into_bytes(),
                Encoding::Base64 => {
                    base64::decode(&text).map_err(|why| bad(id, format!("content: {why}")))?
                }
            };
            SessionOp::WriteFile {
                session,
                path: required(fields.path, "path")?,
                content,
            }
        }
        "session_read_file" => SessionOp::ReadFile {
            session,
            path: required(fields.path, "path")?,
        },
        "session_delete_file" => SessionOp::DeleteFile {
            session,
            path: required(fields.path, "path")?,
        },
        "session_fork" => {
            let from = required(fields.from, "from")?;
            check_session_id(&from).map_err(|why| bad(id, format!("from: {why}")))?;
            let Some(SafeInteger(checkpoint)) = fields.checkpoint else {
                return Err(bad(id, "missing field `checkpoint`"));
            };
            SessionOp::Fork {
                session,
                from,
                checkpoint,
            }
        }
        "session_template" => SessionOp::SaveTemplate {
            session,
            name: required(fields.name, "name")?,
        },
        "session_checkpoint" => SessionOp::Checkpoint { session },
        "session_pause" => SessionOp::Pause { session },
        "session_resume" => SessionOp::Resume { session },
        "session_delete" => SessionOp::Delete { session },
        _ => SessionOp::Info { session },
    })
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn checkpoint_json(c: &CheckpointInfo) -> Value {
    json!({"checkpoint": c.number, "sha256": c.sha256, "file_bytes": c.file_bytes})
}

fn session_json(info: &SessionInfo) -> Map<String, Value> {
    object(json!({
        "session": info.id,
        "template": info.template,
        "state": info.state,
        "memory_mib": info.memory_mib,
        "checkpoints": info.checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>(),
        "checkpoint_bytes": info.checkpoints.iter().map(|c| c.file_bytes).sum::<u64>(),
        "ended": info.ended,
    }))
}

fn taken_json(session: &str, taken: &TakenCheckpoint, state: SessionState) -> Map<String, Value> {
    let mut fields = object(checkpoint_json(&taken.info));
    fields.insert("session".into(), session.into());
    fields.insert("state".into(), json!(state));
    fields.insert("dirty_bytes".into(), taken.info.dirty_bytes.into());
    fields.insert("parent".into(), json!(taken.info.parent));
    fields.insert(
        "timings".into(),
        json!({"capture_us": micros(taken.capture), "write_us": micros(taken.write)}),
    );
    fields
}

/// Starts serving a template folder the daemon just made: the executor's `load_template`,
/// then sessions of it (`Sessions::serve_template`).
pub type LoadTemplate<'a> = dyn Fn(&str) -> Result<(), SessionError> + 'a;

/// Answers one session request (on its own thread: it may run guest code or write to disk).
/// `load` serves the template a `session_template` made.
pub fn handle(
    sessions: &Sessions,
    load: &LoadTemplate,
    id: u64,
    op: SessionOp,
    received: Instant,
) -> Response {
    let answer = |result: Result<Response, SessionError>| {
        result.unwrap_or_else(|e| response::error(Some(id), e.code, &e.message))
    };
    let session_reply = |info: SessionInfo, extra: Option<(&str, Value)>| {
        let mut fields = session_json(&info);
        if let Some((key, value)) = extra {
            fields.insert(key.into(), value);
        }
        response::session_reply(id, SessionReply::Session, fields)
    };
    answer(match op {
        SessionOp::Create { session, template, memory_mib } => sessions.create(&session, &template, memory_mib).map(|info| session_reply(info, None)),
        SessionOp::Fork { session, from, checkpoint } => sessions.fork(&session, &from, checkpoint).map(|info| session_reply(info, None)),
        SessionOp::Info { session } => sessions.info(&session).map(|info| session_reply(info, None)),
        SessionOp::Resume { session } => sessions.resume(&session).and_then(|resumed| {
            let info = sessions.info(&session)?;
            Ok(session_reply(info, Some(("timings", json!({"resume_us": resumed.map(micros), "total_us": micros(received.elapsed())})))))
        }),
        SessionOp::SaveTemplate { session, name } => sessions.save_template(&session, &name, load).map(|saved| {
            let fields = json!({"session": session, "name": name, "file_bytes": saved.file_bytes, "stored_bytes": saved.memory.stored_bytes,
                "timings": {"capture_us": micros(saved.capture), "write_us": micros(saved.write), "total_us": micros(received.elapsed())}});
            response::session_reply(id, SessionReply::SessionTemplate, object(fields))
        }),
        SessionOp::Delete { session } => sessions.delete(&session).map(|()| response::session_reply(id, SessionReply::Session, object(json!({"session": session, "state": "deleted"})))),
        SessionOp::List => {
            let list: Vec<Value> = sessions.list().iter().map(|info| Value::Object(session_json(info))).collect();
            Ok(response::session_reply(id, SessionReply::Session, object(json!({"sessions": list}))))
        }
        SessionOp::Checkpoint { session } => sessions.checkpoint(&session, false).map(|taken| response::session_reply(id, SessionReply::Checkpoint, taken_json(&session, &taken, SessionState::Running))),
        SessionOp::Pause { session } => sessions.checkpoint(&session, true).map(|taken| response::session_reply(id, SessionReply::Checkpoint, taken_json(&session, &taken, SessionState::Paused))),
        SessionOp::WriteFile { session, path, content } => sessions.write_file(&session, path, content).map(|file| response::session_reply(id, SessionReply::SessionFile, object(json!({"session": session, "path": file.path, "bytes": file.bytes})))),
        SessionOp::DeleteFile { session, path } => sessions.delete_file(&session, path).map(|file| response::session_reply(id, SessionReply::SessionFile, object(json!({"session": session, "path": file.path, "deleted": true})))),
        SessionOp::ReadFile { session, path } => sessions.read_file(&session, path).map(|file| {
            let content = ::base64::encode(file.contents.unwrap_or_default());
            response::session_reply(id, SessionReply::SessionFile, object(json!({"session": session, "path": file.path, "bytes": file.bytes, "content": content, "encoding": "base64"})))
        }),
        SessionOp::Execute { session, code, env, limits, network } => sessions.execute(&session, code, env, limits, network).map(|cell| {
            let extra = object(json!({"session": session, "session_state": cell.state, "resumed": cell.resumed, "result": cell.result}));
            response::session_execution(id, &cell.execution, &limits, RequestTimes { queue: Duration::ZERO, total: received.elapsed() }, extra)
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::frame;
    use crate::daemon::request::{parse_request, Request};

    const POLICY: LimitPolicy = LimitPolicy {
        default: ExecutionLimits {
            timeout_ms: 10_000,
            memory_mib: 256,
            output_bytes: 1 << 20,
            processes: 64,
        },
        max: ExecutionLimits {
            timeout_ms: 30_000,
            memory_mib: 512,
            output_bytes: 2 << 20,
            processes: 128,
        },
    };

    fn parse_text(text: &str) -> Result<SessionOp, RequestError> {
        let value =
            frame::decode_payload(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
        match parse_request(&value, &POLICY) {
            Ok((_, Request::Session(op))) => Ok(op),
            Ok((_, other)) => panic!("{text}: {other:?}"),
            Err(e) => Err(e),
        }
    }

    fn refused(text: &str) -> String {
        let e = parse_text(text).expect_err(text);
        assert_eq!(
            (e.code, e.id),
            (crate::daemon::response::ErrorCode::BadRequest, Some(1)),
            "{text}: {}",
            e.message
        );
        e.message
    }

    #[test]
    fn every_session_request_parses() {
        assert_eq!(
            parse_text(r#"{"id":1,"type":"session_create","session":"a-1","template":"python"}"#),
            Ok(SessionOp::Create {
                session: "a-1".into(),
                template: "python".into(),
                memory_mib: None
            })
        );
        assert_eq!(
            parse_text(
                r#"{"id":1,"type":"session_execute","session":"a","code":"x","limits":{"timeout_ms":99999999}}"#
            ),
            Ok(SessionOp::Execute {
                session: "a".into(),
                code: "x".into(),
                env: vec![],
                limits: ExecutionLimits {
                    timeout_ms: 30_000,
                    ..POLICY.default
                },
                network: Default::default(),
            })
        );
        assert_eq!(
            parse_text(
                r#"{"id":1,"type":"session_execute","session":"a","code":"x","limits":{"processes":500}}"#
            ),
            Ok(SessionOp::Execute {
                session: "a".into(),
                code: "x".into(),
                env: vec![],
                limits: ExecutionLimits {
                    processes: 128,
                    ..POLICY.default
                },
                network: Default::default(),
            })
        );
        assert!(refused(
            r#"{"id":1,"type":"session_execute","session":"a","code":"x","limits":{"processes":0}}"#
        )
        .starts_with("limits.processes must be an integer from 1"));
        assert_eq!(
            parse_text(
                r#"{"id":1,"type":"session_write_file","session":"a","path":"d/f","content":"AP8=","encoding":"base64"}"#
            ),
            Ok(SessionOp::WriteFile {
                session: "a".into(),
                path: "d/f".into(),
                content: vec![0, 0xff]
            })
        );
        assert_eq!(
            parse_text(r#"{"id":1,"type":"session_fork","session":"b","from":"a","checkpoint":3}"#),
            Ok(SessionOp::Fork {
                session: "b".into(),
                from: "a".into(),
                checkpoint: 3
            })
        );
        assert_eq!(
            parse_text(r#"{"id":1,"type":"session_template","session":"a","name":"t@1"}"#),
            Ok(SessionOp::SaveTemplate {
                session: "a".into(),
                name: "t@1".into()
            })
        );
        assert_eq!(
            parse_text(r#"{"id":1,"type":"session_list"}"#),
            Ok(SessionOp::List)
        );
        for kind in ["checkpoint", "pause", "resume", "delete", "info"] {
            assert!(
                parse_text(&format!(
                    r#"{{"id":1,"type":"session_{kind}","session":"a"}}"#
                ))
                .is_ok(),
                "{kind}"
            );
        }
    }

    #[test]
    fn bad_session_requests_are_refused_with_where() {
        assert_eq!(
            refused(r#"{"id":1,"type":"session_pause"}"#),
            "missing field `session`"
        );
        assert!(
            refused(r#"{"id":1,"type":"session_pause","session":"../x"}"#)
                .starts_with("session: session ids are")
        );
        assert!(refused(&format!(
            r#"{{"id":1,"type":"session_pause","session":"{}"}}"#,
            "a".repeat(65)
        ))
        .starts_with("session:"));
        assert_eq!(
            refused(r#"{"id":1,"type":"session_pause","session":"a","code":"x"}"#),
            "code: unknown field for session_pause"
        );
        assert_eq!(
            refused(r#"{"id":1,"type":"session_execute","session":"a"}"#),
            "missing field `code`"
        );
        assert_eq!(
            refused(
                r#"{"id":1,"type":"session_execute","session":"a","code":"x","limits":{"memory_mib":64}}"#
            ),
            "limits.memory_mib: a session's memory is set when it is created"
        );
        assert_eq!(
            refused(r#"{"id":1,"type":"session_execute","session":"a","code":"x","limits":[1]}"#),
            "limits: invalid type: sequence, expected an object"
        );
        assert_eq!(
            refused(r#"{"id":1,"type":"session_template","session":"a"}"#),
            "missing field `name`"
        );
        assert_eq!(
            refused(r#"{"id":1,"type":"session_fork","session":"b","from":"a"}"#),
            "missing field `checkpoint`"
        );
        assert!(refused(r#"{"id":1,"type":"session_write_file","session":"a","path":"f","content":"Zg","encoding":"base64"}"#).starts_with("content: "));
        assert_eq!(
            refused(r#"{"id":1,"type":"session_reboot","session":"a"}"#),
            "unknown request type 'session_reboot'"
        );
        assert_eq!(
            refused(r#"{"id":1,"type":"session_info","session":7}"#),
            "session: invalid type: integer `7`, expected a string"
        );
    }
}
