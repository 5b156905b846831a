//! The shape of the synthetic, read-only /proc: which names exist, what kind each is, and
//! where its symlinks point. Nothing here reads the host; the VMM makes every answer from the
//! guest's own state. What the files hold is rendered by the syscall layer when one is opened
//! (`syscalls::procfs`), as Linux renders a /proc file when it is read.
//!
//! Every live process of the sandbox's tree has a directory /proc/<pid>; /proc/self and
//! /proc/thread-self point into the caller's. The parts that change as the programs run (the
//! live pids, each one's open fds, threads, working directory and program) come from a
//! [`ProcessView`] the caller hands to the lookup.

use super::path::MagicTarget;
use super::vfs::Node;
use super::FileKind;

/// Pids /proc names: a node's code keeps a pid in 24 bits (a larger one has no directory).
const MAX_PID: u32 = (1 << 24) - 1;

/// Files that exist once for the process and once per thread under task/<tid>.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskFile {
    Status,
    Stat,
    Statm,
    Maps,
    Cmdline,
    Environ,
    Limits,
    Comm,
}

impl TaskFile {
    const ALL: [TaskFile; 8] = [
        TaskFile::Cmdline,
        TaskFile::Comm,
        TaskFile::Environ,
        TaskFile::Limits,
        TaskFile::Maps,
        TaskFile::Stat,
        TaskFile::Statm,
        TaskFile::Status,
    ];

    fn name(self) -> &'static [u8] {
        match self {
            TaskFile::Status => b"status",
            TaskFile::Stat => b"stat",
            TaskFile::Statm => b"statm",
            TaskFile::Maps => b"maps",
            TaskFile::Cmdline => b"cmdline",
            TaskFile::Environ => b"environ",
            TaskFile::Limits => b"limits",
            TaskFile::Comm => b"comm",
        }
    }
}

/// Files of the whole (virtual) machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SystemFile {
    Cpuinfo,
    Meminfo,
    Uptime,
    Loadavg,
    Version,
    Stat,
    /// /proc/sys/kernel/...
    OsType,
    OsRelease,
    Hostname,
    PidMax,
    NgroupsMax,
    /// /proc/sys/vm/overcommit_memory
    Overcommit,
}

/// A directory of /proc with fixed contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SystemDir {
    Root,
    Sys,
    SysKernel,
    SysVm,
}

const ROOT_FILES: [(&[u8], SystemFile); 6] = [
    (b"cpuinfo", SystemFile::Cpuinfo),
    (b"loadavg", SystemFile::Loadavg),
    (b"meminfo", SystemFile::Meminfo),
    (b"stat", SystemFile::Stat),
    (b"uptime", SystemFile::Uptime),
    (b"version", SystemFile::Version),
];
const KERNEL_FILES: [(&[u8], SystemFile); 5] = [
    (b"hostname", SystemFile::Hostname),
    (b"ngroups_max", SystemFile::NgroupsMax),
    (b"osrelease", SystemFile::OsRelease),
    (b"ostype", SystemFile::OsType),
    (b"pid_max", SystemFile::PidMax),
];
const VM_FILES: [(&[u8], SystemFile); 1] = [(b"overcommit_memory", SystemFile::Overcommit)];

/// A node of /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcNode {
    Dir(SystemDir),
    File(SystemFile),
    /// /proc/self -> "<calling pid>".
    SelfLink,
    /// /proc/thread-self -> "<calling pid>/task/<calling tid>".
    ThreadSelfLink,
    /// /proc/<pid>.
    Process(u32),
    /// /proc/<pid>/task.
    Tasks(u32),
    /// /proc/<pid>/task/<tid>.
    Thread(u32, u32),
    /// A task file of process `pid`: of the process (None) or of one thread.
    Task(u32, Option<u32>, TaskFile),
    /// /proc/<pid>/exe and /proc/<pid>/cwd.
    Exe(u32),
    Cwd(u32),
    /// /proc/<pid>/fd and its entries.
    Fds(u32),
    Fd(u32, u32),
}

