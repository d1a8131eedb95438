//! Builds the BPF programs and their Rust skeleton (clang is required; see README).
//!
//! Kernel types come from `crates/bpfutil/include/vmlinux.h` (a Debian 6.1 kernel's BTF, shared
//! with the guest agent) through an include path: the programs use CO-RE, so libbpf fixes field
//! offsets for the running kernel.

use std::env;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

/// (source, skeleton file): the thread watch and the FEAS event detection.
const PROGRAMS: [(&str, &str); 2] =
    [("src/bpf/threads.bpf.c", "threads.skel.rs"), ("src/bpf/feas.bpf.c", "feas.skel.rs")];
const VMLINUX_DIR: &str = "../bpfutil/include";

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let vmlinux = Path::new(VMLINUX_DIR).join("vmlinux.h");
    assert!(vmlinux.exists(), "{} is missing: the BPF programs take kernel types from it", vmlinux.display());
    for (src, skel) in PROGRAMS {
        SkeletonBuilder::new()
            .source(src)
            .clang_args(["-Isrc/bpf", &format!("-I{VMLINUX_DIR}"), "-Wall", "-Wno-unused-function"])
            .build_and_generate(out_dir.join(skel))
            .unwrap_or_else(|e| panic!("building {src} (is clang installed?): {e:#}"));
        println!("cargo:rerun-if-changed={src}");
    }
    println!("cargo:rerun-if-changed=src/bpf/intf.h");
    println!("cargo:rerun-if-changed=src/bpf/feas_intf.h");
    println!("cargo:rerun-if-changed={}", vmlinux.display());
}
