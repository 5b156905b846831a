//! Sandfork's private system calls: AWAIT_REQUEST(buf, buf_len), the agent's hand-off at the
//! template's ready point, and PUBLISH_RESULT(buf, buf_len), a script's result. The protocol is
//! described in `crate::agent`.

use super::{value, SysResult, SyscallOutcome, UserMemory};
use crate::agent::{AgentRequest, CellResult, HandOff, MAX_RESULT_BYTES};
use crate::errno::Errno;
use crate::fs::{NoProcess, OpenOptions, Vfs, WORK_DIR};
use crate::process::GuestProcess;

const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// With no request pending: the ready point (the run stops inside this call). With one:
/// EFAULT for a bad buffer; E2BIG (and the needed length as a u64 at `buf`, when `buf_len` >= 8)
/// when the message does not fit, the request staying pending for the retry; otherwise the
/// request is consumed: files placed, stdin set (not for a session cell, `HandOff::Cell`), the
/// message written, its length returned.
pub fn await_request(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (buf, buf_len) = (args[0], args[1]);
    let Some(request) = proc.agent_request.take() else {
        return Ok(SyscallOutcome::ReadyPoint);
    };
    let Ok(message) = request.agent_message(proc.hand_off) else {
        proc.agent_request = Some(request);
        return Err(Errno::EIO);
    };
    let needed = message.len() as u64;
    let fits = needed <= buf_len;
    let checked = if fits {
        user.check(buf, needed)
    } else {
        Ok(())
    };
    if !fits || checked.is_err() {
        proc.agent_request = Some(request);
        checked?;
        if buf_len >= 8 {
            user.write_u64(buf, needed)?;
        }
        return Err(Errno::E2BIG);
    }
    if proc.hand_off == HandOff::Script {
        place_files(&mut proc.config.vfs, &request)?;
        proc.config.stdin = request.stdin;
    }
    user.write(buf, message.as_bytes())?;
    value(needed)
}

/// Keeps the result a script's agent passes for the execution's answer, replacing an earlier
/// one; fails as `read_result`.
pub fn publish_result(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    proc.published_result = Some(read_result(user, args[0], args[1])?);
    value(0)
}

/// The result (a `CellResult` as JSON) an agent passes in the `len` bytes at `buf`, a script's
/// with PUBLISH_RESULT or a cell's with its next AWAIT_REQUEST: E2BIG above
/// `MAX_RESULT_BYTES`, EFAULT for a bad buffer, EINVAL for anything but such JSON.
pub(crate) fn read_result(user: &UserMemory, buf: u64, len: u64) -> Result<CellResult, Errno> {
    if len > MAX_RESULT_BYTES {
        return Err(Errno::E2BIG);
    }
    let bytes = user.read_vec(buf, len)?;
    serde_json::from_slice(&bytes).map_err(|_| Errno::EINVAL)
}

/// Writes the script (the code at argv[0]) and the request's files under /work, creating
/// their parent directories. The request was validated: paths are relative and normal.
fn place_files(vfs: &mut Vfs, request: &AgentRequest) -> Result<(), Errno> {
    let script = (request.script(), request.code.as_bytes());
    for (path, contents) in std::iter::once(script).chain(
        request
            .files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_slice())),
    ) {
        write_work_file(vfs, path, contents, false)?;
    }
    Ok(())
}

/// Writes `contents` as the file `path` under /work (a path `agent::check_work_path`
/// accepts), creating its parent directories; an existing file is replaced when `replace`,
/// else EEXIST.
pub(crate) fn write_work_file(
    vfs: &mut Vfs,
    path: &str,
    contents: &[u8],
    replace: bool,
) -> Result<(), Errno> {
    let work = vfs.resolve(vfs.root(), WORK_DIR.as_bytes(), true)?;
    for (slash, _) in path.match_indices('/') {
        match vfs.mkdir(&NoProcess, work, &path.as_bytes()[..slash], DIR_MODE) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
    }
    let options = OpenOptions {
        write: true,
        create: true,
        exclusive: !replace,
        truncate: replace,
        nofollow: true,
        mode: FILE_MODE,
        ..OpenOptions::default()
    };
    let node = vfs.open(work, path.as_bytes(), &options)?;
    let written = vfs.write_at(node, 0, contents);
    vfs.close(node);
    written.map(|_| ())
}
