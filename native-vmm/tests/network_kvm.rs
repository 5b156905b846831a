//! Network egress through the real `sandfork-vmm serve` binary (confined by seccomp) on the KVM
//! vCPU, against servers in a network namespace this test makes (`net_bench::TestNamespace`:
//! `ip netns add`, a veth pair whose host end has 10.X.Y.1/30 and whose namespace end
//! 10.X.Y.2/30, X and Y from the test's pid), the servers of tests/network/servers.py bound there
//! (DNS, HTTP, UDP echo, HTTPS with a certificate from a CA the test makes and installs into the
//! daemon's Python template, a package index of a wheel the test builds with
//! tests/network/index.py). The daemon
//! and its VMs stay in the host's namespace and reach the test host through the veth route;
//! `serve --dns-server 10.X.Y.2:53` makes the test's DNS server the one allowed names are
//! asked of. 10/8 is a private range, refused unless a rule names it, so every policy here
//! names the test host explicitly: the tests exercise that path too.
//!
//! Needs root (network namespaces); the KVM tier runs as root.

mod daemon_support;
mod network_support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use daemon_support::{build_python_template, scaled, scratch, str_of, wait_for, Client};
use network_support::TestNet;
use serde_json::{json, Value};

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, net: &TestNet, templates: &Path) -> Daemon {
        let socket = dir.join("s.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_sandfork-vmm"))
            .args(["serve", "--pool-size", "1", "--socket"])
            .arg(&socket)
            .arg("--templates")
            .arg(templates)
            .arg("--sessions")
            .arg(dir.join("sessions"))
            .arg("--dns-server")
            .arg(format!("{}:53", net.host))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the daemon");
        assert!(
            wait_for(scaled(Duration::from_secs(30)), || socket.exists()),
            "the daemon did not listen"
        );
        Daemon { child, socket }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `code` under `network` (null: none) with a time limit of `timeout_ms`.
fn execute(client: &mut Client, code: &str, network: Value, timeout_ms: u64) -> Value {
    let mut request = json!({"id": 1, "type": "execute", "template": "python", "code": code,
        "limits": {"timeout_ms": scaled(Duration::from_millis(timeout_ms)).as_millis() as u64}});
    if !network.is_null() {
        request["network"] = network;
    }
    client.call(&request.to_string())
}

fn network_usage(answer: &Value, key: &str) -> u64 {
    answer["usage"]["network"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("usage.network.{key} in {answer}"))
}

fn allow(rules: &[String]) -> Value {
    json!({ "allowlists": [rules] })
}

/// The rules that allow web.test's `port`: its name and its (private) address.
fn allow_web(host: &str, port: u16) -> Value {
    allow(&[format!("web.test:{port}"), format!("{host}/32:{port}")])
}

fn stdout(answer: &Value) -> &str {
    assert_eq!(str_of(answer, "status"), "ok", "{answer}");
    str_of(answer, "stdout")
}

/// Runs `program` with `args` on the host; it must succeed.
fn host_run(program: &str, args: &[&str], dir: &Path) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA (ca.pem) and a certificate it signs for web.test (web.pem, web.key), made in `dir` with
/// the openssl CLI.
fn make_certificates(dir: &Path) {
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = [
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=sandfork test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ];
    host_run("openssl", &[&ca[..], &key].concat(), dir);
    let request = [
        "req",
        "-subj",
        "/CN=web.test",
        "-keyout",
        "web.key",
        "-out",
        "web.csr",
    ];
    host_run("openssl", &[&request[..], &key].concat(), dir);
    std::fs::write(
        dir.join("web.ext"),
        "subjectAltName=DNS:web.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    host_run(
        "openssl",
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            "web.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "web.ext",
            "-out",
            "web.pem",
        ],
        dir,
    );
}

