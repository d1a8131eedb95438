//! Detectors: one per resource, each independent of the others.
//!
//! A detector watches the guest for one resource's needs (the CPU detector: BPF on the
//! scheduler's tracepoints) and reports per-unit transitions (a CPU, a device: want / done). The
//! agent probes each at start (can it load here?), registers the capabilities of those that can,
//! and attaches exactly those the host grants (the first time, what its probe loaded). A new resource's detector is a new module with a
//! [`DetectorKind`] and one line in [`DETECTORS`].

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;

pub(crate) use cosched_bpfutil::{bytes_of, read_plain, ObjectStorage, Plain};
use cosched_proto::cpu::Need;
use cosched_proto::Resource;

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

/// A ring buffer over `map` whose records, read as `T` (C type `what`), are appended to the
/// returned queue as they are consumed; a record of another size is logged (as the `detector`
/// detector's) and skipped.
pub(crate) fn event_ring<T: Plain + 'static>(
    map: &dyn libbpf_rs::MapCore,
    detector: &'static str,
    what: &'static str,
) -> anyhow::Result<(libbpf_rs::RingBuffer<'static>, Rc<RefCell<Vec<T>>>)> {
    let events = Rc::new(RefCell::new(Vec::new()));
    let sink = events.clone();
    let mut rb = libbpf_rs::RingBufferBuilder::new();
    rb.add(map, move |data: &[u8]| {
        match read_plain::<T>(data) {
            Some(e) => sink.borrow_mut().push(e),
            None => crate::log(&format!("{detector}: a {}-byte ring-buffer record is not a {what}", data.len())),
        }
        0
    })?;
    Ok((rb.build()?, events))
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
    /// The window of the standing prediction the host took (`None`: none): RT activations inside
    /// it send nothing.
    fn set_standing(&mut self, _window: Option<crate::core::StandingWindow>) {}
    /// RT activations kept silent in a standing window so far (a running count).
    fn silent_activations(&self) -> u64 {
        0
    }
    /// How many RT activations found their CPU boosted already since the last call (only with
    /// `--probe-frames`: the points where the channel probe sends its frame).
    fn take_episodes(&mut self) -> u64 {
        0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_detector_is_listed_once() {
        let mut seen: Vec<Resource> = DETECTORS.iter().map(|d| d.resource).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), DETECTORS.len());
        assert!(seen.iter().all(|r| r.request_kind().is_some()), "a guest detector asks for its resource");
    }
}
