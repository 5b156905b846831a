//! Builds, with the system C compiler ($CC or `cc`; gcc on Debian, from build-essential), the
//! guest's vDSO (vdso/vdso.c, laid out by vdso/vdso.lds) into $OUT_DIR/vdso.so, which
//! `vdso::IMAGE` embeds, and the static program `sandfork-vmm bench syscalls` runs in a guest
//! and natively (tests/programs/vdso_clock.c) into $OUT_DIR/vdso_clock. No binary is kept in
//! the repository.

use std::path::PathBuf;
use std::process::Command;

fn compile(cc: &str, what: &str, args: &[String]) {
    let status = Command::new(cc)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("building {what} needs a C compiler (`{cc}`; set CC to choose another; on Debian: apt-get install gcc libc6-dev): {e}"));
    assert!(status.success(), "{cc} failed to build {what}");
}

fn main() {
    let dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("vdso");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("vdso.so");
    let (source, script) = (dir.join("vdso.c"), dir.join("vdso.lds"));
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    // Position-independent, no libc, no stack protector or PLT: the object must need no
    // relocation and call nothing (glibc does not relocate a vDSO).
    let flags = [
        "-O2",
        "-fPIC",
        "-ffreestanding",
        "-fno-builtin",
        "-fno-stack-protector",
        "-fno-plt",
        "-fcf-protection=none",
        "-nostdlib",
        "-shared",
        "-Wall",
        "-Wextra",
        "-Werror",
    ];
    let link = [
        "-Wl,--hash-style=both",
        "-Wl,-Bsymbolic",
        "-Wl,-soname=linux-vdso.so.1",
        "-Wl,--no-undefined",
        "-Wl,-z,noexecstack",
        "-Wl,--eh-frame-hdr",
        "-Wl,--build-id=none",
    ];
    let mut args: Vec<String> = flags.iter().chain(&link).map(|s| s.to_string()).collect();
    args.extend([
        format!("-Wl,-T,{}", script.display()),
        "-o".into(),
        out.display().to_string(),
        source.display().to_string(),
    ]);
    compile(&cc, "the guest vDSO", &args);

    let bench = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("tests/programs/vdso_clock.c");
    println!("cargo:rerun-if-changed={}", bench.display());
    let bench_out = out.with_file_name("vdso_clock");
    compile(
        &cc,
        "the syscall bench program",
        &[
            "-O1".into(),
            "-static".into(),
            "-o".into(),
            bench_out.display().to_string(),
            bench.display().to_string(),
        ],
    );
}