/// Where an fd entry points.
pub enum FdTarget {
    /// A file or directory of the file system (followed as itself, even once unlinked).
    Node(Node),
    /// Something with no path ("pipe:[3]", "socket:[5]", "anon_inode:[eventfd]").
    Anonymous(Vec<u8>),
}

/// The parts of /proc that follow the running programs: the calling process and thread, the
/// live processes, and each one's threads, fds, working directory and program (asked of a
/// pid that is not live: none).
pub trait ProcessView {
    /// The process making the call (self).
    fn current_pid(&self) -> u32;
    /// The thread making the call (thread-self).
    fn current_tid(&self) -> u32;
    /// The live processes, ascending.
    fn pids(&self) -> Vec<u32>;
    fn tids(&self, pid: u32) -> Vec<u32>;
    fn fds(&self, pid: u32) -> Vec<u32>;
    fn fd_target(&self, pid: u32, fd: u32) -> Option<FdTarget>;
    fn cwd(&self, pid: u32) -> Option<Node>;
    /// The program's path in the image.
    fn exe(&self, pid: u32) -> Vec<u8>;
    /// The pseudo-terminals in use (/dev/pts lists their slaves).
    fn terminals(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// The view of no program (host-side lookups such as the daemon's): /proc holds process 1
/// with no thread, fd or program.
pub struct NoProcess;

impl ProcessView for NoProcess {
    fn current_pid(&self) -> u32 {
        1
    }
    fn current_tid(&self) -> u32 {
        1
    }
    fn pids(&self) -> Vec<u32> {
        vec![1]
    }
    fn tids(&self, _pid: u32) -> Vec<u32> {
        Vec::new()
    }
    fn fds(&self, _pid: u32) -> Vec<u32> {
        Vec::new()
    }
    fn fd_target(&self, _pid: u32, _fd: u32) -> Option<FdTarget> {
        None
    }
    fn cwd(&self, pid: u32) -> Option<Node> {
        (pid == 1).then_some(Node::ROOT)
    }
    fn exe(&self, _pid: u32) -> Vec<u8> {
        Vec::new()
    }
}

/// A decimal name without leading zeros ("0" itself allowed), as /proc spells numbers.
fn number(name: &[u8]) -> Option<u32> {
    if name.is_empty()
        || name.len() > 10
        || (name.len() > 1 && name[0] == b'0')
        || !name.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    std::str::from_utf8(name).ok()?.parse().ok()
}

fn task_file(pid: u32, tid: Option<u32>, name: &[u8]) -> Option<ProcNode> {
    TaskFile::ALL
        .into_iter()
        .find(|f| f.name() == name)
        .map(|f| ProcNode::Task(pid, tid, f))
}

impl ProcNode {
    pub fn kind(self) -> FileKind {
        match self {
            ProcNode::Dir(_)
            | ProcNode::Process(_)
            | ProcNode::Tasks(_)
            | ProcNode::Thread(..)
            | ProcNode::Fds(_) => FileKind::Directory,
            ProcNode::SelfLink
            | ProcNode::ThreadSelfLink
            | ProcNode::Exe(_)
            | ProcNode::Cwd(_)
            | ProcNode::Fd(..) => FileKind::Symlink,
            ProcNode::File(_) | ProcNode::Task(..) => FileKind::Regular,
        }
    }

    /// Whether the node belongs to the process (owned by the guest's user, as on Linux)
    /// rather than to the machine (root's).
    pub fn of_process(self) -> bool {
        !matches!(
            self,
            ProcNode::Dir(_) | ProcNode::File(_) | ProcNode::SelfLink | ProcNode::ThreadSelfLink
        )
    }

    /// The parent directory (None: /proc itself, whose parent is the image's root).
    pub fn parent(self) -> Option<ProcNode> {
        Some(match self {
            ProcNode::Dir(SystemDir::Root) => return None,
            ProcNode::Dir(SystemDir::Sys)
            | ProcNode::SelfLink
            | ProcNode::ThreadSelfLink
            | ProcNode::Process(_) => ProcNode::Dir(SystemDir::Root),
            ProcNode::Dir(SystemDir::SysKernel | SystemDir::SysVm) => ProcNode::Dir(SystemDir::Sys),
            ProcNode::File(f) => ProcNode::Dir(match f {
                SystemFile::OsType
                | SystemFile::OsRelease
                | SystemFile::Hostname
                | SystemFile::PidMax
                | SystemFile::NgroupsMax => SystemDir::SysKernel,
                SystemFile::Overcommit => SystemDir::SysVm,
                _ => SystemDir::Root,
            }),
            ProcNode::Tasks(pid)
            | ProcNode::Exe(pid)
            | ProcNode::Cwd(pid)
            | ProcNode::Fds(pid)
            | ProcNode::Task(pid, None, _) => ProcNode::Process(pid),
            ProcNode::Thread(pid, _) => ProcNode::Tasks(pid),
            ProcNode::Task(pid, Some(tid), _) => ProcNode::Thread(pid, tid),
            ProcNode::Fd(pid, _) => ProcNode::Fds(pid),
        })
    }

    /// The name of a numbered entry (a process, thread or fd directory entry), which no
    /// fixed table lists.
    pub fn number_name(self) -> Option<Vec<u8>> {
        match self {
            ProcNode::Process(n) | ProcNode::Thread(_, n) | ProcNode::Fd(_, n) => {
                Some(n.to_string().into_bytes())
            }
            _ => None,
        }
    }

    /// The entry `name` of directory `self` (None: no such entry; the caller checked that
    /// `self` is a directory).
    pub fn child(self, view: &dyn ProcessView, name: &[u8]) -> Option<ProcNode> {
        let listed = |files: &[(&[u8], SystemFile)]| {
            files
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, f)| ProcNode::File(f))
        };
        match self {
            ProcNode::Dir(SystemDir::Root) => match name {
                b"self" => Some(ProcNode::SelfLink),
                b"thread-self" => Some(ProcNode::ThreadSelfLink),
                b"sys" => Some(ProcNode::Dir(SystemDir::Sys)),
                _ => match number(name) {
                    Some(pid) if pid <= MAX_PID && view.pids().contains(&pid) => {
                        Some(ProcNode::Process(pid))
                    }
                    Some(_) => None,
                    None => listed(&ROOT_FILES),
                },
            },
            ProcNode::Dir(SystemDir::Sys) => match name {
                b"kernel" => Some(ProcNode::Dir(SystemDir::SysKernel)),
                b"vm" => Some(ProcNode::Dir(SystemDir::SysVm)),
                _ => None,
            },
            ProcNode::Dir(SystemDir::SysKernel) => listed(&KERNEL_FILES),
            ProcNode::Dir(SystemDir::SysVm) => listed(&VM_FILES),
            ProcNode::Process(pid) => match name {
                b"task" => Some(ProcNode::Tasks(pid)),
                b"exe" => Some(ProcNode::Exe(pid)),
                b"cwd" => Some(ProcNode::Cwd(pid)),
                b"fd" => Some(ProcNode::Fds(pid)),
                _ => task_file(pid, None, name),
            },
            ProcNode::Tasks(pid) => number(name)
                .filter(|tid| view.tids(pid).contains(tid))
                .map(|tid| ProcNode::Thread(pid, tid)),
            ProcNode::Thread(pid, tid) => task_file(pid, Some(tid), name),
            ProcNode::Fds(pid) => number(name)
                .filter(|&fd| view.fd_target(pid, fd).is_some())
                .map(|fd| ProcNode::Fd(pid, fd)),
            _ => None,
        }
    }

