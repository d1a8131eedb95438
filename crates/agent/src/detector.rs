//! Detectors: one per resource, each independent of the others.
//!
//! A detector watches the guest for one resource's needs (the CPU detector: BPF on the
//! scheduler's tracepoints) and reports per-unit transitions (a CPU, a device: want / done). The
//! agent probes each at start (can it load here?), registers the capabilities of those that can,
//! and attaches exactly those the host grants (the first time, what its probe loaded). A new resource's detector is a new module with a
//! [`DetectorKind`] and one line in [`DETECTORS`].

use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use cosched_proto::cpu::Need;
use cosched_proto::Resource;
use libbpf_rs::OpenObject;

use crate::core::Prediction;
use crate::Options;

/// How to bring up the detector of one resource.
pub(crate) struct DetectorKind {
    pub resource: Resource,
    /// Loads it (the kernel verifies its BPF programs) without attaching, with fresh state: at
    /// start, this is the probe (can it run here: kernel support, permissions?), and the agent
    /// keeps what it loaded for the first attach (under TCG a load took about 0.8 s); a later
    /// attach (after a detach) loads afresh.
    pub load: fn(&Options) -> anyhow::Result<Box<dyn Loaded>>,
}

/// A detector loaded, not attached: nothing watched yet.
pub(crate) trait Loaded {
    /// Attaches it to the kernel's hooks.
    fn attach(self: Box<Self>) -> anyhow::Result<Box<dyn Detector>>;
}

/// Every detector this agent has, in the order they are probed and attached.
pub(crate) const DETECTORS: &[DetectorKind] = &[crate::cpu::KIND, crate::io::KIND];

/// One transition of one unit (a CPU for the CPU detector): what it needs now (`None`: nothing).
/// The CPU detector names the need (RT priority, interrupt); the others give `Need::default()`.
/// A change of a wanting unit's need is a transition too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub unit: usize,
    pub want: Option<Need>,
}

/// An attached detector. Dropping it detaches and unloads it.
pub(crate) trait Detector {
    fn resource(&self) -> Resource;
    /// What it watches, for the log (e.g. `2 CPUs`).
    fn units(&self) -> String;
    /// Readable when the detector has transitions to report.
    fn poll_fd(&self) -> RawFd;
    /// Appends the transitions reported since the last call (logging each when `verbose`).
    fn drain(&mut self, verbose: bool, into: &mut Vec<Transition>);
    /// What each unit wants now, read from the detector's own state (the ground truth: events
    /// can be lost).
    fn wants(&self) -> Vec<Option<Need>>;
    /// Its counters, as `name=value` pairs separated by spaces.
    fn stats(&self) -> String;
    /// The guest's next predicted wake-up needing this resource, if the detector predicts.
    fn next_wake(&self) -> Option<Prediction> {
        None
    }
    /// True (once) if a prediction was withdrawn since the last call.
    fn take_withdrawn(&mut self) -> bool {
        false
    }
}

/// The heap storage a BPF skeleton borrows for its whole life (`libbpf_rs::OpenObject`, then the
/// loaded `Object` in its place). Held as a raw pointer, not a `Box`, so that moving its owner
/// does not assert unique access while the skeleton holds a reference into it.
pub(crate) struct ObjectStorage(NonNull<MaybeUninit<OpenObject>>);

impl ObjectStorage {
    pub(crate) fn new() -> ObjectStorage {
        ObjectStorage(NonNull::from(Box::leak(Box::new(MaybeUninit::uninit()))))
    }

    /// The storage, for a skeleton builder's `open`.
    ///
    /// # Safety
    ///
    /// Call it once per storage, and drop the skeleton made from it (and anything made from that)
    /// before the storage: the `'static` must never be observed past the storage's end.
    pub(crate) unsafe fn object(&self) -> &'static mut MaybeUninit<OpenObject> {
        // SAFETY: the pointer is valid for reads and writes until `drop`; the caller promises a
        // single use and that the reference does not outlive the storage.
        unsafe { &mut *self.0.as_ptr() }
    }
}

impl Drop for ObjectStorage {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed only here, once. The
        // skeleton that used it was dropped before (the detectors declare their storage after
        // their skeleton; `object`'s callers drop their skeleton before this storage) and dropped
        // the object it held; a `MaybeUninit` has nothing left to drop.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// `sum_stats` (per-CPU counters added up) and `format_stats` (`name=value ...`) for a counters
/// struct the skeleton generates, by its own field names. The destructuring is exhaustive: a
/// counter added to the BPF interface header and not listed here does not compile.
#[macro_export]
macro_rules! stats_fields {
    ($ty:path; $($field:ident),* $(,)?) => {
        fn sum_stats(per_cpu: impl IntoIterator<Item = $ty>) -> $ty {
            let mut sum = <$ty>::default();
            for s in per_cpu {
                $(sum.$field += s.$field;)*
            }
            sum
        }

        fn format_stats(s: &$ty) -> String {
            let $ty { $($field),* } = *s;
            [$(format!("{}={}", stringify!($field), $field)),*].join(" ")
        }
    };
}

/// A type whose every bit pattern is a valid value, so that it can be read from bytes the kernel
/// wrote (a map value, a ring-buffer record).
///
/// # Safety
///
/// Implement only for `#[repr(C)]` types made of integers, arrays of integers, and other `Plain`
/// types: no `bool`, no Rust `enum`, no pointer or reference.
pub(crate) unsafe trait Plain: Copy {}

/// Reads a `T` from exactly `size_of::<T>()` bytes; `None` if the length differs (a layout that
/// does not match the generated type).
pub(crate) fn read_plain<T: Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `bytes` holds exactly `size_of::<T>()` initialised bytes; `read_unaligned` copies
    // them without any alignment requirement; `T: Plain` makes any bit pattern a valid `T`.
    Some(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(C)]
    struct Pair {
        a: u64,
        b: u32,
        c: u32,
    }
    // SAFETY: repr(C), integers only.
    unsafe impl Plain for Pair {}

    #[test]
    fn reads_plain_data_of_the_exact_size_only() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&7u64.to_ne_bytes());
        bytes.extend_from_slice(&8u32.to_ne_bytes());
        bytes.extend_from_slice(&9u32.to_ne_bytes());
        assert_eq!(read_plain::<Pair>(&bytes), Some(Pair { a: 7, b: 8, c: 9 }));
        // Unaligned source.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(read_plain::<Pair>(&shifted[1..]), Some(Pair { a: 7, b: 8, c: 9 }));
        assert_eq!(read_plain::<Pair>(&bytes[..15]), None);
        assert_eq!(read_plain::<Pair>(&shifted), None);
    }

    #[test]
    fn every_detector_is_listed_once() {
        let mut seen: Vec<Resource> = DETECTORS.iter().map(|d| d.resource).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), DETECTORS.len());
        assert!(seen.iter().all(|r| r.request_kind().is_some()), "a guest detector asks for its resource");
    }
}