/// A templates directory whose Python template trusts the CA `ca` as an installed CA does: the
/// image holds it in /etc/ssl/certs under its subject hash, where OpenSSL's default verify
/// paths look up issuers (the CA bundle file stays Debian's).
fn templates_trusting(ca: &Path, dir: &Path) -> PathBuf {
    let hash = Command::new("openssl")
        .args(["x509", "-hash", "-noout", "-in"])
        .arg(ca)
        .output()
        .expect("running openssl");
    assert!(hash.status.success(), "{hash:?}");
    let hash = String::from_utf8(hash.stdout).unwrap();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(python.join("image.json")).unwrap()).unwrap();
    let paths = manifest["paths"].as_array_mut().unwrap();
    // Written elsewhere, the manifest names the template's own files from its folder.
    for path in paths.iter_mut().filter(|p| p.is_object()) {
        path["host"] = python
            .join(path["host"].as_str().unwrap())
            .to_str()
            .unwrap()
            .into();
    }
    paths.push(json!({"host": ca, "guest": format!("/etc/ssl/certs/{}.0", hash.trim())}));
    let file = dir.join("image.json");
    std::fs::write(&file, manifest.to_string()).unwrap();
    let templates = dir.join("templates");
    build_python_template(&file, &templates.join("python"));
    templates
}

