//! I/O coordination (after the Virtual-BFQ paper): a VM is raised while its guest's BFQ has
//! weight-raised busy queues (`IO 1` .. `IO 0`).
//!
//! The I/O resource has no rules of its own beyond what every resource shares (operator
//! switches, rate limits, the continuous and share budgets): unlike the CPU there is no host
//! capacity to reserve, since BFQ still serves every other queue, only less often.

use cosched_proto::Resource;

use crate::resource::ResourcePolicy;

#[derive(Debug, Default)]
pub struct IoPolicy;

impl ResourcePolicy for IoPolicy {
    fn resource(&self) -> Resource {
        Resource::Io
    }
}
