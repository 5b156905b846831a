//! `sandfork-vmm bench density`, and the idle-VM memory figures of `bench exec`: many idle VMs
//! of one template alive at once in this process, each a fresh fork as a template's pool holds
//! it (copy-on-write memory, a restored vCPU, the memory its template reaches mapped). Printed:
//! the time to create them (in all, and per VM p50/p99), what each holds (this process's RSS;
//! the memory charged to its cgroup, and the kernel's share of that where cgroup v1 tells it;
//! the host's MemAvailable), the file descriptors and mappings each takes, and where the memory
//! went: the host's /proc/meminfo fields and slab caches before and after (host-wide, so other
//! processes move them too; exact only on a quiet host).
//!
//! The cgroup figure is exact when the benchmark runs in a memory cgroup of its own (a fresh
//! child cgroup, or `systemd-run --scope`); without a memory controller it is absent.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::templates::load_folder;
use crate::bench::Latency;
use crate::kvm::{self, capacity};
use crate::snapshot::{ForkMemory, Template};

pub const DEFAULT_VMS: usize = 10_000;
/// Open files beyond the VMs' own: the template, the image, stdio, the bench's reads of /proc.
const OTHER_FDS: u64 = 256;
/// /proc/meminfo fields that show where a VM's memory is.
const MEMINFO_PARTS: [&str; 8] = [
    "AnonPages",
    "PageTables",
    "SecPageTables",
    "KernelStack",
    "VmallocUsed",
    "Percpu",
    "SUnreclaim",
    "SReclaimable",
];
/// A slab cache is listed when it grew by at least this much per VM.
const SLAB_SHOWN_BYTES: f64 = 256.0;

/// What this process and the host hold at one moment.
struct MemorySample {
    rss_kib: u64,
    available_kib: u64,
    /// This process's memory cgroup: all it is charged, and the kernel's share (cgroup v1).
    cgroup_bytes: Option<u64>,
    cgroup_kernel_bytes: Option<u64>,
    meminfo_kib: Vec<u64>,
    /// Bytes held in each slab cache (its slabs, not only its live objects).
    slab_bytes: HashMap<String, u64>,
    fds: u64,
    mappings: u64,
}

