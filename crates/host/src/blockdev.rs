//! The block devices under a VM's disk images, and the I/O scheduler each runs: I/O coordination
//! raises a VM on the host's BFQ, so a disk whose device does not run BFQ is one it cannot help.
//!
//! Images come from QEMU's command line (`-drive file=`, `-blockdev` in keyval or JSON form,
//! `-hda`..`-hdd`); the device is the one the image's file system lives on (`st_dev`), or the
//! image itself when it is a block device (`st_rdev`), followed through partitions to their
//! disk and through stacked devices (device mapper, md) to the devices under them, in a `/sys`
//! given as a root path so tests use a fake tree.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// One device under an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    pub image: PathBuf,
    /// The kernel's name (`sda`, `loop0`, `nvme0n1`).
    pub device: String,
    /// The scheduler in use (`bfq`, `mq-deadline`, `none`, ...).
    pub scheduler: String,
    /// Whether the kernel offers BFQ for this device.
    pub bfq_available: bool,
}

impl Disk {
    pub fn runs_bfq(&self) -> bool {
        self.scheduler == "bfq"
    }

    /// What to tell the operator when the device does not run BFQ.
    pub fn warning(&self) -> Option<String> {
        if self.runs_bfq() {
            return None;
        }
        let fix = if self.bfq_available {
            format!("echo bfq > /sys/block/{}/queue/scheduler", self.device)
        } else {
            format!("modprobe bfq && echo bfq > /sys/block/{}/queue/scheduler", self.device)
        };
        Some(format!(
            "disk image {} is on /dev/{}, whose I/O scheduler is {}, not bfq: I/O coordination cannot raise this \
             VM's I/O there (fix: {fix}; to keep it across reboots, a udev rule: ACTION==\"add|change\", \
             KERNEL==\"{}\", ATTR{{queue/scheduler}}=\"bfq\")",
            self.image.display(),
            self.device,
            self.scheduler,
            self.device
        ))
    }
}

/// A disk image on QEMU's command line, and how QEMU submits its I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub path: PathBuf,
    /// `threads` (QEMU's default: a pool of `worker` threads), `native` or `io_uring` (the
    /// disk's own thread: the main loop or its iothread).
    pub aio: String,
}

/// What to tell the operator about a disk whose I/O QEMU's worker pool does.
pub fn aio_warning(image: &Image) -> Option<String> {
    (image.aio == "threads").then(|| {
        format!(
            "disk image {} uses aio=threads (QEMU's default): its I/O is issued by a pool of short-lived worker \
             threads, and raising them did not speed up a start-up in cosched's measurements (results/io-startup); \
             use cache=none,aio=native or aio=io_uring (libvirt: <driver cache='none' io='native'/>)",
            image.path.display()
        )
    })
}

/// The disk images on a QEMU command line (absolute paths; each once).
pub fn images(args: &[String]) -> Vec<Image> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let opt = a.trim_start_matches('-');
        if !a.starts_with('-') {
            continue;
        }
        let Some(v) = (match opt {
            "drive" | "blockdev" | "hda" | "hdb" | "hdc" | "hdd" => it.next(),
            _ => None,
        }) else {
            continue;
        };
        let found = match opt {
            "drive" => keyval(v, "file").map(|f| (f, keyval(v, "aio"))),
            "blockdev" if v.trim_start().starts_with('{') => json_filename(v),
            "blockdev" => keyval(v, "filename").map(|f| (f, keyval(v, "aio"))),
            _ => Some((v.clone(), None)),
        };
        if let Some((f, aio)) = found.filter(|(f, _)| f.starts_with('/')) {
            let path = PathBuf::from(f);
            if !out.iter().any(|i: &Image| i.path == path) {
                out.push(Image { path, aio: aio.unwrap_or_else(|| "threads".into()) });
            }
        }
    }
    out
}

/// `key=value` in QEMU's comma-separated options, where `,,` is a literal comma.
fn keyval(opts: &str, key: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut chars = opts.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
                continue;
            }
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts.into_iter().find_map(|p| p.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// The `filename` of a JSON `-blockdev`, and the `aio` of the node that has it.
fn json_filename(text: &str) -> Option<(String, Option<String>)> {
    fn find(v: &serde_json::Value) -> Option<(String, Option<String>)> {
        match v {
            serde_json::Value::Object(m) => match m.get("filename").and_then(|f| f.as_str()) {
                Some(f) => Some((f.to_string(), m.get("aio").and_then(|a| a.as_str()).map(str::to_string))),
                None => m.values().find_map(find),
            },
            _ => None,
        }
    }
    find(&serde_json::from_str(text).ok()?)
}

/// The device number an image lives on.
pub fn device_number(image: &Path) -> io::Result<(u32, u32)> {
    let md = fs::metadata(image)?;
    let dev = if md.file_type().is_block_device() { md.rdev() } else { md.dev() };
    Ok((libc::major(dev), libc::minor(dev)))
}

/// The devices with a scheduler under device `major:minor`: the disk of a partition, the
/// devices under a stacked one. Empty for a file system with no block device (tmpfs, NFS).
pub fn devices(sys: &Path, major: u32, minor: u32) -> Vec<(String, PathBuf)> {
    let Ok(dir) = fs::canonicalize(sys.join(format!("dev/block/{major}:{minor}"))) else { return Vec::new() };
    let mut out = Vec::new();
    walk(&dir, &mut out, 0);
    out
}

fn walk(dir: &Path, out: &mut Vec<(String, PathBuf)>, depth: u32) {
    if depth > 8 {
        return;
    }
    // A partition: its disk is the parent directory.
    let dir =
        if dir.join("partition").exists() { dir.parent().unwrap_or(dir).to_path_buf() } else { dir.to_path_buf() };
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let slaves: Vec<PathBuf> = fs::read_dir(dir.join("slaves"))
        .map(|d| d.flatten().filter_map(|e| fs::canonicalize(e.path()).ok()).collect())
        .unwrap_or_default();
    if slaves.is_empty() {
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, dir));
        }
    } else {
        for s in slaves {
            walk(&s, out, depth + 1);
        }
    }
}