#[test]
fn egress_follows_the_policy() {
    let dir = scratch("network");
    make_certificates(&dir);
    let files = dir.join("files");
    let index = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/network/index.py");
    host_run(
        "/usr/bin/python3.11",
        &[
            index.to_str().unwrap(),
            files.to_str().unwrap(),
            "sfgreet",
            "1.0",
            "GREETING = 'hello from the test index'\n",
        ],
        &dir,
    );
    let net = TestNet::serving(&files, &dir.join("web.pem"), &dir.join("web.key"));
    let templates = templates_trusting(&dir.join("ca.pem"), &dir);
    let daemon = Daemon::start(&dir, &net, &templates);
    let mut client = Client::hello(&daemon.socket);
    let host = &net.host;
    let web = vec!["web.test:8080".to_owned(), format!("{host}/32:8080")];

    // HTTP GET by name and POST, from Python's urllib.
    let answer = execute(
        &mut client,
        "import urllib.request as u\n\
         print(u.urlopen('http://web.test:8080/index.html', timeout=10).read().decode(), end='')\n\
         r = u.urlopen(u.Request('http://web.test:8080/echo', data=b'posted=1'), timeout=10)\n\
         print(r.status, r.read().decode())",
        allow(&web),
        20_000,
    );
    assert_eq!(stdout(&answer), "hello-from-netns\n200 posted=1\n");
    assert_eq!(network_usage(&answer, "connections"), 2);
    assert_eq!(network_usage(&answer, "refused"), 0);

    // Bytes are billed exactly: what the program sent and received over a raw socket.
    let answer = execute(
        &mut client,
        &format!(
            "import socket\n\
             s = socket.create_connection(('{host}', 8080), timeout=10)\n\
             req = b'GET /bytes/100000 HTTP/1.1\\r\\nHost: t\\r\\nConnection: close\\r\\n\\r\\n'\n\
             s.sendall(req)\n\
             got = 0\n\
             while (chunk := s.recv(65536)):\n    got += len(chunk)\n\
             print(len(req), got)"
        ),
        allow(&web),
        20_000,
    );
    let counts: Vec<u64> = stdout(&answer)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(counts[1] > 100_000, "{answer}");
    assert_eq!(network_usage(&answer, "bytes_out"), counts[0], "{answer}");
    assert_eq!(network_usage(&answer, "bytes_in"), counts[1], "{answer}");

    // Refused: a denied name (NXDOMAIN), a denied port, a name resolving to a denied address
    // (rebinding), the literal metadata addresses (IPv4, IPv6, and IPv4 as an IPv4-mapped IPv6
    // address), a private address no rule names, the host's end of the veth (one of the host's
    // own addresses). Loopback (IPv4 and IPv6) is the VM's own: nobody listens there, and a
    // server on the host's loopback is never reached.
    let host_loopback = TcpListener::bind("127.0.0.1:0").unwrap();
    host_loopback.set_nonblocking(true).unwrap();
    let loopback_port = host_loopback.local_addr().unwrap().port();
    let outside = &net.outside;
    let mut rules = web.clone();
    rules.extend(["rebind.test".into(), "private.test".into()]);
    let answer = execute(
        &mut client,
        &format!(
            "import socket, errno\n\
             for name in ['denied.test', 'rebind.test']:\n\
             \x20   try: print(name, socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)[0][4][0])\n\
             \x20   except socket.gaierror as e: print(name, 'gaierror', e.errno)\n\
             for addr in [('{host}', 8081), ('rebind.test', 80), ('169.254.169.254', 80),\n\
             \x20            ('fd00:ec2::254', 80), ('::ffff:169.254.169.254', 80),\n\
             \x20            ('private.test', 80), ('{outside}', 8080), ('127.0.0.1', {loopback_port}),\n\
             \x20            ('::1', {loopback_port})]:\n\
             \x20   s = socket.socket(socket.AF_INET6 if ':' in addr[0] else socket.AF_INET)\n\
             \x20   try: s.connect(addr); print(addr[0], 'connected')\n\
             \x20   except OSError as e: print(addr[0], errno.errorcode[e.errno])"
        ),
        allow(&rules),
        20_000,
    );
    assert_eq!(
        stdout(&answer),
        format!(
            "denied.test gaierror -2\nrebind.test 169.254.169.254\n{host} EACCES\n\
             rebind.test EACCES\n169.254.169.254 EACCES\nfd00:ec2::254 EACCES\n\
             ::ffff:169.254.169.254 EACCES\nprivate.test EACCES\n{outside} EACCES\n\
             127.0.0.1 ECONNREFUSED\n::1 ECONNREFUSED\n"
        )
    );
    // One NXDOMAIN (asked for A and AAAA) and seven connects.
    assert_eq!(network_usage(&answer, "refused"), 2 + 7, "{answer}");
    assert!(
        host_loopback.accept().is_err(),
        "the host's loopback was reached"
    );

    // No network unless a request asks for it: names do not resolve, addresses are refused.
    let answer = execute(
        &mut client,
        &format!(
            "import socket\n\
             try: socket.getaddrinfo('web.test', 80)\n\
             except socket.gaierror as e: print(e.errno)\n\
             try: socket.create_connection(('{host}', 8080))\n\
             except PermissionError as e: print(e.errno)"
        ),
        Value::Null,
        20_000,
    );
    assert_eq!(stdout(&answer), "-2\n13\n");

    // DNS of a denied name is NXDOMAIN in the answer itself; UDP echo to an allowed port.
    let answer = execute(
        &mut client,
        &format!(
            "import socket, struct\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.settimeout(10)\n\
             q = struct.pack('>HHHHHH', 77, 0x100, 1, 0, 0, 0) + b'\\x06denied\\x04test\\x00\\x00\\x01\\x00\\x01'\n\
             s.sendto(q, ('127.0.0.53', 53))\n\
             a, src = s.recvfrom(512)\n\
             print(struct.unpack('>H', a[:2])[0], a[3] & 15, src)\n\
             s.sendto(b'ping' * 100, ('{host}', 7))\n\
             data, src = s.recvfrom(4096)\n\
             print(len(data), data[:8], src[1])\n\
             try: s.sendto(b'x', ('{host}', 9))\n\
             except PermissionError: print('port 9 refused')"
        ),
        allow(&[format!("{host}/32:7"), "*.test".to_owned()]),
        20_000,
    );
    assert_eq!(
        stdout(&answer),
        "77 3 ('127.0.0.53', 53)\n400 b'pingping' 7\nport 9 refused\n"
    );
    assert_eq!(network_usage(&answer, "bytes_out"), 400);
    assert_eq!(network_usage(&answer, "bytes_in"), 400);

    // A byte cap reached mid-download ends the run with its own status.
    let answer = execute(
        &mut client,
        "import urllib.request as u\n\
         print('started', flush=True)\n\
         u.urlopen('http://web.test:8080/bytes/2000000', timeout=10).read()\n\
         print('finished')",
        json!({"allowlists": [web], "max_bytes": 100_000}),
        20_000,
    );
    assert_eq!(str_of(&answer, "status"), "network_limit", "{answer}");
    assert_eq!(str_of(&answer, "stdout"), "started\n");
    let moved = network_usage(&answer, "bytes_in") + network_usage(&answer, "bytes_out");
    assert!(moved <= 100_000 && moved > 50_000, "{answer}");

    // A server that never answers: the run's time limit ends it.
    let answer = execute(
        &mut client,
        "import urllib.request as u\nu.urlopen('http://web.test:8080/slow').read()",
        allow(&web),
        2_000,
    );
    assert_eq!(str_of(&answer, "status"), "timeout", "{answer}");
    assert_eq!(network_usage(&answer, "connections"), 1);
    // The same server and the program's own socket timeout: the read times out in the guest.
    let answer = execute(
        &mut client,
        "import time, urllib.request as u\n\
         t0 = time.monotonic()\n\
         try: u.urlopen('http://web.test:8080/slow', timeout=1).read()\n\
         except TimeoutError as e: print('timed out', e, 1 <= time.monotonic() - t0 < 10)",
        allow(&web),
        20_000,
    );
    assert_eq!(stdout(&answer), "timed out timed out True\n", "{answer}");

    https_verifies_with_the_installed_ca(&mut client, host);
    pip_installs_from_the_test_index(&mut client, host);

    // A session keeps its connection from one cell to the next.
    let created = client.call(
        &json!({"id": 2, "type": "session_create", "session": "net", "template": "python"})
            .to_string(),
    );
    assert_eq!(str_of(&created, "type"), "session", "{created}");
    let cell = |client: &mut Client, code: &str| {
        client.call(
            &json!({"id": 3, "type": "session_execute", "session": "net", "code": code,
                "network": allow(&web)})
            .to_string(),
        )
    };
    let first = cell(
        &mut client,
        &format!(
            "import socket\n\
             conn = socket.create_connection(('{host}', 8080), timeout=10)\n\
             conn.sendall(b'GET /index.html HTTP/1.1\\r\\nHost: t\\r\\n\\r\\n')"
        ),
    );
    assert_eq!(str_of(&first, "status"), "ok", "{first}");
    let second = cell(
        &mut client,
        "data = b''\n\
         while not data.endswith(b'hello-from-netns\\n'):\n    data += conn.recv(4096)\n\
         print(data.split(b'\\r\\n\\r\\n')[1].decode(), end='')",
    );
    assert_eq!(str_of(&second, "status"), "ok", "{second}");
    assert_eq!(str_of(&second, "stdout"), "hello-from-netns\n");
    assert_eq!(network_usage(&second, "connections"), 0);
    assert!(network_usage(&second, "bytes_in") > 17);
}

