//! Builds the BPF programs and their Rust skeletons (clang is required; see README): the CPU
//! detector (`src/bpf/cpu.bpf.c`) and the I/O detector (`src/bpf/io.bpf.c`), one skeleton
//! each; and the watch list's arithmetic (`src/bpf/watch.h`) compiled for the host, a static
//! library only the unit tests link (`src/watch_model.rs`).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

/// Where `vmlinux.h` is (shared with the host's BPF: crate `cosched-bpfutil`).
const VMLINUX_DIR: &str = "../bpfutil/include";

/// (source, skeleton file name, headers it includes besides vmlinux.h).
const PROGRAMS: &[(&str, &str, &[&str])] = &[
    ("src/bpf/cpu.bpf.c", "cpu.skel.rs", &["src/bpf/intf.h", "src/bpf/watch.h"]),
    ("src/bpf/io.bpf.c", "io.skel.rs", &["src/bpf/io_intf.h", "src/bpf/bfq.h"]),
];

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    for (src, skel, headers) in PROGRAMS {
        SkeletonBuilder::new()
            .source(src)
            // -mcpu=v3: the I/O detector's compare-and-swap (BPF atomics, Linux >= 5.12).
            .clang_args(["-Isrc/bpf", &format!("-I{VMLINUX_DIR}"), "-Wall", "-Wno-unused-function", "-mcpu=v3"])
            .build_and_generate(out_dir.join(skel))
            .unwrap_or_else(|e| panic!("building the BPF program {src} (is clang installed?): {e:#}"));
        println!("cargo:rerun-if-changed={src}");
        for h in *headers {
            println!("cargo:rerun-if-changed={h}");
        }
    }
    println!("cargo:rerun-if-changed={VMLINUX_DIR}/vmlinux.h");

    // The unit tests' link to watch.h; no cargo metadata, so that only `#[link]` (in the tests)
    // pulls it in.
    cc::Build::new()
        .file("src/bpf/watch_host.c")
        .include("src/bpf")
        .warnings(true)
        .extra_warnings(true)
        .cargo_metadata(false)
        .compile("cosched_watch_host");
    println!("cargo:rustc-link-search=native={}", out_dir.display());
    println!("cargo:rerun-if-changed=src/bpf/watch_host.c");
    println!("cargo:rerun-if-changed=src/bpf/watch.h");
}
