//! The shape of the synthetic, read-only /proc: which names exist, what kind each is, and
//! where its symlinks point. Nothing here reads the host; the VMM makes every answer from the
//! guest's own state. What the files hold is rendered by the syscall layer when one is opened
//! (`syscalls::procfs`), as Linux renders a /proc file when it is read.
//!
//! The guest is process 1 (see syscalls/ids.rs), so /proc/1 is the one process directory;
//! /proc/self and /proc/thread-self point into it. The parts that change as the program runs
//! (its open fds and threads) come from a [`ProcessView`] the caller hands to the lookup.

use super::vfs::Node;
use super::FileKind;

/// The guest's pid as a /proc name.
const PID: u32 = 1;
const PID_NAME: &[u8] = b"1";

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
    /// /proc/self -> "1".
    SelfLink,
    /// /proc/thread-self -> "1/task/<calling tid>".
    ThreadSelfLink,
    /// /proc/1.
    Process,
    /// /proc/1/task.
    Tasks,
    /// /proc/1/task/<tid>.
    Thread(u32),
    /// A task file: of the process (None) or of one thread.
    Task(Option<u32>, TaskFile),
    /// /proc/1/exe and /proc/1/cwd.
    Exe,
    Cwd,
    /// /proc/1/fd and its entries.
    Fds,
    Fd(u32),
}

/// Where an fd entry points.
pub enum FdTarget {
    /// A file or directory of the file system (followed as itself, even once unlinked).
    Node(Node),
    /// Something with no path ("pipe:[3]", "socket:[5]", "anon_inode:[eventfd]").
    Anonymous(Vec<u8>),
}

/// The parts of /proc that follow the running program.
pub trait ProcessView {
    /// The thread making the call (thread-self).
    fn current_tid(&self) -> u32;
    fn tids(&self) -> Vec<u32>;
    fn fds(&self) -> Vec<u32>;
    fn fd_target(&self, fd: u32) -> Option<FdTarget>;
    fn cwd(&self) -> Node;
    /// The program's path in the image.
    fn exe(&self) -> Vec<u8>;
}

/// The view of no process (host-side lookups such as the daemon's): /proc holds no thread,
/// fd or program.
pub struct NoProcess;