    /// The entries of directory `self`, sorted as Linux lists them (files by name, numbers
    /// ascending).
    pub fn entries(self, view: &dyn ProcessView) -> Vec<(Vec<u8>, ProcNode)> {
        let listed = |files: &[(&[u8], SystemFile)]| {
            files
                .iter()
                .map(|&(n, f)| (n.to_vec(), ProcNode::File(f)))
                .collect::<Vec<_>>()
        };
        let tasks = |pid: u32, tid: Option<u32>| {
            TaskFile::ALL
                .into_iter()
                .map(|f| (f.name().to_vec(), ProcNode::Task(pid, tid, f)))
                .collect::<Vec<_>>()
        };
        match self {
            ProcNode::Dir(SystemDir::Root) => {
                let mut out = listed(&ROOT_FILES);
                out.extend([
                    (b"self".to_vec(), ProcNode::SelfLink),
                    (b"sys".to_vec(), ProcNode::Dir(SystemDir::Sys)),
                    (b"thread-self".to_vec(), ProcNode::ThreadSelfLink),
                ]);
                out.sort_by(|a, b| a.0.cmp(&b.0));
                let pids = view.pids().into_iter().filter(|&pid| pid <= MAX_PID);
                pids.map(|pid| (pid.to_string().into_bytes(), ProcNode::Process(pid)))
                    .chain(out)
                    .collect()
            }
            ProcNode::Dir(SystemDir::Sys) => vec![
                (b"kernel".to_vec(), ProcNode::Dir(SystemDir::SysKernel)),
                (b"vm".to_vec(), ProcNode::Dir(SystemDir::SysVm)),
            ],
            ProcNode::Dir(SystemDir::SysKernel) => listed(&KERNEL_FILES),
            ProcNode::Dir(SystemDir::SysVm) => listed(&VM_FILES),
            ProcNode::Process(pid) => {
                let mut out = tasks(pid, None);
                out.extend([
                    (b"cwd".to_vec(), ProcNode::Cwd(pid)),
                    (b"exe".to_vec(), ProcNode::Exe(pid)),
                    (b"fd".to_vec(), ProcNode::Fds(pid)),
                    (b"task".to_vec(), ProcNode::Tasks(pid)),
                ]);
                out.sort_by(|a, b| a.0.cmp(&b.0));
                out
            }
            ProcNode::Tasks(pid) => view
                .tids(pid)
                .into_iter()
                .map(|tid| (tid.to_string().into_bytes(), ProcNode::Thread(pid, tid)))
                .collect(),
            ProcNode::Thread(pid, tid) => tasks(pid, Some(tid)),
            ProcNode::Fds(pid) => view
                .fds(pid)
                .into_iter()
                .map(|fd| (fd.to_string().into_bytes(), ProcNode::Fd(pid, fd)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// What readlink shows for a symlink node (None: not a link, or an fd no longer open).
    pub fn link_text(
        self,
        view: &dyn ProcessView,
        path_of: impl Fn(Node) -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        match self {
            ProcNode::SelfLink => Some(view.current_pid().to_string().into_bytes()),
            ProcNode::ThreadSelfLink => {
                Some(format!("{}/task/{}", view.current_pid(), view.current_tid()).into_bytes())
            }
            ProcNode::Exe(pid) => Some(view.exe(pid)).filter(|exe| !exe.is_empty()),
            ProcNode::Cwd(pid) => path_of(view.cwd(pid)?),
            ProcNode::Fd(pid, fd) => match view.fd_target(pid, fd)? {
                FdTarget::Node(node) => path_of(node),
                FdTarget::Anonymous(text) => Some(text),
            },
            _ => None,
        }
    }

    /// A "magic" link (exe, cwd, an fd) is followed to the node itself, not by its path text,
    /// so an unlinked file stays reachable, as on Linux; an fd of something with no path (a
    /// pipe, a socket) leads to the link itself. None: an ordinary link.
    pub(crate) fn magic_target(self, view: &dyn ProcessView) -> Option<MagicTarget<Node>> {
        match self {
            ProcNode::Cwd(pid) => view.cwd(pid).map(MagicTarget::Node),
            ProcNode::Fd(pid, fd) => Some(match view.fd_target(pid, fd)? {
                FdTarget::Node(node) => MagicTarget::Node(node),
                FdTarget::Anonymous(_) => MagicTarget::TheLink,
            }),
            _ => None,
        }
    }

    /// A number unique to the node: its inode number within /proc and its snapshot code
    /// (kind in bits 56-63, pid in 32-55, the rest below).
    pub fn code(self) -> u64 {
        let (kind, pid, arg): (u64, u32, u64) = match self {
            ProcNode::Dir(d) => (0, 0, d as u64),
            ProcNode::File(f) => (1, 0, f as u64),
            ProcNode::SelfLink => (2, 0, 0),
            ProcNode::ThreadSelfLink => (3, 0, 0),
            ProcNode::Process(pid) => (4, pid, 0),
            ProcNode::Tasks(pid) => (5, pid, 0),
            ProcNode::Thread(pid, tid) => (6, pid, tid.into()),
            ProcNode::Task(pid, None, f) => (7, pid, f as u64),
            ProcNode::Task(pid, Some(tid), f) => (8 + f as u64, pid, tid.into()),
            ProcNode::Exe(pid) => (16, pid, 0),
            ProcNode::Cwd(pid) => (17, pid, 0),
            ProcNode::Fds(pid) => (18, pid, 0),
            ProcNode::Fd(pid, fd) => (19, pid, fd.into()),
        };
        kind << 56 | u64::from(pid & MAX_PID) << 32 | arg
    }

    /// The node `code` numbers (None for a number no node has).
    pub fn from_code(code: u64) -> Option<ProcNode> {
        const DIRS: [SystemDir; 4] = [
            SystemDir::Root,
            SystemDir::Sys,
            SystemDir::SysKernel,
            SystemDir::SysVm,
        ];
        const FILES: [SystemFile; 12] = [
            SystemFile::Cpuinfo,
            SystemFile::Meminfo,
            SystemFile::Uptime,
            SystemFile::Loadavg,
            SystemFile::Version,
            SystemFile::Stat,
            SystemFile::OsType,
            SystemFile::OsRelease,
            SystemFile::Hostname,
            SystemFile::PidMax,
            SystemFile::NgroupsMax,
            SystemFile::Overcommit,
        ];
        let task = |i: u64| TaskFile::ALL.into_iter().find(|&f| f as u64 == i);
        let (kind, pid, arg) = (
            code >> 56,
            ((code >> 32) as u32) & MAX_PID,
            code & 0xffff_ffff,
        );
        let node = match kind {
            0 => ProcNode::Dir(*DIRS.get(arg as usize)?),
            1 => ProcNode::File(*FILES.get(arg as usize)?),
            2 => ProcNode::SelfLink,
            3 => ProcNode::ThreadSelfLink,
            4 => ProcNode::Process(pid),
            5 => ProcNode::Tasks(pid),
            6 => ProcNode::Thread(pid, arg as u32),
            7 => ProcNode::Task(pid, None, task(arg)?),
            8..=15 => ProcNode::Task(pid, Some(arg as u32), task(kind - 8)?),
            16 => ProcNode::Exe(pid),
            17 => ProcNode::Cwd(pid),
            18 => ProcNode::Fds(pid),
            19 => ProcNode::Fd(pid, arg as u32),
            _ => return None,
        };
        (node.code() == code).then_some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Process 1 with threads 1 and 2 (the caller) and fds 0 and 3; process 5 with thread 5
    /// and fd 0.
    struct TwoProcesses;

    impl ProcessView for TwoProcesses {
        fn current_pid(&self) -> u32 {
            1
        }
        fn current_tid(&self) -> u32 {
            2
        }
        fn pids(&self) -> Vec<u32> {
            vec![1, 5]
        }
        fn tids(&self, pid: u32) -> Vec<u32> {
            match pid {
                1 => vec![1, 2],
                5 => vec![5],
                _ => Vec::new(),
            }
        }
        fn fds(&self, pid: u32) -> Vec<u32> {
            match pid {
                1 => vec![0, 3],
                5 => vec![0],
                _ => Vec::new(),
            }
        }
        fn fd_target(&self, pid: u32, fd: u32) -> Option<FdTarget> {
            match (pid, fd) {
                (1 | 5, 0) => Some(FdTarget::Anonymous(b"pipe:[1]".to_vec())),
                (1, 3) => Some(FdTarget::Node(Node::ROOT)),
                _ => None,
            }
        }
        fn cwd(&self, pid: u32) -> Option<Node> {
            self.pids().contains(&pid).then_some(Node::ROOT)
        }
        fn exe(&self, _pid: u32) -> Vec<u8> {
            b"/usr/bin/prog".to_vec()
        }
    }

    #[test]
    fn names_kinds_and_links() {
        let v = TwoProcesses;
        let root = ProcNode::Dir(SystemDir::Root);
        let pid = root.child(&v, b"1").unwrap();
        assert_eq!(pid, ProcNode::Process(1));
        assert_eq!(root.child(&v, b"2"), None, "a thread, not a process");
        assert_eq!(root.child(&v, b"5"), Some(ProcNode::Process(5)));
        assert_eq!(
            pid.child(&v, b"fd").unwrap().child(&v, b"3"),
            Some(ProcNode::Fd(1, 3))
        );
        assert_eq!(
            ProcNode::Fds(5).child(&v, b"3"),
            None,
            "another process's fds"
        );
        assert_eq!(ProcNode::Fds(1).child(&v, b"4"), None, "not open");
        assert_eq!(ProcNode::Fds(1).child(&v, b"03"), None);
        assert_eq!(
            ProcNode::Tasks(1).child(&v, b"2"),
            Some(ProcNode::Thread(1, 2))
        );
        assert_eq!(ProcNode::Tasks(5).child(&v, b"2"), None);
        assert_eq!(ProcNode::Tasks(1).child(&v, b"9"), None);
        assert_eq!(
            ProcNode::Thread(1, 2).child(&v, b"status"),
            Some(ProcNode::Task(1, Some(2), TaskFile::Status))
        );
        assert_eq!(
            ProcNode::SelfLink.link_text(&v, |_| None),
            Some(b"1".to_vec())
        );
        assert_eq!(root.child(&v, b"mem"), None);
        assert_eq!(
            pid.child(&v, b"mem"),
            None,
            "no access to memory through a file"
        );
        let path = |_n: Node| Some(b"/".to_vec());
        assert_eq!(
            ProcNode::ThreadSelfLink.link_text(&v, path),
            Some(b"1/task/2".to_vec())
        );
        assert_eq!(
            ProcNode::Fd(1, 0).link_text(&v, path),
            Some(b"pipe:[1]".to_vec())
        );
        assert_eq!(
            ProcNode::Fd(1, 3).magic_target(&v),
            Some(MagicTarget::Node(Node::ROOT))
        );
        assert_eq!(
            ProcNode::Fd(1, 0).magic_target(&v),
            Some(MagicTarget::TheLink)
        );
        assert_eq!(ProcNode::Cwd(9).magic_target(&v), None, "no such process");
        let names: Vec<Vec<u8>> = root.entries(&v).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[..2], [b"1".to_vec(), b"5".to_vec()]);
        assert!(names.contains(&b"self".to_vec()) && names.contains(&b"meminfo".to_vec()));
        for (name, node) in root
            .entries(&v)
            .into_iter()
            .chain(pid.entries(&v))
            .chain(ProcNode::Thread(1, 2).entries(&v))
        {
            assert_eq!(
                node.parent().unwrap().child(&v, &name),
                Some(node),
                "{}",
                String::from_utf8_lossy(&name)
            );
        }
    }

    #[test]
    fn codes_round_trip_and_reject_unknown_numbers() {
        let v = TwoProcesses;
        let mut all = vec![ProcNode::Dir(SystemDir::Root)];
        let mut i = 0;
        while i < all.len() {
            let node = all[i];
            if node.kind() == FileKind::Directory {
                all.extend(node.entries(&v).into_iter().map(|(_, n)| n));
            }
            i += 1;
        }
        assert!(all.len() > 30);
        let mut codes = std::collections::HashSet::new();
        for node in all {
            assert_eq!(ProcNode::from_code(node.code()), Some(node));
            assert!(codes.insert(node.code()), "{node:?}");
        }
        for bad in [1 << 56 | 99, 7 << 56 | 99, 20 << 56, u64::MAX] {
            assert_eq!(ProcNode::from_code(bad), None);
        }
    }
}
