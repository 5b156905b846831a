//! `sandfork-vmm bench net`: TCP connect latency and the throughput of a 64 MiB download and
//! upload, from a Python program in a fresh guest (its connections carried by the VMM under a
//! policy naming the server) and, as the baseline of the same run, from the same program
//! spawned natively (`bench::PROGRAM`). The server is this binary (`bench net --serve`) in a
//! network namespace the bench makes (`TestNamespace`): both clients reach it over the same
//! veth pair.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bench::{launch_exited, median, native_stdout, BenchError, PROGRAM};
use crate::fs::Image;
use crate::net::{Allowlist, Grant, Limits, Policy};
use crate::vm::{CpuFactory, RunRequest};

pub const DEFAULT_CONNECTS: u64 = 200;
pub const DEFAULT_MIB: u64 = 64;
pub const DEFAULT_REPETITIONS: usize = 3;
/// The server's port in the namespace.
const PORT: u16 = 9000;

/// A network namespace with a veth pair to the host's: the host's end 10.X.Y.1/30, the
/// namespace's 10.X.Y.2/30 (X, Y from `id`). Removed (with the pair) on drop. Needs root.
pub struct TestNamespace {
    pub name: String,
    /// The namespace's end: where its servers listen.
    pub inside: String,
    /// The host's end (one of the host's own addresses while it lives).
    pub outside: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let status = Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("ip {}: {status}", args.join(" "))))
    }
}

impl TestNamespace {
    pub fn new(tag: &str, id: u32) -> io::Result<TestNamespace> {
        let name = format!("{tag}{id}");
        let (x, y) = (200 + id % 50, (id / 50) % 250);
        let namespace = TestNamespace {
            inside: format!("10.{x}.{y}.2"),
            outside: format!("10.{x}.{y}.1"),
            name,
        };
        let _ = ip(&["netns", "del", &namespace.name]);
        let name = namespace.name.as_str();
        let (veth_host, veth_ns) = (format!("{name}h"), format!("{name}n"));
        ip(&["netns", "add", name])?;
        ip(&[
            "link", "add", &veth_host, "type", "veth", "peer", "name", &veth_ns,
        ])?;
        ip(&["link", "set", &veth_ns, "netns", name])?;
        let outside = format!("{}/30", namespace.outside);
        ip(&["addr", "add", &outside, "dev", &veth_host])?;
        ip(&["link", "set", &veth_host, "up"])?;
        let inside = format!("{}/30", namespace.inside);
        ip(&["-n", name, "addr", "add", &inside, "dev", &veth_ns])?;
        ip(&["-n", name, "link", "set", &veth_ns, "up"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(namespace)
    }

    /// `program` to be run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The bench's server: per connection, a command byte: `c` closes; `d` and a big-endian u64 N
/// sends N bytes then closes; `u` reads to end of file, then answers the count (u64).
pub fn serve(addr: &str) -> io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    println!("ready");
    io::stdout().flush()?;
    for stream in listener.incoming() {
        let stream = stream?;
        std::thread::spawn(move || {
            let _ = answer(stream);
        });
    }
    Ok(())
}

fn answer(mut stream: TcpStream) -> io::Result<()> {
    let mut command = [0u8; 1];
    stream.read_exact(&mut command)?;
    match command[0] {
        b'd' => {
            let mut n = [0u8; 8];
            stream.read_exact(&mut n)?;
            let mut left = u64::from_be_bytes(n);
            let chunk = vec![b'x'; 1 << 20];
            while left > 0 {
                let take = left.min(chunk.len() as u64) as usize;
                stream.write_all(&chunk[..take])?;
                left -= take as u64;
            }
        }
        b'u' => {
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0u64;
            loop {
                match stream.read(&mut buf)? {
                    0 => break,
                    n => got += n as u64,
                }
            }
            stream.write_all(&got.to_be_bytes())?;
        }
        _ => {}
    }
    Ok(())
}

/// Prints {"connect_us": [...sorted], "download_s": s, "upload_s": s} for argv: host, port,
/// connects, MiB.
const CLIENT: &str = r#"
import json, socket, sys, time
host, port, connects, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
latencies = []
for _ in range(connects):
    start = time.perf_counter()
    s = socket.create_connection((host, port))
    latencies.append((time.perf_counter() - start) * 1e6)
    s.sendall(b"c")
    s.close()
n = mib << 20
view = memoryview(bytearray(1 << 20))
s = socket.create_connection((host, port))
s.sendall(b"d" + n.to_bytes(8, "big"))
start, got = time.perf_counter(), 0
while (k := s.recv_into(view)):
    got += k
download = time.perf_counter() - start
s.close()
assert got == n, got
s = socket.create_connection((host, port))
s.sendall(b"u")
chunk = bytes(1 << 20)
start = time.perf_counter()
for _ in range(mib):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR)
ack = b""
while len(ack) < 8 and (part := s.recv(8 - len(ack))):
    ack += part
upload = time.perf_counter() - start
assert int.from_bytes(ack, "big") == n, ack
print(json.dumps({"connect_us": sorted(latencies), "download_s": download, "upload_s": upload}))
"#;

/// One client run's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub connect_p50_us: f64,
    pub download_mib_s: f64,
    pub upload_mib_s: f64,
}