impl ProcessView for NoProcess {
    fn current_tid(&self) -> u32 {
        PID
    }
    fn tids(&self) -> Vec<u32> {
        Vec::new()
    }
    fn fds(&self) -> Vec<u32> {
        Vec::new()
    }
    fn fd_target(&self, _fd: u32) -> Option<FdTarget> {
        None
    }
    fn cwd(&self) -> Node {
        Node::ROOT
    }
    fn exe(&self) -> Vec<u8> {
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

fn task_file(tid: Option<u32>, name: &[u8]) -> Option<ProcNode> {
    TaskFile::ALL
        .into_iter()
        .find(|f| f.name() == name)
        .map(|f| ProcNode::Task(tid, f))
}

impl ProcNode {
    pub fn kind(self) -> FileKind {
        match self {
            ProcNode::Dir(_)
            | ProcNode::Process
            | ProcNode::Tasks
            | ProcNode::Thread(_)
            | ProcNode::Fds => FileKind::Directory,
            ProcNode::SelfLink
            | ProcNode::ThreadSelfLink
            | ProcNode::Exe
            | ProcNode::Cwd
            | ProcNode::Fd(_) => FileKind::Symlink,
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
            | ProcNode::Process => ProcNode::Dir(SystemDir::Root),
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
            ProcNode::Tasks
            | ProcNode::Exe
            | ProcNode::Cwd
            | ProcNode::Fds
            | ProcNode::Task(None, _) => ProcNode::Process,
            ProcNode::Thread(_) => ProcNode::Tasks,
            ProcNode::Task(Some(tid), _) => ProcNode::Thread(tid),
            ProcNode::Fd(_) => ProcNode::Fds,
        })
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
                PID_NAME => Some(ProcNode::Process),
                _ => listed(&ROOT_FILES),
            },
            ProcNode::Dir(SystemDir::Sys) => match name {
                b"kernel" => Some(ProcNode::Dir(SystemDir::SysKernel)),
                b"vm" => Some(ProcNode::Dir(SystemDir::SysVm)),
                _ => None,
            },
            ProcNode::Dir(SystemDir::SysKernel) => listed(&KERNEL_FILES),
            ProcNode::Dir(SystemDir::SysVm) => listed(&VM_FILES),
            ProcNode::Process => match name {
                b"task" => Some(ProcNode::Tasks),
                b"exe" => Some(ProcNode::Exe),
                b"cwd" => Some(ProcNode::Cwd),
                b"fd" => Some(ProcNode::Fds),
                _ => task_file(None, name),
            },
            ProcNode::Tasks => number(name)
                .filter(|tid| view.tids().contains(tid))
                .map(ProcNode::Thread),
            ProcNode::Thread(tid) => task_file(Some(tid), name),
            ProcNode::Fds => number(name)
                .filter(|&fd| view.fd_target(fd).is_some())
                .map(ProcNode::Fd),
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
        let tasks = |tid: Option<u32>| {
            TaskFile::ALL
                .into_iter()
                .map(|f| (f.name().to_vec(), ProcNode::Task(tid, f)))
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
                out.insert(0, (PID_NAME.to_vec(), ProcNode::Process));
                out
            }
            ProcNode::Dir(SystemDir::Sys) => vec![
                (b"kernel".to_vec(), ProcNode::Dir(SystemDir::SysKernel)),
                (b"vm".to_vec(), ProcNode::Dir(SystemDir::SysVm)),
            ],
            ProcNode::Dir(SystemDir::SysKernel) => listed(&KERNEL_FILES),
            ProcNode::Dir(SystemDir::SysVm) => listed(&VM_FILES),
            ProcNode::Process => {
                let mut out = tasks(None);
                out.extend([
                    (b"cwd".to_vec(), ProcNode::Cwd),
                    (b"exe".to_vec(), ProcNode::Exe),
                    (b"fd".to_vec(), ProcNode::Fds),
                    (b"task".to_vec(), ProcNode::Tasks),
                ]);
                out.sort_by(|a, b| a.0.cmp(&b.0));
                out
            }
            ProcNode::Tasks => view
                .tids()
                .into_iter()
                .map(|tid| (tid.to_string().into_bytes(), ProcNode::Thread(tid)))
                .collect(),
            ProcNode::Thread(tid) => tasks(Some(tid)),
            ProcNode::Fds => view
                .fds()
                .into_iter()
                .map(|fd| (fd.to_string().into_bytes(), ProcNode::Fd(fd)))
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
            ProcNode::SelfLink => Some(PID_NAME.to_vec()),
            ProcNode::ThreadSelfLink => {
                Some(format!("{PID}/task/{}", view.current_tid()).into_bytes())
            }
            ProcNode::Exe => Some(view.exe()).filter(|exe| !exe.is_empty()),
            ProcNode::Cwd => path_of(view.cwd()),
            ProcNode::Fd(fd) => match view.fd_target(fd)? {
                FdTarget::Node(node) => path_of(node),
                FdTarget::Anonymous(text) => Some(text),
            },
            _ => None,
        }
    }

    /// A "magic" link (exe, cwd, an fd) is followed to the node itself, not by its path text,
    /// so an unlinked file stays reachable, as on Linux. None: an ordinary link (or one whose
    /// target has no node: a pipe's fd).
    pub fn magic_target(self, view: &dyn ProcessView) -> Option<Node> {
        match self {
            ProcNode::Cwd => Some(view.cwd()),
            ProcNode::Fd(fd) => match view.fd_target(fd)? {
                FdTarget::Node(node) => Some(node),
                FdTarget::Anonymous(_) => None,
            },
            _ => None,
        }
    }

    /// A small number unique to the node: its inode number within /proc and its snapshot code.
    pub fn code(self) -> u64 {
        let (kind, arg): (u64, u64) = match self {
            ProcNode::Dir(d) => (0, d as u64),
            ProcNode::File(f) => (1, f as u64),
            ProcNode::SelfLink => (2, 0),
            ProcNode::ThreadSelfLink => (3, 0),
            ProcNode::Process => (4, 0),
            ProcNode::Tasks => (5, 0),
            ProcNode::Thread(tid) => (6, tid.into()),
            ProcNode::Task(None, f) => (7, f as u64),
            ProcNode::Task(Some(tid), f) => (8 + f as u64, tid.into()),
            ProcNode::Exe => (16, 0),
            ProcNode::Cwd => (17, 0),
            ProcNode::Fds => (18, 0),
            ProcNode::Fd(fd) => (19, fd.into()),
        };
        kind << 32 | arg
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
        let (kind, arg) = (code >> 32, code & 0xffff_ffff);
        let node = match kind {
            0 => ProcNode::Dir(*DIRS.get(arg as usize)?),
            1 => ProcNode::File(*FILES.get(arg as usize)?),
            2 => ProcNode::SelfLink,
            3 => ProcNode::ThreadSelfLink,
            4 => ProcNode::Process,
            5 => ProcNode::Tasks,
            6 => ProcNode::Thread(arg as u32),
            7 => ProcNode::Task(None, task(arg)?),
            8..=15 => ProcNode::Task(Some(arg as u32), task(kind - 8)?),
            16 => ProcNode::Exe,
            17 => ProcNode::Cwd,
            18 => ProcNode::Fds,
            19 => ProcNode::Fd(arg as u32),
            _ => return None,
        };
        (node.code() == code).then_some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TwoThreads;

    impl ProcessView for TwoThreads {
        fn current_tid(&self) -> u32 {
            2
        }
        fn tids(&self) -> Vec<u32> {
            vec![1, 2]
        }
        fn fds(&self) -> Vec<u32> {
            vec![0, 3]
        }
        fn fd_target(&self, fd: u32) -> Option<FdTarget> {
            match fd {
                0 => Some(FdTarget::Anonymous(b"pipe:[1]".to_vec())),
                3 => Some(FdTarget::Node(Node::ROOT)),
                _ => None,
            }
        }
        fn cwd(&self) -> Node {
            Node::ROOT
        }
        fn exe(&self) -> Vec<u8> {
            b"/usr/bin/prog".to_vec()
        }
    }

    #[test]
    fn names_kinds_and_links() {
        let v = TwoThreads;
        let root = ProcNode::Dir(SystemDir::Root);
        let pid = root.child(&v, b"1").unwrap();
        assert_eq!(pid, ProcNode::Process);
        assert_eq!(root.child(&v, b"2"), None, "only the one process");
        assert_eq!(
            pid.child(&v, b"fd").unwrap().child(&v, b"3"),
            Some(ProcNode::Fd(3))
        );
        assert_eq!(ProcNode::Fds.child(&v, b"4"), None, "not open");
        assert_eq!(ProcNode::Fds.child(&v, b"03"), None);
        assert_eq!(ProcNode::Tasks.child(&v, b"2"), Some(ProcNode::Thread(2)));
        assert_eq!(ProcNode::Tasks.child(&v, b"9"), None);
        assert_eq!(
            ProcNode::Thread(2).child(&v, b"status"),
            Some(ProcNode::Task(Some(2), TaskFile::Status))
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
            ProcNode::Fd(0).link_text(&v, path),
            Some(b"pipe:[1]".to_vec())
        );
        assert_eq!(ProcNode::Fd(3).magic_target(&v), Some(Node::ROOT));
        assert_eq!(ProcNode::Fd(0).magic_target(&v), None);
        let names: Vec<Vec<u8>> = root.entries(&v).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], b"1");
        assert!(names.contains(&b"self".to_vec()) && names.contains(&b"meminfo".to_vec()));
        for (name, node) in root
            .entries(&v)
            .into_iter()
            .chain(pid.entries(&v))
            .chain(ProcNode::Thread(2).entries(&v))
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
        let v = TwoThreads;
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
        for bad in [1 << 32 | 99, 7 << 32 | 99, 20 << 32, u64::MAX] {
            assert_eq!(ProcNode::from_code(bad), None);
        }
    }
}