impl MemorySample {
    fn now() -> Result<MemorySample, String> {
        let meminfo = read("/proc/meminfo")?;
        let meminfo_kib = MEMINFO_PARTS
            .iter()
            .map(|field| kib_field(&meminfo, field))
            .collect::<Result<_, _>>()?;
        let cgroup = cgroup_dir();
        let cgroup_number = |v2: Option<&str>, v1: &str| {
            cgroup.as_ref().and_then(|(dir, is_v2)| {
                let file = if *is_v2 { v2? } else { v1 };
                std::fs::read_to_string(format!("{dir}/{file}"))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
        };
        Ok(MemorySample {
            rss_kib: kib_field(&read("/proc/self/status")?, "VmRSS")?,
            available_kib: kib_field(&meminfo, "MemAvailable")?,
            cgroup_bytes: cgroup_number(Some("memory.current"), "memory.usage_in_bytes"),
            cgroup_kernel_bytes: cgroup_number(None, "memory.kmem.usage_in_bytes"),
            meminfo_kib,
            // Readable only by root; without it the parts list has no slab caches.
            slab_bytes: std::fs::read_to_string("/proc/slabinfo")
                .map(|text| slab_bytes(&text))
                .unwrap_or_default(),
            fds: open_fds()?,
            mappings: mappings()?,
        })
    }
}

/// Per idle VM: the differences between two samples divided by the VMs alive.
#[derive(Debug, Clone, Default)]
pub struct PerVm {
    pub rss_kib: f64,
    pub host_kib: f64,
    pub cgroup_kib: Option<f64>,
    pub cgroup_kernel_kib: Option<f64>,
    /// (what, KiB): /proc/meminfo fields, then slab caches, largest first.
    pub parts: Vec<(String, f64)>,
    pub fds: f64,
    pub mappings: f64,
}

impl PerVm {
    fn between(before: &MemorySample, after: &MemorySample, count: usize) -> PerVm {
        let per_vm =
            |before: u64, after: u64| after as f64 / count as f64 - before as f64 / count as f64;
        let bytes_to_kib = |v: f64| v / 1024.0;
        let mut slabs: Vec<(String, f64)> = after
            .slab_bytes
            .iter()
            .map(|(name, &bytes)| {
                let was = before.slab_bytes.get(name).copied().unwrap_or(0);
                (format!("slab {name}"), per_vm(was, bytes))
            })
            .filter(|(_, bytes)| *bytes >= SLAB_SHOWN_BYTES)
            .map(|(name, bytes)| (name, bytes_to_kib(bytes)))
            .collect();
        slabs.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut parts: Vec<(String, f64)> = MEMINFO_PARTS
            .iter()
            .zip(before.meminfo_kib.iter().zip(&after.meminfo_kib))
            .map(|(name, (&b, &a))| ((*name).to_owned(), per_vm(b, a)))
            .collect();
        parts.extend(slabs);
        PerVm {
            rss_kib: per_vm(before.rss_kib, after.rss_kib),
            host_kib: per_vm(after.available_kib, before.available_kib),
            cgroup_kib: before
                .cgroup_bytes
                .zip(after.cgroup_bytes)
                .map(|(b, a)| bytes_to_kib(per_vm(b, a))),
            cgroup_kernel_kib: before
                .cgroup_kernel_bytes
                .zip(after.cgroup_kernel_bytes)
                .map(|(b, a)| bytes_to_kib(per_vm(b, a))),
            parts,
            fds: per_vm(before.fds, after.fds),
            mappings: per_vm(before.mappings, after.mappings),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "rss_kib": self.rss_kib,
            "host_memavailable_kib": self.host_kib,
            "cgroup_kib": self.cgroup_kib,
            "cgroup_kernel_kib": self.cgroup_kernel_kib,
            "parts_kib": Value::Object(self.parts.iter().map(|(n, v)| (n.clone(), json!(v))).collect()),
            "fds": self.fds,
            "mappings": self.mappings,
        })
    }
}

/// `count` idle VMs created and held at once.
#[derive(Debug, Clone)]
pub struct IdleVms {
    pub count: usize,
    /// From the first VM's start to the last one ready.
    pub create_total: Duration,
    /// One VM's creation (memory fork, vCPU restore, its memory mapped).
    pub create: Latency,
    pub per_vm: PerVm,
}

/// Creates `count` fresh forks of `snapshot` and keeps them alive together, each with the memory
/// its template reaches mapped as a pooled VM has it; measures, then destroys them.
pub fn idle_vms(snapshot: &Template, count: usize) -> Result<IdleVms, String> {
    if count == 0 {
        return Err("the number of VMs must be at least 1".to_owned());
    }
    make_room(count as u64)?;
    // VMs dropped earlier are destroyed on the reaper thread: none may still be going away.
    kvm::reaper::flush();
    let before = MemorySample::now()?;
    let started = Instant::now();
    let (times, after) = holding_idle_vms(snapshot, count, |_| {
        let create_total = started.elapsed();
        MemorySample::now().map(|after| (create_total, after))
    })?;
    let (create_total, after) = after?;
    Ok(IdleVms {
        count,
        create_total,
        create: Latency::of(&times).ok_or("no VMs were made")?,
        per_vm: PerVm::between(&before, &after, count),
    })
}

/// Creates `count` idle VMs of `snapshot`, calls `while_alive` with all of them alive, then
/// destroys them: each VM's creation time (also given to `while_alive`) and what `while_alive`
/// returned.
fn holding_idle_vms<R>(
    snapshot: &Template,
    count: usize,
    while_alive: impl FnOnce(&[Duration]) -> R,
) -> Result<(Vec<Duration>, R), String> {
    let handed_out = snapshot.handed_out();
    // Each VM's time is its memory fork's plus its vCPU's (the vCPUs borrow the memories, so
    // the memories are all made first).
    let mut times = Vec::with_capacity(count);
    let mut mems = Vec::with_capacity(count);
    for _ in 0..count {
        let one = Instant::now();
        mems.push(
            snapshot
                .new_memory(ForkMemory::CopyOnWrite)
                .map_err(|e| creating(count, e))?,
        );
        times.push(one.elapsed());
    }
    let mut cpus = Vec::with_capacity(count);
    for (mem, time) in mems.iter().zip(&mut times) {
        let one = Instant::now();
        let mut cpu = kvm::restore_cpu(mem, snapshot.cpu()).map_err(|e| creating(count, e))?;
        cpu.map_memory(handed_out).map_err(|e| creating(count, e))?;
        cpus.push(cpu);
        *time += one.elapsed();
    }
    let alive = while_alive(&times);
    drop(cpus);
    drop(mems);
    kvm::reaper::flush();
    Ok((times, alive))
}

/// The VMs one process can hold besides what it holds now.
fn vms_per_process() -> Result<u64, String> {
    let (fds, mappings) = (open_fds()?, mappings()?);
    let open_files = capacity::raise_open_file_limit(u64::MAX)
        .map_err(|e| format!("raising the open-file limit: {e}"))?;
    let max_map_count = capacity::max_map_count().unwrap_or(u64::MAX);
    Ok(capacity::vms_that_fit(
        open_files,
        fds + OTHER_FDS,
        max_map_count,
        mappings,
    ))
}

/// `count` idle VMs alive at once in `processes` worker processes (this binary's
/// `bench density --worker`), each holding its share: a process holds at most what its
/// open-file limit allows. Memory is measured host-wide and in the cgroup the workers share
/// with this process, from when every worker has loaded the template until every VM is made;
/// RSS, open files and mappings as the workers report them.
fn idle_vms_in_workers(dir: &Path, count: usize, processes: usize) -> Result<IdleVms, String> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let mut workers = Vec::with_capacity(processes);
    for share in shares(count, processes) {
        let mut child = Command::new(&exe)
            .args(["bench", "density", "--worker", "--vms", &share.to_string()])
            .arg("--template")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting a worker process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        workers.push((child, stdin, stdout));
    }
    let line_of = |out: &mut Option<BufReader<std::process::ChildStdout>>| {
        let mut line = String::new();
        match out.as_mut().map(|o| o.read_line(&mut line)) {
            Some(Ok(n)) if n > 0 => serde_json::from_str::<Value>(&line)
                .map_err(|e| format!("a worker's answer {line:?}: {e}")),
            _ => Err("a worker ended before answering (its error is above)".to_owned()),
        }
    };
    let result = (|| {
        for (_, _, out) in &mut workers {
            line_of(out)?;
        }
        let before = MemorySample::now()?;
        let started = Instant::now();
        for (_, stdin, _) in &mut workers {
            let sent = stdin
                .as_mut()
                .map(|s| s.write_all(b"go\n").and_then(|()| s.flush()));
            sent.unwrap_or(Ok(()))
                .map_err(|e| format!("starting a worker: {e}"))?;
        }
        let mut reports = Vec::with_capacity(processes);
        for (_, _, out) in &mut workers {
            reports.push(line_of(out)?);
        }
        let create_total = started.elapsed();
        let after = MemorySample::now()?;
        let mut per_vm = PerVm::between(&before, &after, count);
        let sum = |name: &str| -> f64 {
            reports
                .iter()
                .map(|r| r.get(name).and_then(Value::as_f64).unwrap_or(0.0))
                .sum::<f64>()
                / count as f64
        };
        (per_vm.rss_kib, per_vm.fds, per_vm.mappings) =
            (sum("rss_kib"), sum("fds"), sum("mappings"));
        let times = reports
            .iter()
            .flat_map(|r| {
                r.get("times_us")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|t| t.as_u64().map(Duration::from_micros))
            .collect::<Vec<_>>();
        if times.len() != count {
            return Err(format!("the workers made {} VMs, not {count}", times.len()));
        }
        Ok(IdleVms {
            count,
            create_total,
            create: Latency::of(&times).ok_or("no VMs were made")?,
            per_vm,
        })
    })();
    for (mut child, stdin, _) in workers {
        // Closing its stdin tells a worker to destroy its VMs and end.
        drop(stdin);
        let _ = child.wait();
    }
    result
}

/// `count` split into `parts` shares differing by at most one.
fn shares(count: usize, parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    (0..parts)
        .map(|i| count / parts + usize::from(i < count % parts))
        .collect()
}

/// `bench density --worker`: loads the template, answers `{"loaded":true}`, waits for a line,
/// creates `count` idle VMs, answers their creation times and what this process holds more
/// (RSS, open files, mappings), and destroys them when its stdin closes.
pub fn worker(dir: &Path, count: usize) -> Result<(), String> {
    use std::io::{BufRead, Read, Write};

    kvm::Kvm::shared().map_err(|e| e.to_string())?;
    let snapshot = load_folder(dir)?
        .snapshot
        .ok_or_else(|| format!("{} has no snapshot", dir.display()))?;
    make_room(count as u64)?;
    let mut stdout = io::stdout().lock();
    let answer = |out: &mut io::StdoutLock, value: Value| {
        writeln!(out, "{value}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("answering: {e}"))
    };
    answer(&mut stdout, json!({"loaded": true}))?;
    let mut stdin = io::stdin().lock();
    let mut go = String::new();
    stdin
        .read_line(&mut go)
        .map_err(|e| format!("waiting: {e}"))?;
    let before = MemorySample::now()?;
    let (_, answered) = holding_idle_vms(&snapshot, count, |times| {
        let after = MemorySample::now()?;
        let grew = |b: u64, a: u64| a.saturating_sub(b);
        answer(
            &mut stdout,
            json!({
                "times_us": times.iter().map(|t| t.as_micros() as u64).collect::<Vec<_>>(),
                "rss_kib": grew(before.rss_kib, after.rss_kib),
                "fds": grew(before.fds, after.fds),
                "mappings": grew(before.mappings, after.mappings),
            }),
        )?;
        // Held until the bench closes this worker's stdin.
        let _ = stdin.read_to_end(&mut Vec::new());
        Ok::<(), String>(())
    })?;
    answered
}

fn creating(count: usize, e: io::Error) -> String {
    format!("creating {count} idle VMs: {e}")
}

/// Raises the open-file limit for `count` more VMs, and checks the host's mapping limit; an
/// error names the limit that leaves no room.
fn make_room(count: u64) -> Result<(), String> {
    let (fds, mappings) = (open_fds()?, mappings()?);
    let wanted = fds + OTHER_FDS + count * capacity::FDS_PER_VM;
    let open_files = capacity::raise_open_file_limit(wanted)
        .map_err(|e| format!("raising the open-file limit: {e}"))?;
    let max_map_count = capacity::max_map_count().unwrap_or(u64::MAX);
    let fit = capacity::vms_that_fit(open_files, fds + OTHER_FDS, max_map_count, mappings);
    if fit < count {
        return Err(format!(
            "{count} VMs do not fit this process: each holds {} open files and {} mappings; the open-file limit is {open_files} (its hard limit can be raised by root, e.g. `ulimit -Hn {wanted}`) and vm.max_map_count {max_map_count}: room for {fit}",
            capacity::FDS_PER_VM,
            capacity::MAPPINGS_PER_VM
        ));
    }
    Ok(())
}

fn open_fds() -> Result<u64, String> {
    Ok(std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("reading /proc/self/fd: {e}"))?
        .count() as u64)
}

fn mappings() -> Result<u64, String> {
    Ok(read("/proc/self/maps")?.lines().count() as u64)
}

/// What `bench density` prints.
#[derive(Debug, Clone)]
pub struct DensityReport {
    pub template: String,
    /// Processes the VMs were spread over (each holds what its open-file limit allows).
    pub processes: usize,
    pub guest_mem_mib: u64,
    pub idle: IdleVms,
}

impl DensityReport {
    pub fn to_json(&self) -> String {
        let us = |d: Duration| d.as_micros() as u64;
        json!({
            "template": self.template,
            "guest_mem_mib": self.guest_mem_mib,
            "vms": self.idle.count,
            "processes": self.processes,
            "create_total_ms": self.idle.create_total.as_secs_f64() * 1e3,
            "create_per_vm_us": {"p50": us(self.idle.create.p50), "p99": us(self.idle.create.p99)},
            "per_vm": self.idle.per_vm.to_json(),
        })
        .to_string()
    }
}

impl fmt::Display for DensityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (idle, per_vm) = (&self.idle, &self.idle.per_vm);
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        writeln!(
            f,
            "template {} ({} MiB guest memory): {} idle VMs alive at once in {} process(es)",
            self.template, self.guest_mem_mib, idle.count, self.processes
        )?;
        writeln!(
            f,
            "created in {:.2} s; per VM p50 {:.0} us, p99 {:.0} us",
            idle.create_total.as_secs_f64(),
            us(idle.create.p50),
            us(idle.create.p99)
        )?;
        write!(f, "memory per idle VM: {:.1} KiB RSS", per_vm.rss_kib)?;
        if let Some(kib) = per_vm.cgroup_kib {
            write!(f, ", {kib:.1} KiB charged to the cgroup")?;
        }
        if let Some(kib) = per_vm.cgroup_kernel_kib {
            write!(f, " ({kib:.1} KiB of it kernel memory)")?;
        }
        writeln!(f, ", {:.1} KiB of host MemAvailable", per_vm.host_kib)?;
        writeln!(
            f,
            "per idle VM: {:.1} open files, {:.1} memory mappings",
            per_vm.fds, per_vm.mappings
        )?;
        let parts: Vec<String> = per_vm
            .parts
            .iter()
            .map(|(name, kib)| format!("{name} {kib:.1}"))
            .collect();
        writeln!(
            f,
            "where it is, KiB per VM (host-wide, other processes move these too): {}",
            parts.join(", ")
        )
    }
}

