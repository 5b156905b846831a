//! Turning a client's frame into a typed message, checking every field.
//!
//! Policy (also in PROTOCOL.md's terms):
//! - Unknown fields are REJECTED (`bad_request` naming the field): a misspelt optional field
//!   (`"timeout": 5` for `limits.timeout_ms`) would otherwise silently run with defaults. So a
//!   client sends an optional field only to a daemon that knows it (the runtime and its daemon
//!   are built together). A null field is the same as an absent one.
//! - Integers are JSON integers in 0..=2^53-1 (what every JSON client represents exactly).
//! - Types are checked by serde against the structs below (derived, `deny_unknown_fields`), and
//!   a refusal names the field's place (`files[2].path: ...`); what the code, argv, env, files and stdin may
//!   hold (NUL bytes, paths inside /work, counts and sizes) is `AgentRequest::validate`'s
//!   rule, applied here too so that a bad request is refused before any VM is involved.
//! - Limits: `timeout_ms` ≥ 1, `memory_mib` ≥ 1, `output_bytes` ≥ 0. Larger than the daemon's
//!   maximum is clamped, not refused (PROTOCOL.md); a `memory_mib` below `MIN_MEMORY_MIB` (what
//!   the agent needs to boot) is raised to it. The clamped values are what the execution runs
//!   under, and the response's `limits` echo them.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use crate::agent::{truncate, AgentRequest, DEFAULT_SCRIPT, MAX_QUOTED_CHARS};
use crate::daemon::base64;
use crate::daemon::executor::{Defaulted, ExecuteRequest};
use crate::daemon::wire::{
    bad, clamp_limits, network_grant, typed, Encoding, Environment, ErrorCode, LimitFields,
    NetworkFields, SafeInteger,
};
pub use crate::daemon::wire::{
    LimitPolicy, RequestError, MAX_INTEGER, MAX_TEMPLATE_NAME_BYTES, MIN_MEMORY_MIB,
    PROTOCOL_VERSION,
};

/// A request after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    ListTemplates,
    /// An execution, and the `key_id` it waits under (`admission`).
    Execute(ExecuteRequest, Option<String>),
    Health,
    Stats,
    /// `load_template`: serve the template folder of this name, built after the start.
    LoadTemplate(String),
    /// `unload_template`: stop serving the template of this name.
    UnloadTemplate(String),
    /// A session request (`session_protocol`).
    Session(crate::daemon::session_protocol::SessionOp),
}

/// `{"type": "hello", "protocol": N}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct Hello {
    #[serde(rename = "type")]
    kind: String,
    protocol: SafeInteger,
}

/// A request with no fields besides `id` and `type` (read before, in `parse_request`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct NoFields {
    #[serde(rename = "id")]
    _id: IgnoredAny,
    #[serde(rename = "type")]
    _kind: IgnoredAny,
}

/// `load_template` and `unload_template`: `{"id", "type", "name"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct TemplateNameFields {
    #[serde(rename = "id")]
    _id: IgnoredAny,
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    name: String,
}

/// `execute` as the client sends it (PROTOCOL.md); absent and null fields are `None`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct ExecuteFields {
    #[serde(rename = "id")]
    _id: IgnoredAny,
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    template: String,
    code: String,
    stdin: Option<String>,
    argv: Option<Vec<String>>,
    env: Option<Environment>,
    files: Option<Vec<FileFields>>,
    limits: Option<LimitFields>,
    stream: Option<bool>,
    network: Option<NetworkFields>,
    key_id: Option<String>,
}

/// `key_id`: 1 to this many bytes.
pub const MAX_KEY_ID_BYTES: usize = 128;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct FileFields {
    path: String,
    content: String,
    encoding: Option<Encoding>,
}

/// The first frame: `{"type": "hello", "protocol": N}`. Returns the version asked for
/// (`unsupported_protocol` when it is not ours).
pub fn parse_hello(frame: &Value) -> Result<u64, RequestError> {
    let hello: Hello = typed(frame, None)?;
    if hello.kind != "hello" {
        return Err(bad(
            None,
            format!(
                "the first frame must be a hello, not '{}'",
                truncate(&hello.kind, MAX_QUOTED_CHARS)
            ),
        ));
    }
    let SafeInteger(protocol) = hello.protocol;
    if protocol != PROTOCOL_VERSION {
        return Err(RequestError { id: None, code: ErrorCode::UnsupportedProtocol, message: format!("protocol {protocol} is not supported; this daemon speaks protocol {PROTOCOL_VERSION}") });
    }
    Ok(protocol)
}

