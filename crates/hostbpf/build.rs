//! Builds the BPF programs and their Rust skeleton (clang is required; see README).
//!
//! Kernel types come from the guest agent's `vmlinux.h` (a Debian 6.1 kernel's BTF) through an
//! include path: the programs use CO-RE, so libbpf fixes field offsets for the running kernel.

use std::env;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/threads.bpf.c";
const VMLINUX_DIR: &str = "../agent/src/bpf";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo")).join("threads.skel.rs");
    let vmlinux = Path::new(VMLINUX_DIR).join("vmlinux.h");
    assert!(vmlinux.exists(), "{} is missing: the BPF programs take kernel types from it", vmlinux.display());
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args(["-Isrc/bpf", &format!("-I{VMLINUX_DIR}"), "-Wall", "-Wno-unused-function"])
        .build_and_generate(&out)
        .expect("building the BPF programs (is clang installed?)");
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=src/bpf/intf.h");
    println!("cargo:rerun-if-changed={}", vmlinux.display());
}