/// Runs `bench density` on the template folder `dir` with `count` idle VMs: in this process
/// when its open-file limit leaves room for them and `per_process` (at most that many VMs in
/// one process) allows, else spread over worker processes.
pub fn run(dir: &Path, count: usize, per_process: usize) -> Result<DensityReport, String> {
    if count == 0 {
        return Err("the number of VMs must be at least 1".to_owned());
    }
    kvm::Kvm::shared().map_err(|e| e.to_string())?;
    let template = load_folder(dir)?;
    let snapshot = template.snapshot.clone().ok_or_else(|| {
        format!(
            "{} has no snapshot: run `sandfork-vmm template build` first",
            dir.display()
        )
    })?;
    let per_process = usize::try_from(vms_per_process()?)
        .unwrap_or(usize::MAX)
        .min(per_process);
    if per_process == 0 {
        return Err("the open-file or mapping limit leaves no room for a VM".to_owned());
    }
    let processes = count.div_ceil(per_process);
    let idle = if processes == 1 {
        idle_vms(&snapshot, count)?
    } else {
        drop(snapshot);
        idle_vms_in_workers(dir, count, processes)?
    };
    Ok(DensityReport {
        guest_mem_mib: template
            .snapshot
            .as_ref()
            .map_or(0, |s| s.identity().mem_bytes >> 20),
        template: template.name,
        processes,
        idle,
    })
}