/// HTTPS to web.test: urllib verifies the server's certificate with the test's CA installed in
/// the template, with no setting of the program's; with only the image's CA bundle file,
/// verification fails.
fn https_verifies_with_the_installed_ca(client: &mut Client, host: &str) {
    let code = "import ssl, urllib.request as u\n\
         url = 'https://web.test:8443/'\n\
         print(u.urlopen(url + 'index.html', timeout=10).read().decode(), end='')\n\
         r = u.urlopen(u.Request(url + 'echo', data=b'over-tls'), timeout=10)\n\
         print(r.status, r.read().decode())\n\
         bundle = ssl.create_default_context(cafile='/usr/lib/ssl/cert.pem')\n\
         try: u.urlopen(url + 'index.html', context=bundle, timeout=10)\n\
         except u.URLError as e: print(type(e.reason).__name__, e.reason.verify_message)";
    let request = json!({"id": 4, "type": "execute", "template": "python", "code": code,
        "network": allow_web(host, 8443),
        "limits": {"timeout_ms": scaled(Duration::from_secs(20)).as_millis() as u64}});
    let answer = client.call(&request.to_string());
    assert_eq!(
        stdout(&answer),
        "hello-from-netns\n200 over-tls\n\
         SSLCertVerificationError unable to get local issuer certificate\n"
    );
    assert_eq!(network_usage(&answer, "connections"), 3, "{answer}");
}

/// pip installs a wheel from the test's PEP 503 index (plain HTTP, so the host is named
/// trusted) into /work/site, and the same run imports it.
fn pip_installs_from_the_test_index(client: &mut Client, host: &str) {
    let answer = execute(
        client,
        "import sys\n\
         from pip._internal.cli.main import main as pip\n\
         code = pip(['install', '--isolated', '--no-cache-dir', '--disable-pip-version-check',\n\
         \x20   '--progress-bar', 'off', '--quiet', '--index-url', 'http://web.test:8080/simple',\n\
         \x20   '--trusted-host', 'web.test', '--target', '/work/site', 'sfgreet'])\n\
         sys.path.insert(0, '/work/site')\n\
         import sfgreet\n\
         print(code, sfgreet.GREETING, sfgreet.__file__)",
        allow_web(host, 8080),
        60_000,
    );
    assert_eq!(
        stdout(&answer),
        "0 hello from the test index /work/site/sfgreet.py\n"
    );
    assert_eq!(network_usage(&answer, "refused"), 0, "{answer}");
}