/// A request after the handshake: its `id` and what it asks.
pub fn parse_request(frame: &Value, policy: &LimitPolicy) -> Result<(u64, Request), RequestError> {
    // The id first, so that every later error can carry it.
    let id = match frame.get("id") {
        Some(value) => match value.as_u64() {
            Some(id) if id <= MAX_INTEGER => id,
            _ => {
                return Err(bad(
                    None,
                    format!("id must be an integer from 0 to {MAX_INTEGER}"),
                ))
            }
        },
        None => return Err(bad(None, "id is required")),
    };
    let kind = match frame.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(bad(Some(id), "type must be a string")),
        None => return Err(bad(Some(id), "type is required")),
    };
    let request = match kind {
        "list_templates" | "health" | "stats" => {
            typed::<NoFields>(frame, Some(id))?;
            match kind {
                "list_templates" => Request::ListTemplates,
                "health" => Request::Health,
                _ => Request::Stats,
            }
        }
        "load_template" | "unload_template" => {
            let fields: TemplateNameFields = typed(frame, Some(id))?;
            crate::daemon::templates::check_folder_name(&fields.name)
                .map_err(|message| bad(Some(id), message))?;
            if kind == "load_template" {
                Request::LoadTemplate(fields.name)
            } else {
                Request::UnloadTemplate(fields.name)
            }
        }
        "execute" => {
            refuse_positional_objects(frame, Some(id))?;
            let mut fields: ExecuteFields = typed(frame, Some(id))?;
            let key = fields.key_id.take();
            if let Some(key) = &key {
                check_key_id(key, Some(id))?;
            }
            Request::Execute(parse_execute(fields, Some(id), policy)?, key)
        }
        kind if kind.starts_with("session_") => Request::Session(
            crate::daemon::session_protocol::parse(kind, frame, id, policy)?,
        ),
        "hello" => return Err(bad(Some(id), "the handshake is already done")),
        other => {
            return Err(bad(
                Some(id),
                format!(
                    "unknown request type '{}'",
                    truncate(other, MAX_QUOTED_CHARS)
                ),
            ))
        }
    };
    Ok((id, request))
}

/// serde's derived structs also accept an array of their fields in order (`"limits": [1, 64, 0]`);
/// the protocol's nested objects must be objects.
fn refuse_positional_objects(frame: &Value, id: Option<u64>) -> Result<(), RequestError> {
    if frame.get("limits").is_some_and(Value::is_array) {
        return Err(bad(
            id,
            "limits: invalid type: sequence, expected an object",
        ));
    }
    let files = frame
        .get("files")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    match files.iter().position(Value::is_array) {
        Some(i) => Err(bad(
            id,
            format!("files[{i}]: invalid type: sequence, expected an object"),
        )),
        None => Ok(()),
    }
}

/// A `key_id` is 1 to MAX_KEY_ID_BYTES ASCII letters, digits, `-`, `_`, `.` or `:`.
fn check_key_id(key: &str, id: Option<u64>) -> Result<(), RequestError> {
    let allowed = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':');
    if key.is_empty() || key.len() > MAX_KEY_ID_BYTES || !key.bytes().all(allowed) {
        return Err(bad(
            id,
            format!("key_id must be 1 to {MAX_KEY_ID_BYTES} ASCII letters, digits, '-', '_', '.' or ':'"),
        ));
    }
    Ok(())
}