/// The directory of this process's memory cgroup and whether it is cgroup v2; None without a
/// memory controller.
fn cgroup_dir() -> Option<(String, bool)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    groups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        match controllers {
            "" => {
                let dir = format!("/sys/fs/cgroup{path}");
                Path::new(&format!("{dir}/memory.current"))
                    .exists()
                    .then_some((dir, true))
            }
            c if c.split(',').any(|c| c == "memory") => {
                Some((format!("/sys/fs/cgroup/memory{path}"), false))
            }
            _ => None,
        }
    })
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))
}

/// The value in KiB of `field` in a /proc file of `Name:   value kB` lines.
fn kib_field(text: &str, field: &str) -> Result<u64, String> {
    text.lines()
        .find_map(|line| {
            let (name, rest) = line.split_once(':')?;
            (name == field).then(|| rest.trim().trim_end_matches("kB").trim().parse().ok())?
        })
        .ok_or_else(|| format!("no {field} field"))
}

/// Bytes held by each cache in /proc/slabinfo text (slabs times pages per slab).
fn slab_bytes(text: &str) -> HashMap<String, u64> {
    const PAGE: u64 = 4096;
    text.lines()
        .filter(|line| !line.starts_with("slabinfo") && !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
            // name active num objsize perslab pagesperslab : tunables ... : slabdata active num shared
            let pages_per_slab = number(5)?;
            let slabs = number(fields.iter().position(|&f| f == "slabdata")? + 2)?;
            Some((fields[0].to_owned(), slabs * pages_per_slab * PAGE))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_differ_by_at_most_one_and_add_up() {
        assert_eq!(shares(10_000, 2), vec![5_000, 5_000]);
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(5, 1), vec![5]);
        assert_eq!(shares(7, 0), vec![7]);
    }

    #[test]
    fn proc_fields_are_read_by_exact_name() {
        let meminfo = "MemTotal:       24000000 kB\nPageTables:        32884 kB\nSecPageTables:       204 kB\n";
        assert_eq!(kib_field(meminfo, "PageTables"), Ok(32_884));
        assert_eq!(kib_field(meminfo, "SecPageTables"), Ok(204));
        assert!(kib_field(meminfo, "Tables").is_err());
        assert_eq!(kib_field("VmRSS:\t  1234 kB\n", "VmRSS"), Ok(1234));
    }

    #[test]
    fn slab_caches_count_their_whole_slabs() {
        let text = "slabinfo - version: 2.1\n\
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n\
kvm_vcpu               8     15  51488    1   16 : tunables    0    0    0 : slabdata     15     15      0\n\
kmalloc-64          1000   1024     64   64    1 : tunables    0    0    0 : slabdata     16     16      0\n";
        let slabs = slab_bytes(text);
        assert_eq!(slabs.len(), 2);
        assert_eq!(slabs["kvm_vcpu"], 15 * 16 * 4096);
        assert_eq!(slabs["kmalloc-64"], 16 * 4096);
    }

    fn sample(rss_kib: u64, vcpu_slab: u64) -> MemorySample {
        MemorySample {
            rss_kib,
            available_kib: 1_000_000 - rss_kib,
            cgroup_bytes: Some(rss_kib * 1024),
            cgroup_kernel_bytes: None,
            meminfo_kib: vec![rss_kib; MEMINFO_PARTS.len()],
            slab_bytes: HashMap::from([
                ("kvm_vcpu".to_owned(), vcpu_slab),
                ("dentry".to_owned(), 4096),
            ]),
            fds: 10,
            mappings: 20,
        }
    }

    #[test]
    fn per_vm_figures_divide_the_growth_and_list_the_slabs_that_grew() {
        let (before, mut after) = (sample(1000, 0), sample(3000, 10 * 65_536));
        after.fds += 20;
        after.mappings += 40;
        let per_vm = PerVm::between(&before, &after, 10);
        assert_eq!(per_vm.rss_kib, 200.0);
        assert_eq!(per_vm.host_kib, 200.0);
        assert_eq!(per_vm.cgroup_kib, Some(200.0));
        assert_eq!(per_vm.cgroup_kernel_kib, None);
        assert_eq!((per_vm.fds, per_vm.mappings), (2.0, 4.0));
        assert_eq!(per_vm.parts[0], ("AnonPages".to_owned(), 200.0));
        let slabs: Vec<_> = per_vm.parts[MEMINFO_PARTS.len()..].to_vec();
        assert_eq!(
            slabs,
            vec![("slab kvm_vcpu".to_owned(), 64.0)],
            "dentry did not grow"
        );
    }
}