fn figures(stdout: &[u8], mib: u64) -> Result<Figures, BenchError> {
    let bad = |why: String| BenchError::Native(io::Error::other(why));
    let value: serde_json::Value = serde_json::from_slice(stdout).map_err(|e| {
        bad(format!(
            "the client printed {:?}: {e}",
            String::from_utf8_lossy(stdout)
        ))
    })?;
    let connects: Vec<f64> = value["connect_us"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
        .unwrap_or_default();
    let seconds = |key: &str| {
        value[key]
            .as_f64()
            .filter(|s| *s > 0.0)
            .ok_or_else(|| bad(format!("no {key} in {value}")))
    };
    if connects.is_empty() {
        return Err(bad("no connect latencies".into()));
    }
    Ok(Figures {
        connect_p50_us: median(connects),
        download_mib_s: mib as f64 / seconds("download_s")?,
        upload_mib_s: mib as f64 / seconds("upload_s")?,
    })
}

/// The median of each figure over the repetitions.
fn medians(runs: &[Figures]) -> Figures {
    let pick = |f: fn(&Figures) -> f64| median(runs.iter().map(f).collect());
    Figures {
        connect_p50_us: pick(|f| f.connect_p50_us),
        download_mib_s: pick(|f| f.download_mib_s),
        upload_mib_s: pick(|f| f.upload_mib_s),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NetReport {
    pub connects: u64,
    pub mib: u64,
    pub repetitions: usize,
    pub vm: Figures,
    pub native: Figures,
}

/// Waits until the server in the namespace takes connections (at most 10 s).
fn wait_for_server(addr: &str) -> Result<(), BenchError> {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(BenchError::Native(io::Error::other(format!(
        "the bench server at {addr} did not start"
    ))))
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(
    image: Arc<Image>,
    connects: u64,
    mib: u64,
    repetitions: usize,
    make_cpu: &CpuFactory,
) -> Result<NetReport, BenchError> {
    if repetitions == 0 || connects == 0 || mib == 0 {
        return Err(BenchError::NoIterations);
    }
    let namespace =
        TestNamespace::new("sfbench", std::process::id()).map_err(BenchError::Native)?;
    let addr = format!("{}:{PORT}", namespace.inside);
    let exe = std::env::current_exe().map_err(BenchError::Native)?;
    let _server = Server(
        namespace
            .command(&exe.to_string_lossy())
            .args(["bench", "net", "--serve", &addr])
            .stdout(Stdio::null())
            .spawn()
            .map_err(BenchError::Native)?,
    );
    wait_for_server(&addr)?;
    let args = [
        "-c".to_owned(),
        CLIENT.to_owned(),
        namespace.inside.clone(),
        PORT.to_string(),
        connects.to_string(),
        mib.to_string(),
    ];
    let mut request = RunRequest::new(PROGRAM, &args);
    request.timeout = Duration::from_secs(600);
    let rule = format!("{}/32:{PORT}", namespace.inside);
    request.network = Grant {
        policy: Policy::new(vec![Allowlist::parse(&[rule]).expect("a valid rule")]),
        limits: Limits {
            bytes: (2 * mib + 1) << 20,
            ..Limits::default()
        },
    };
    let (mut vm_runs, mut native_runs) = (Vec::new(), Vec::new());
    for _ in 0..repetitions {
        let outcome = launch_exited(image.clone(), &request, make_cpu)?;
        vm_runs.push(figures(&outcome.stdout, mib)?);
        native_runs.push(figures(&native_stdout(PROGRAM, &args)?, mib)?);
    }
    Ok(NetReport {
        connects,
        mib,
        repetitions,
        vm: medians(&vm_runs),
        native: medians(&native_runs),
    })
}

impl NetReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "TCP to a server in a network namespace: {} connects, {} MiB down and up, median of {} runs\n",
            self.connects, self.mib, self.repetitions
        );
        let _ = writeln!(
            out,
            "{:<8} {:>16} {:>18} {:>16}",
            "", "connect p50 µs", "download MiB/s", "upload MiB/s"
        );
        for (name, f) in [("vm", &self.vm), ("native", &self.native)] {
            let _ = writeln!(
                out,
                "{name:<8} {:>16.1} {:>18.1} {:>16.1}",
                f.connect_p50_us, f.download_mib_s, f.upload_mib_s
            );
        }
        let _ = writeln!(
            out,
            "vm - native connect: {:+.1} µs; vm / native: download {:.0}%, upload {:.0}%",
            self.vm.connect_p50_us - self.native.connect_p50_us,
            100.0 * self.vm.download_mib_s / self.native.download_mib_s,
            100.0 * self.vm.upload_mib_s / self.native.upload_mib_s
        );
        out
    }

    pub fn to_json(&self) -> String {
        let round = |v: f64| (v * 10.0).round() / 10.0;
        let report = ReportJson {
            connects: self.connects,
            mib: self.mib,
            repetitions: self.repetitions,
            vm_connect_p50_us: round(self.vm.connect_p50_us),
            native_connect_p50_us: round(self.native.connect_p50_us),
            vm_download_mib_s: round(self.vm.download_mib_s),
            native_download_mib_s: round(self.native.download_mib_s),
            vm_upload_mib_s: round(self.vm.upload_mib_s),
            native_upload_mib_s: round(self.native.upload_mib_s),
        };
        serde_json::to_string(&report).expect("numbers always serialise")
    }
}

#[derive(Serialize)]
struct ReportJson {
    connects: u64,
    mib: u64,
    repetitions: usize,
    vm_connect_p50_us: f64,
    native_connect_p50_us: f64,
    vm_download_mib_s: f64,
    native_download_mib_s: f64,
    vm_upload_mib_s: f64,
    native_upload_mib_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_from_the_clients_line_and_the_median_is_taken() {
        let line =
            br#"{"connect_us": [10.0, 20.0, 30.0, 400.0], "download_s": 0.5, "upload_s": 2.0}"#;
        let f = figures(line, 64).unwrap();
        assert_eq!(
            f,
            Figures {
                connect_p50_us: 20.0,
                download_mib_s: 128.0,
                upload_mib_s: 32.0
            }
        );
        assert!(figures(b"{}", 64).is_err());
        assert!(figures(b"not json", 64).is_err());
        let slow = Figures {
            connect_p50_us: 90.0,
            download_mib_s: 1.0,
            upload_mib_s: 1.0,
        };
        assert_eq!(medians(&[f, slow, f]), f);
    }
}
