//! Builds the guest's vDSO (vdso/vdso.c, laid out by vdso/vdso.lds) with the system C compiler
//! ($CC or `cc`; gcc on Debian, from build-essential) into $OUT_DIR/vdso.so, which
//! `vdso::IMAGE` embeds. No binary is kept in the repository.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("vdso");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("vdso.so");
    let (source, script) = (dir.join("vdso.c"), dir.join("vdso.lds"));
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        // Position-independent, no libc, no stack protector or PLT: the object must need no
        // relocation and call nothing (glibc does not relocate a vDSO).
        .args(["-O2", "-fPIC", "-ffreestanding", "-fno-builtin", "-fno-stack-protector", "-fno-plt", "-fcf-protection=none", "-nostdlib", "-shared"])
        .args(["-Wall", "-Wextra", "-Werror"])
        .arg(format!("-Wl,-T,{}", script.display()))
        .args(["-Wl,--hash-style=both", "-Wl,-Bsymbolic", "-Wl,-soname=linux-vdso.so.1", "-Wl,--no-undefined", "-Wl,-z,noexecstack", "-Wl,--eh-frame-hdr", "-Wl,--build-id=none"])
        .arg("-o")
        .arg(&out)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("building the guest vDSO needs a C compiler (`{cc}`; set CC to choose another; on Debian: apt-get install gcc): {e}"));
    assert!(status.success(), "{cc} failed to build the guest vDSO from {}", source.display());
}