/// The scheduler line of a device: (in use, offered). `[mq-deadline] kyber bfq none`.
pub fn parse_scheduler(text: &str) -> (String, Vec<String>) {
    let mut current = String::from("none");
    let mut all = Vec::new();
    for w in text.split_whitespace() {
        let name = w.trim_start_matches('[').trim_end_matches(']');
        if w.starts_with('[') {
            current = name.to_string();
        }
        all.push(name.to_string());
    }
    (current, all)
}

/// The devices under each of `images` (see [`images`]), with their schedulers. An image that
/// cannot be looked at (gone, no permission) is skipped: this is advice, not a condition.
pub fn disks(sys: &Path, images: &[Image]) -> Vec<Disk> {
    let mut out = Vec::new();
    for Image { path: image, .. } in images {
        let Ok((major, minor)) = device_number(image) else { continue };
        for (device, dir) in devices(sys, major, minor) {
            let Ok(text) = fs::read_to_string(dir.join("queue/scheduler")) else { continue };
            let (scheduler, offered) = parse_scheduler(&text);
            out.push(Disk {
                image: image.clone(),
                device,
                scheduler,
                bfq_available: offered.iter().any(|s| s == "bfq"),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn finds_images_in_every_form_qemu_takes() {
        let a = args(&[
            "qemu-system-x86_64",
            "-drive",
            "file=/img/a,,b.raw,if=none,id=d0,format=raw,cache=none",
            "-blockdev",
            r#"{"driver":"qcow2","node-name":"n1","file":{"driver":"file","filename":"/var/lib/libvirt/images/x.qcow2","aio":"native"}}"#,
            "-blockdev",
            "driver=file,node-name=n2,filename=/img/c.raw,aio=io_uring",
            "-hda",
            "/img/d.raw",
            "-drive",
            "if=none,id=cd", // no file
            "-drive",
            "file=relative.raw", // relative paths are QEMU's cwd: not followed
            "-name",
            "file=/not/an/image",
        ]);
        let all = images(&a);
        let found: Vec<(String, &str)> = all.iter().map(|i| (i.path.display().to_string(), i.aio.as_str())).collect();
        let want = [
            ("/img/a,b.raw", "threads"),
            ("/var/lib/libvirt/images/x.qcow2", "native"),
            ("/img/c.raw", "io_uring"),
            ("/img/d.raw", "threads"),
        ];
        assert_eq!(found, want.map(|(p, a)| (p.to_string(), a)));
        let threaded: Vec<_> = all.iter().filter_map(aio_warning).collect();
        assert_eq!(threaded.len(), 2, "{threaded:?}");
        assert!(threaded[0].contains("/img/a,b.raw uses aio=threads") && threaded[0].contains("aio=native"));
    }

    #[test]
    fn reads_the_scheduler_line() {
        assert_eq!(parse_scheduler("[mq-deadline] kyber bfq none\n").0, "mq-deadline");
        let (cur, all) = parse_scheduler("mq-deadline kyber [bfq] none");
        assert_eq!((cur.as_str(), all.len()), ("bfq", 4));
        assert_eq!(parse_scheduler("none").0, "none");
    }

    #[test]
    fn follows_partitions_and_stacked_devices_on_a_fake_sys() {
        let d = tempfile::tempdir().unwrap();
        let sys = d.path();
        let dev = |p: &str| sys.join("devices").join(p);
        for p in ["sda/sda1", "loop0", "dm-0/slaves", "nvme0n1"] {
            fs::create_dir_all(dev(p)).unwrap();
        }
        fs::write(dev("sda/sda1/partition"), "1").unwrap();
        fs::write(dev("sda/queue_placeholder"), "").unwrap();
        fs::create_dir_all(dev("sda/queue")).unwrap();
        fs::write(dev("sda/queue/scheduler"), "mq-deadline kyber [bfq] none").unwrap();
        fs::create_dir_all(dev("loop0/queue")).unwrap();
        fs::write(dev("loop0/queue/scheduler"), "[none] mq-deadline").unwrap();
        std::os::unix::fs::symlink(dev("nvme0n1"), dev("dm-0/slaves/nvme0n1")).unwrap();
        fs::create_dir_all(sys.join("dev/block")).unwrap();
        for (n, p) in [("8:1", "sda/sda1"), ("7:0", "loop0"), ("253:0", "dm-0")] {
            std::os::unix::fs::symlink(dev(p), sys.join("dev/block").join(n)).unwrap();
        }
        let names = |maj, min| devices(sys, maj, min).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(8, 1), ["sda"], "a partition is on its disk");
        assert_eq!(names(7, 0), ["loop0"]);
        assert_eq!(names(253, 0), ["nvme0n1"], "device mapper: the device under it");
        assert!(names(0, 40).is_empty(), "tmpfs has no block device");
        let disk = Disk { image: "/i".into(), device: "loop0".into(), scheduler: "none".into(), bfq_available: false };
        let w = disk.warning().unwrap();
        assert!(
            w.contains("/dev/loop0") && w.contains("modprobe bfq && echo bfq > /sys/block/loop0/queue/scheduler"),
            "{w}"
        );
        let bfq = Disk { scheduler: "bfq".into(), bfq_available: true, ..disk };
        assert_eq!(bfq.warning(), None);
    }
}
