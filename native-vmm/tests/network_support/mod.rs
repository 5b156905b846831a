//! The test network of the egress tests (network_kvm.rs, node_kvm.rs): a namespace
//! (`net_bench::TestNamespace`: a veth pair, 10.X.Y.1 outside, 10.X.Y.2 inside) with the servers
//! of tests/network/servers.py in it: DNS (web.test is the test host, rebind.test the metadata
//! address, private.test 10.0.0.1), HTTP on 8080, UDP echo on 7; with `TestNet::serving`, also
//! a folder's files over HTTP and HTTPS on 8443 with a given certificate. Needs root.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

use sandfork_vmm::net_bench::TestNamespace;

/// The namespace and the servers in it; all removed on drop.
pub struct TestNet {
    /// The test host's address (the namespace's end of the veth pair).
    pub host: String,
    /// The host's end of the veth pair.
    pub outside: String,
    servers: Child,
    _namespace: TestNamespace,
}

impl TestNet {
    pub fn new() -> TestNet {
        TestNet::with_options(&[])
    }

    /// Also serves the files under `files` (on 8080 and 8443) and HTTPS on 8443 with the PEM
    /// certificate chain `cert` and its key `key`.
    pub fn serving(files: &Path, cert: &Path, key: &Path) -> TestNet {
        TestNet::with_options(&[
            "--files".as_ref(),
            files.as_os_str(),
            "--tls".as_ref(),
            cert.as_os_str(),
            key.as_os_str(),
        ])
    }

    fn with_options(options: &[&OsStr]) -> TestNet {
        let namespace =
            TestNamespace::new("sfnet", std::process::id()).expect("making the test namespace");
        let inside = namespace.inside.clone();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/network/servers.py");
        let mut servers = namespace
            .command("/usr/bin/python3.11")
            .arg(script)
            .arg(&inside)
            .args(options)
            .arg(format!("web.test={inside}"))
            .arg("rebind.test=169.254.169.254")
            .arg("private.test=10.0.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the test servers");
        let mut line = String::new();
        BufReader::new(servers.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the test servers did not start");
        TestNet {
            host: inside,
            outside: namespace.outside.clone(),
            servers,
            _namespace: namespace,
        }
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = self.servers.kill();
        let _ = self.servers.wait();
    }
}
