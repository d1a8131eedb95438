//! Builds the BPF program and its Rust skeleton (clang is required; see README).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/cosched.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo")).join("cosched.skel.rs");
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args(["-Isrc/bpf", "-Wall", "-Wno-unused-function"])
        .build_and_generate(&out)
        .expect("building the BPF program (is clang installed?)");
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=src/bpf/intf.h");
}