fn parse_execute(
    fields: ExecuteFields,
    id: Option<u64>,
    policy: &LimitPolicy,
) -> Result<ExecuteRequest, RequestError> {
    if fields.template.is_empty() || fields.template.len() > MAX_TEMPLATE_NAME_BYTES {
        return Err(bad(
            id,
            format!("template must be 1 to {MAX_TEMPLATE_NAME_BYTES} bytes"),
        ));
    }
    let mut files = Vec::new();
    for (i, file) in fields.files.unwrap_or_default().into_iter().enumerate() {
        let content = match file.encoding.unwrap_or(Encoding::Utf8) {
            Encoding::Utf8 => file.content.into_bytes(),
            Encoding::Base64 => base64::decode(&file.content)
                .map_err(|why| bad(id, format!("files[{i}].content: {why}")))?,
        };
        files.push((file.path, content));
    }
    let defaulted = Defaulted {
        script: fields.argv.is_none(),
        memory: fields
            .limits
            .as_ref()
            .is_none_or(|l| l.memory_mib.is_none()),
    };
    let agent_request = AgentRequest {
        code: fields.code,
        argv: fields
            .argv
            .unwrap_or_else(|| vec![DEFAULT_SCRIPT.to_owned()]),
        env: fields
            .env
            .map(|Environment(pairs)| pairs)
            .unwrap_or_default(),
        files,
        stdin: fields.stdin.map(String::into_bytes).unwrap_or_default(),
        network: network_grant(fields.network, id)?,
    };
    agent_request.validate().map_err(|e| bad(id, e.0))?;
    let limits = match fields.limits {
        Some(limits) => clamp_limits(limits, id, policy)?,
        None => policy.default,
    };
    Ok(ExecuteRequest {
        template: fields.template,
        agent_request,
        limits,
        stream: fields.stream.unwrap_or(false),
        defaulted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent;
    use crate::daemon::executor::ExecutionLimits;
    use crate::daemon::frame;
    use serde_json::{json, Map};

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

    fn value(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    /// As the server reads a request: a frame, then its fields.
    fn parse(text: &str) -> Result<(u64, Request), RequestError> {
        let frame =
            frame::decode_payload(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
        parse_request(&frame, &POLICY)
    }

    fn execute(text: &str) -> ExecuteRequest {
        match parse(text) {
            Ok((_, Request::Execute(request, _))) => request,
            other => panic!("{text}: {other:?}"),
        }
    }

    /// The error message of a refused request (which must be a bad_request for `id`).
    fn refused(text: &str, id: Option<u64>) -> String {
        match parse(text) {
            Err(e) => {
                assert_eq!(
                    (e.code, e.id),
                    (ErrorCode::BadRequest, id),
                    "{text}: {}",
                    e.message
                );
                e.message
            }
            Ok(ok) => panic!("{text} was accepted: {ok:?}"),
        }
    }

    /// `{"id":7,"type":"execute","template":"python","code":"x",<extra>}`.
    fn with(extra: &str) -> String {
        format!(
            r#"{{"id":7,"type":"execute","template":"python","code":"x"{}{extra}}}"#,
            if extra.is_empty() { "" } else { "," }
        )
    }

    #[test]
    fn hello_must_ask_for_our_protocol() {
        assert_eq!(
            parse_hello(&value(r#"{"type":"hello","protocol":1}"#)),
            Ok(1)
        );
        let e = parse_hello(&value(r#"{"type":"hello","protocol":2}"#)).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedProtocol);
        assert!(e.message.contains("protocol 2"), "{}", e.message);
        for bad in [
            r#"{"type":"hello"}"#,
            r#"{"type":"hello","protocol":"1"}"#,
            r#"{"type":"hello","protocol":1.0}"#,
            r#"{"type":"hello","protocol":-1}"#,
            r#"{"type":"hello","protocol":9007199254740992}"#,
            r#"{"type":"hello","protocol":[1]}"#,
            r#"{"type":"hello","protocol":1,"client":"x"}"#,
            r#"{"type":"health","id":1}"#,
            r#"{"protocol":1}"#,
            r#"{"type":1,"protocol":1}"#,
        ] {
            let e = parse_hello(&value(bad)).unwrap_err();
            assert_eq!(
                (e.code, e.id),
                (ErrorCode::BadRequest, None),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn ids_and_types_are_checked_first() {
        assert_eq!(
            parse(r#"{"id":0,"type":"health"}"#),
            Ok((0, Request::Health))
        );
        assert_eq!(
            parse(r#"{"type":"stats","id":9007199254740991}"#),
            Ok((MAX_INTEGER, Request::Stats))
        );
        assert_eq!(
            parse(r#"{"id":3,"type":"list_templates"}"#),
            Ok((3, Request::ListTemplates))
        );
        for no_id in [
            r#"{"type":"health"}"#,
            r#"{"id":null,"type":"health"}"#,
            r#"{"id":-1,"type":"health"}"#,
            r#"{"id":1.5,"type":"health"}"#,
            r#"{"id":"1","type":"health"}"#,
            r#"{"id":9007199254740992,"type":"health"}"#,
            r#"{"id":1e3,"type":"health"}"#,
        ] {
            refused(no_id, None);
        }
        assert_eq!(refused(r#"{"id":4}"#, Some(4)), "type is required");
        assert_eq!(
            refused(r#"{"id":4,"type":["health"]}"#, Some(4)),
            "type must be a string"
        );
        assert_eq!(
            refused(r#"{"id":4,"type":"reboot"}"#, Some(4)),
            "unknown request type 'reboot'"
        );
        assert_eq!(
            refused(r#"{"id":4,"type":"hello","protocol":1}"#, Some(4)),
            "the handshake is already done"
        );
        assert_eq!(
            refused(r#"{"id":4,"type":"health","verbose":true}"#, Some(4)),
            "verbose: unknown field `verbose`, expected `id` or `type`"
        );
        // A hostile type name is not echoed whole.
        let long = format!(r#"{{"id":4,"type":"{}"}}"#, "x".repeat(10_000));
        assert!(refused(&long, Some(4)).len() < 200);
    }

    #[test]
    fn the_protocol_example_parses_whole() {
        let request = execute(
            r#"{"id": 7, "type": "execute", "template": "python", "code": "print(6*7)", "stdin": "in",
                "argv": ["script.py", "--flag"], "env": {"LANG": "C.UTF-8", "X": ""},
                "files": [{"path": "data.csv", "content": "a,b\n1,2\n", "encoding": "utf8"},
                          {"path": "dir/blob.bin", "content": "AP8=", "encoding": "base64"},
                          {"path": "dir/sub/t.txt", "content": ""}],
                "limits": {"timeout_ms": 5000, "memory_mib": 128, "output_bytes": 4096, "processes": 3}, "stream": true}"#,
        );
        assert_eq!(
            request,
            ExecuteRequest {
                template: "python".into(),
                agent_request: AgentRequest {
                    code: "print(6*7)".into(),
                    stdin: b"in".to_vec(),
                    network: Default::default(),
                    argv: vec!["script.py".into(), "--flag".into()],
                    env: vec![("LANG".into(), "C.UTF-8".into()), ("X".into(), "".into())],
                    files: vec![
                        ("data.csv".into(), b"a,b\n1,2\n".to_vec()),
                        ("dir/blob.bin".into(), vec![0, 0xff]),
                        ("dir/sub/t.txt".into(), vec![])
                    ],
                },
                limits: ExecutionLimits {
                    timeout_ms: 5000,
                    memory_mib: 128,
                    output_bytes: 4096,
                    processes: 3,
                },
                stream: true,
                defaulted: Defaulted::default(),
            }
        );
    }

    /// The request frames of tests/fixtures/protocol/, PROTOCOL.md's examples, which
    /// runtime/protocol.test.ts reads too.
    #[test]
    fn the_shared_protocol_examples_parse() {
        let fixture = |text: &str| value(text)["request"].clone();
        let hello = fixture(include_str!("../../tests/fixtures/protocol/hello.json"));
        assert_eq!(parse_hello(&hello), Ok(PROTOCOL_VERSION));
        let health = fixture(include_str!("../../tests/fixtures/protocol/health.json"));
        assert_eq!(parse(&health.to_string()), Ok((2, Request::Health)));
        let request = fixture(include_str!("../../tests/fixtures/protocol/execute.json"));
        assert!(matches!(
            parse(&request.to_string()),
            Ok((7, Request::Execute(_, Some(key)))) if key == "key-0b7e4d4e"
        ));
        assert_eq!(
            execute(&request.to_string()),
            ExecuteRequest {
                template: "python".into(),
                agent_request: AgentRequest {
                    code: "print(6*7)".into(),
                    stdin: vec![],
                    network: crate::net::Grant {
                        policy: crate::net::Policy::new(vec![crate::net::Allowlist::parse(&[
                            "pypi.org:443",
                            "*.pythonhosted.org:443"
                        ])
                        .unwrap()]),
                        limits: crate::net::Limits {
                            connections: 8,
                            bytes: 104_857_600
                        },
                    },
                    argv: vec!["script.py".into(), "--flag".into()],
                    env: vec![("LANG".into(), "C.UTF-8".into())],
                    files: vec![("data.csv".into(), b"a,b\n1,2\n".to_vec())],
                },
                limits: ExecutionLimits {
                    timeout_ms: 10_000,
                    memory_mib: 256,
                    output_bytes: 1 << 20,
                    processes: 64,
                },
                stream: false,
                defaulted: Defaulted::default(),
            }
        );
    }

    #[test]
    fn a_key_id_names_whose_line_an_execution_waits_in() {
        let key_of = |text: &str| match parse(text) {
            Ok((_, Request::Execute(_, key))) => key,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(key_of(&with("")), None);
        assert_eq!(key_of(&with(r#""key_id":null"#)), None);
        let uuid = "0b7e4d4e-6a43-4c59-9d1e-2f0c1d6b8a10";
        assert_eq!(
            key_of(&with(&format!(r#""key_id":"{uuid}""#))).as_deref(),
            Some(uuid)
        );
        let longest = "k".repeat(MAX_KEY_ID_BYTES);
        assert_eq!(
            key_of(&with(&format!(r#""key_id":"{longest}""#))),
            Some(longest.clone())
        );
        for bad_key in [
            r#""""#.to_owned(),
            format!(r#""{longest}k""#),
            r#""a b""#.to_owned(),
            r#""caf\u00e9""#.to_owned(),
            r#""a\nb""#.to_owned(),
        ] {
            assert!(
                refused(&with(&format!(r#""key_id":{bad_key}"#)), Some(7))
                    .starts_with("key_id must be"),
                "{bad_key}"
            );
        }
        assert!(refused(&with(r#""key_id":7"#), Some(7)).starts_with("key_id: invalid type"));
    }

    #[test]
    fn optional_fields_default_and_limits_clamp() {
        let request = execute(&with(""));
        assert_eq!(request.agent_request, AgentRequest::new("x"));
        assert_eq!(request.limits, POLICY.default);
        // null is the same as absent.
        assert!(!request.stream);
        assert_eq!(
            execute(&with(
                r#""stdin":null,"argv":null,"env":null,"files":null,"limits":null,"stream":null"#
            )),
            request
        );

        let clamped = execute(&with(
            r#""limits":{"timeout_ms":9007199254740991,"memory_mib":100000,"output_bytes":99999999,"processes":9007199254740991}"#,
        ));
        assert_eq!(clamped.limits, POLICY.max);
        let partial = execute(&with(r#""limits":{"timeout_ms":1,"output_bytes":0}"#));
        assert_eq!(
            partial.limits,
            ExecutionLimits {
                timeout_ms: 1,
                memory_mib: 256,
                output_bytes: 0,
                processes: 64,
            }
        );
        assert_eq!(
            execute(&with(r#""limits":{"processes":1}"#))
                .limits
                .processes,
            1,
            "the program alone: every fork is EAGAIN"
        );
        assert_eq!(
            execute(&with(r#""limits":{"processes":129}"#))
                .limits
                .processes,
            128,
            "clamped to the maximum"
        );
        for bad in ["0", "-1", "2.5", r#""8""#, "true", "[8]"] {
            assert!(
                refused(
                    &with(&format!(r#""limits":{{"processes":{bad}}}"#)),
                    Some(7)
                )
                .starts_with("limits.processes"),
                "{bad}"
            );
        }
        assert!(refused(&with(r#""limits":{"processes":0}"#), Some(7))
            .contains("limits.processes must be an integer from 1"));
        assert!(refused(&with(r#""limits":{"timeout_ms":0}"#), Some(7))
            .contains("limits.timeout_ms must be an integer from 1"));
        assert_eq!(
            execute(&with(r#""limits":{"memory_mib":16}"#))
                .limits
                .memory_mib,
            MIN_MEMORY_MIB,
            "raised to what the agent needs"
        );
        assert!(refused(&with(r#""limits":{"memory_mib":0}"#), Some(7))
            .contains("limits.memory_mib must be an integer from 1"));
        assert!(
            refused(&with(r#""limits":{"memory_mib":2.5}"#), Some(7)).contains("limits.memory_mib")
        );
        assert_eq!(refused(&with(r#""limits":{"timeout":5}"#), Some(7)), "limits.timeout: unknown field `timeout`, expected one of `timeout_ms`, `memory_mib`, `output_bytes`, `processes`");
        assert_eq!(
            refused(&with(r#""limits":[5]"#), Some(7)),
            "limits: invalid type: sequence, expected an object"
        );
        assert_eq!(
            refused(&with(r#""limits":[5000,128,4096]"#), Some(7)),
            "limits: invalid type: sequence, expected an object"
        );

        // Defaults above a small maximum are clamped too.
        let small = LimitPolicy::new(
            POLICY.default,
            ExecutionLimits {
                timeout_ms: 100,
                memory_mib: 64,
                output_bytes: 10,
                processes: 2,
            },
        );
        assert_eq!(
            small.default,
            ExecutionLimits {
                timeout_ms: 100,
                memory_mib: 64,
                output_bytes: 10,
                processes: 2,
            }
        );
    }

    #[test]
    fn every_field_refuses_every_wrong_type() {
        let junk = [
            "1",
            "-1",
            "1.5",
            "true",
            r#""s""#,
            "[]",
            "{}",
            r#"[{"a":[{"b":null}]}]"#,
        ];
        // Each field with the junk values of the right type (which may be valid).
        let fields: [(&str, &[&str]); 9] = [
            ("type", &[r#""s""#]),
            ("template", &[r#""s""#]),
            ("code", &[r#""s""#]),
            ("stdin", &[r#""s""#]),
            ("argv", &["[]"]),
            ("env", &["{}"]),
            ("files", &["[]"]),
            ("limits", &["{}"]),
            ("stream", &["true"]),
        ];
        for (field, right_type) in fields {
            for junk in junk.iter().filter(|j| !right_type.contains(j)) {
                let mut request = value(&with(""));
                let Value::Object(members) = &mut request else {
                    unreachable!()
                };
                members.insert(field.to_owned(), value(junk));
                let text = request.to_string();
                match parse_request(&request, &POLICY) {
                    Err(e) => {
                        assert_eq!((e.code, e.id), (ErrorCode::BadRequest, Some(7)), "{text}");
                        assert!(e.message.contains(field), "{text}: {}", e.message);
                    }
                    Ok(ok) => panic!("{text}: accepted {ok:?}"),
                }
            }
        }
    }

    #[test]
    fn required_fields_are_required() {
        assert_eq!(
            refused(r#"{"id":7,"type":"execute","code":"x"}"#, Some(7)),
            "missing field `template`"
        );
        assert_eq!(
            refused(r#"{"id":7,"type":"execute","template":"python"}"#, Some(7)),
            "missing field `code`"
        );
        assert_eq!(
            refused(
                r#"{"id":7,"type":"execute","template":"","code":"x"}"#,
                Some(7)
            ),
            "template must be 1 to 255 bytes"
        );
        assert_eq!(refused(&with(r#""timeout_ms":5"#), Some(7)), "timeout_ms: unknown field `timeout_ms`, expected one of `id`, `type`, `template`, `code`, `stdin`, `argv`, `env`, `files`, `limits`, `stream`, `network`, `key_id`");
    }

    #[test]
    fn argv_env_and_files_follow_the_agent_rules() {
        assert!(refused(&with(r#""argv":[]"#), Some(7)).starts_with("argv must have 1 to"));
        let many = format!(
            r#""argv":[{}]"#,
            vec![r#""a""#; agent::MAX_ARGS + 1].join(",")
        );
        assert!(refused(&with(&many), Some(7)).starts_with("argv must have 1 to"));
        assert_eq!(
            refused(&with(r#""argv":["a",1]"#), Some(7)),
            "argv[1]: invalid type: integer `1`, expected a string"
        );
        assert_eq!(
            refused(&with(r#""argv":["a","b\u0000"]"#), Some(7)),
            "argv[1] contains a NUL byte"
        );
        assert!(refused(&with(r#""argv":["../x.py"]"#), Some(7)).starts_with("argv[0]"));
        assert_eq!(
            execute(&with(r#""argv":["é.py","--x=1",""]"#))
                .agent_request
                .argv,
            vec!["é.py", "--x=1", ""]
        );

        assert!(refused(&with(r#""env":{"A=B":"1"}"#), Some(7)).contains("without '='"));
        assert!(refused(&with(r#""env":{"A":"\u0000"}"#), Some(7)).contains("values without NUL"));
        assert_eq!(
            refused(&with(r#""env":{"A":1}"#), Some(7)),
            "env.A: invalid type: integer `1`, expected a string"
        );
        let many: Vec<String> = (0..=agent::MAX_ENV_VARS)
            .map(|i| format!(r#""V{i}":"""#))
            .collect();
        assert!(
            refused(&with(&format!(r#""env":{{{}}}"#, many.join(","))), Some(7))
                .contains("environment variables, more than")
        );

        let file = |path: &str| {
            with(&format!(
                r#""files":[{{"path":{},"content":"x"}}]"#,
                Value::from(path)
            ))
        };
        assert_eq!(
            execute(&file("a/b/c.txt")).agent_request.files,
            vec![("a/b/c.txt".to_owned(), b"x".to_vec())]
        );
        for bad in [
            "",
            "/etc/passwd",
            "..",
            "../x",
            "a/./b",
            "a//b",
            "a/",
            "a\u{0}b",
            "main.py",
        ] {
            let message = refused(&file(bad), Some(7));
            assert!(message.starts_with("files[0].path"), "{bad:?}: {message}");
        }
        let two = |a: &str, b: &str| {
            with(&format!(
                r#""files":[{{"path":"{a}","content":""}},{{"path":"{b}","content":""}}]"#
            ))
        };
        assert!(refused(&two("a", "a"), Some(7)).contains("given twice"));
        assert!(refused(&two("a", "a/b"), Some(7)).contains("\"a\" is a file"));
        assert_eq!(execute(&two("a", "ab/c")).agent_request.files.len(), 2);
    }

    #[test]
    fn file_entries_are_checked_field_by_field() {
        let entry = |body: &str| with(&format!(r#""files":[{body}]"#));
        assert_eq!(
            refused(&entry(r#""a""#), Some(7)),
            "files[0]: invalid type: string \"a\", expected an object"
        );
        assert_eq!(
            refused(
                &entry(r#"{"path":"a","content":"x"},["b","y",null]"#),
                Some(7)
            ),
            "files[1]: invalid type: sequence, expected an object"
        );
        assert_eq!(
            refused(&entry(r#"{"content":"x"}"#), Some(7)),
            "files[0]: missing field `path`"
        );
        assert_eq!(
            refused(&entry(r#"{"path":"a"}"#), Some(7)),
            "files[0]: missing field `content`"
        );
        assert_eq!(
            refused(&entry(r#"{"path":"a","content":"x","mode":420}"#), Some(7)),
            "files[0].mode: unknown field `mode`, expected one of `path`, `content`, `encoding`"
        );
        assert_eq!(
            refused(
                &entry(r#"{"path":"a","content":"x","encoding":"hex"}"#),
                Some(7)
            ),
            "files[0].encoding: unknown variant `hex`, expected `utf8` or `base64`"
        );
        assert_eq!(
            refused(
                &entry(r#"{"path":"a","content":"x","encoding":1}"#),
                Some(7)
            ),
            "files[0].encoding: invalid type: integer `1`, expected string or map"
        );
        assert!(refused(
            &entry(r#"{"path":"a","content":"Zg","encoding":"base64"}"#),
            Some(7)
        )
        .starts_with("files[0].content: "));
        assert_eq!(
            refused(&entry(r#"{"path":"a","content":["x"]}"#), Some(7)),
            "files[0].content: invalid type: sequence, expected a string"
        );
        assert_eq!(
            execute(&entry(
                r#"{"path":"a","content":"AP8=","encoding":"base64"}"#
            ))
            .agent_request
            .files[0]
                .1,
            vec![0, 0xff]
        );
        let many: Vec<String> = (0..=agent::MAX_FILES)
            .map(|i| format!(r#"{{"path":"f{i}","content":""}}"#))
            .collect();
        assert!(refused(&entry(&many.join(",")), Some(7)).contains("files, more than"));
    }

    /// Deterministic hostile JSON: random trees of every kind of value, placed in every field.
    #[test]
    fn random_values_in_every_field_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        fn tree(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            match next() % if depth > 3 { 6 } else { 8 } {
                0 => Value::Null,
                1 => Value::Bool(next().is_multiple_of(2)),
                2 => Value::from(next() >> (next() % 64)),
                3 => Value::from(-(next() % 1000).cast_signed()),
                4 => Value::from((next() % 1000) as f64 / 7.0),
                5 => Value::from(
                    [
                        "", "a", "..", "/x", "python", "utf8", "base64", "Zg==", "\u{0}", "é",
                    ][(next() % 10) as usize],
                ),
                6 => Value::Array((0..next() % 4).map(|_| tree(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next() % 4)
                        .map(|i| {
                            (
                                ["path", "content", "encoding", "timeout_ms", "x", "A"]
                                    [((next() + i) % 6) as usize]
                                    .to_owned(),
                                tree(next, depth + 1),
                            )
                        })
                        .collect(),
                ),
            }
        }
        let keys = [
            "id", "type", "template", "code", "stdin", "argv", "env", "files", "limits", "key_id",
            "other",
        ];
        for _ in 0..20_000 {
            let mut members = Map::new();
            for (key, value) in [
                ("id", Value::from(1u64)),
                ("type", Value::from("execute")),
                ("template", Value::from("python")),
                ("code", Value::from("x")),
            ] {
                members.insert(key.into(), value);
            }
            let key = keys[(next() % keys.len() as u64) as usize];
            members.insert(key.into(), tree(&mut next, 0));
            match parse_request(&Value::Object(members), &POLICY) {
                Ok((id, Request::Execute(r, key_id))) => {
                    assert!(id == 1 || key == "id");
                    assert!(key_id.is_none_or(|k| check_key_id(&k, None).is_ok()));
                    assert!(
                        r.limits.timeout_ms <= POLICY.max.timeout_ms
                            && r.limits.memory_mib >= MIN_MEMORY_MIB
                    );
                    assert_eq!(r.agent_request.validate(), Ok(()));
                }
                Ok(other) => panic!("{other:?}"),
                Err(e) => assert_eq!(e.code, ErrorCode::BadRequest, "{}", e.message),
            }
        }
    }

    /// Seeded corruptions of valid frames (header included) through the frame reader and the
    /// request parser, as the server reads a connection: each ends in a frame error, a typed
    /// refusal or a request, never a panic, and a refusal's message stays short.
    #[test]
    fn corrupted_frames_never_panic_the_reader_or_the_parser() {
        let valid = [
            r#"{"type":"hello","protocol":1}"#.to_owned(),
            r#"{"id":1,"type":"health"}"#.to_owned(),
            r#"{"id":2,"type":"stats"}"#.to_owned(),
            r#"{"id":3,"type":"list_templates"}"#.to_owned(),
            r#"{"id":7,"type":"execute","template":"python","code":"print(6*7)","stdin":"in\n","argv":["script.py","--flag"],"env":{"LANG":"C.UTF-8","X":""},"files":[{"path":"data/a.csv","content":"a,b\n","encoding":"utf8"},{"path":"b","content":"AP8=","encoding":"base64"}],"limits":{"timeout_ms":10000,"memory_mib":256,"output_bytes":1048576}}"#.to_owned(),
        ];
        let (mut rng, cases) = crate::fuzz::start("frame and request parser");
        let (mut frames, mut requests) = (0, 0);
        for case in 0..cases {
            let payload = valid[case % valid.len()].as_bytes();
            let mut stream = (payload.len() as u32).to_be_bytes().to_vec();
            stream.extend_from_slice(payload);
            // A third of the cases change JSON values, a third corrupt the payload's bytes under
            // a correct length, a third the whole stream.
            let corrupted = if case % 3 == 0 {
                let mut value: Value = serde_json::from_slice(payload).unwrap();
                for _ in 0..1 + rng.below(3) {
                    corrupt_a_value(&mut rng, &mut value);
                }
                let body = value.to_string().into_bytes();
                [(body.len() as u32).to_be_bytes().as_slice(), &body].concat()
            } else if case % 3 == 1 {
                let body = crate::fuzz::mutate(&mut rng, payload);
                [(body.len() as u32).to_be_bytes().as_slice(), &body].concat()
            } else {
                crate::fuzz::mutate(&mut rng, &stream)
            };
            let Ok(frame) = frame::read_frame(&mut &corrupted[..]) else {
                continue;
            };
            frames += 1;
            let _ = parse_hello(&frame);
            match parse_request(&frame, &POLICY) {
                Ok(_) => requests += 1,
                Err(e) => assert!(
                    e.message.len() < 1024,
                    "a refusal of {} bytes: {}",
                    e.message.len(),
                    e.message.chars().take(300).collect::<String>()
                ),
            }
        }
        eprintln!("{cases} corrupted frames: {frames} read as JSON objects, {requests} parsed as requests");
    }

    /// Replaces one value somewhere in `value` (or drops a key, or adds an unknown one) with
    /// something a schema must refuse or clamp.
    fn corrupt_a_value(rng: &mut crate::fuzz::Rng, value: &mut Value) {
        let odd = || -> [Value; 16] {
            [
                Value::Null,
                Value::Bool(true),
                Value::from(-1),
                Value::from(u64::MAX),
                Value::from(MAX_INTEGER + 1),
                Value::from(1.5),
                Value::from(""),
                Value::from("../../../etc/passwd"),
                Value::from("a\u{0}b"),
                Value::from("é".repeat(5000)),
                Value::from("/abs/path"),
                serde_json::json!([]),
                serde_json::json!({}),
                serde_json::json!([[[[[[1]]]]]]),
                serde_json::json!({"path": "x", "content": "AP8=", "encoding": "rot13"}),
                Value::from("utf8"),
            ]
        };
        let mut at = value;
        loop {
            let children = match at {
                Value::Object(map) => map.len(),
                Value::Array(items) => items.len(),
                _ => 0,
            };
            if children == 0 || rng.below(3) == 0 {
                break;
            }
            let pick = rng.below(children);
            at = match at {
                Value::Object(map) => {
                    if rng.below(6) == 0 {
                        let key = map.keys().nth(pick).unwrap().clone();
                        map.remove(&key);
                        return;
                    }
                    if rng.below(8) == 0 {
                        map.insert("unexpected".into(), Value::from(1));
                        return;
                    }
                    map.values_mut().nth(pick).unwrap()
                }
                Value::Array(items) => &mut items[pick],
                _ => unreachable!(),
            };
        }
        let choices = odd();
        *at = choices[rng.below(choices.len())].clone();
    }

    /// tests/fixtures/request-limits.json holds the daemon's bounds on a request; the gateway
    /// checks them at the edge and holds its constants to the same file
    /// (gateway/request-limits.test.ts).
    #[test]
    fn the_shared_request_limits_fixture_holds_the_daemons_bounds() {
        let fixture: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/request-limits.json")).unwrap();
        assert_eq!(
            fixture,
            json!({
                "MAX_CODE_BYTES": crate::agent::MAX_CODE_BYTES,
                "MAX_STDIN_BYTES": crate::agent::MAX_STDIN_BYTES,
                "MAX_ARGS_ENV_BYTES": crate::agent::MAX_ARGS_ENV_BYTES,
                "MAX_ARGS": crate::agent::MAX_ARGS,
                "MAX_ENV_VARS": crate::agent::MAX_ENV_VARS,
                "MAX_FILES": crate::agent::MAX_FILES,
                "MAX_FILES_BYTES": crate::agent::MAX_FILES_BYTES,
                "MAX_SESSION_FILE_BYTES": crate::daemon::sessions::MAX_SESSION_FILE_BYTES,
                "MAX_FRAME_BYTES": crate::daemon::frame::MAX_FRAME_BYTES,
                "MAX_PROCESS_LIMIT": crate::process::MAX_PROCESS_LIMIT,
            })
        );
    }

    /// The file paths of tests/fixtures/file-paths.json, which the gateway's edge validation
    /// is tested against too (gateway/file-paths.test.ts): the daemon gives each its verdict.
    #[test]
    fn the_shared_file_path_fixture_holds_the_daemons_verdicts() {
        let fixture: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/file-paths.json")).unwrap();
        let execute = |argv0: &Value, files: &Value| {
            json!({"id": 1, "type": "execute", "template": "python", "code": "",
                "argv": [argv0], "files": files})
        };
        let mut checked = 0;
        for case in fixture["work_paths"].as_array().unwrap() {
            let path = case["path"].as_str().unwrap();
            let valid = case["valid"].as_bool().unwrap();
            assert_eq!(
                crate::agent::check_work_path(path).is_ok(),
                valid,
                "work path {path:?}"
            );
            let frame = execute(
                &json!("fixture-script.py"),
                &json!([{"path": path, "content": ""}]),
            );
            assert_eq!(
                parse_request(&frame, &POLICY).is_ok(),
                valid,
                "file {path:?}"
            );
            checked += 1;
        }
        for case in fixture["requests"].as_array().unwrap() {
            let frame = execute(&case["argv0"], &case["files"]);
            let parsed = parse_request(&frame, &POLICY);
            assert_eq!(
                parsed.is_ok(),
                case["valid"].as_bool().unwrap(),
                "request {}: {:?}",
                case["why"],
                parsed.err()
            );
            checked += 1;
        }
        assert!(checked > 300, "only {checked} cases");
    }
}
