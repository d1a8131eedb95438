//! The Prometheus metrics a status carries: each is declared on the field it is taken from
//! (`#[derive(Metrics)]`, `#[metric(...)]`, see `cosched-status-derive`), with its name, type
//! and help. What writes them out (the text format, labels of the containers) is the host's
//! `metrics` module.

use std::collections::BTreeMap;

pub use cosched_status_derive::Metrics;

/// A metric's type, as `# TYPE` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// How a metric reads its samples from a `T`: it calls `out(name suffix, labels of the
/// sample, value)` for each.
pub type Samples<T> = fn(&T, &mut dyn FnMut(&str, &str, f64));

/// One metric taken from a status struct `T`.
pub struct Metric<T> {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// Labels every sample carries after its container's (`resource=""`), or empty.
    pub labels: &'static str,
    /// The label of each sample's own key (`reason`, `quantile`), or empty: a map, or quantiles.
    pub by: &'static str,
    /// One sample for a number, one per key of a map, `_bucket`/`_sum`/`_count` lines for a
    /// histogram.
    pub samples: Samples<T>,
}

/// A status struct with metrics on its fields.
pub trait Metrics: Sized + 'static {
    const METRICS: &'static [Metric<Self>];
}

/// What a field gives its metric: samples, each with the labels of its own (`by`: the label's
/// name, for values that are several samples).
pub trait Sample {
    fn each(&self, by: &str, out: &mut dyn FnMut(&str, &str, f64));
}

macro_rules! number {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn each(&self, _by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
                out("", "", *self as f64)
            }
        }
    )*};
}
number!(u8, u32, u64, i64, f64);

impl Sample for bool {
    fn each(&self, _by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        out("", "", *self as u8 as f64)
    }
}

/// Nothing while `None` (a figure the daemon does not have).
impl<T: Sample> Sample for Option<T> {
    fn each(&self, by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        if let Some(v) = self {
            v.each(by, out)
        }
    }
}

/// One sample per key (`reason="budget"`).
impl Sample for BTreeMap<String, u64> {
    fn each(&self, by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        debug_assert!(!by.is_empty(), "a map's metric names its keys' label: #[metric(by = ...)]");
        for (k, n) in self {
            out("", &format!("{by}=\"{k}\""), *n as f64);
        }
    }
}
