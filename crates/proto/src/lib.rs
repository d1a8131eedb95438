//! cosched wire protocol, version 1 (see docs/architecture.md, "The wire protocol (v1)").
//!
//! Fixed 16-byte little-endian frames in both directions:
//!
//! | bytes | field   | meaning                                   |
//! |-------|---------|-------------------------------------------|
//! | 0-1   | magic   | `0x43 0x53` ("CS")                        |
//! | 2     | version | 1                                         |
//! | 3     | type    | [`Kind`]                                  |
//! | 4-7   | seq     | sender's sequence number; replies echo it |
//! | 8-15  | value   | type-specific u64                         |
//!
//! This crate does no I/O: [`Frame::encode`] / [`Frame::decode`] work on one frame,
//! [`StreamDecoder`] turns an arbitrary byte stream (the virtio-serial channel) into frames and
//! resynchronises after garbage. The byte-exact test vectors every implementation reads are in
//! `testdata/wire-v1.json` at the repository root.

use std::fmt;

/// Length of every frame.
pub const FRAME_LEN: usize = 16;
/// Bytes 0-1 of every frame ("CS").
pub const MAGIC: [u8; 2] = [0x43, 0x53];
/// Byte 2 of every frame.
pub const VERSION: u8 = 1;
/// What a frame starts with; the stream decoder resynchronises on it.
pub const HEADER: [u8; 3] = [MAGIC[0], MAGIC[1], VERSION];

/// Capability bits (value of `REGISTER`, `ACK` to a `REGISTER`, `DISABLE`, `ENABLE`, and bits
/// 8-15 of a `DENY`): one per [`Resource`].
pub mod caps {
    pub const CPU: u64 = 1;
    pub const IO: u64 = 2;
    pub const MEMBW: u64 = 4;
    /// Host-originated event boosting (FEAS): never asked for by a guest, never granted to one.
    pub const EVENT: u64 = 8;
    /// Every capability this version of the protocol knows.
    pub const ALL: u64 = CPU | IO | MEMBW | EVENT;

    /// Human-readable list, e.g. `cpu,io`; `none` for 0.
    pub fn names(bits: u64) -> String {
        let mut out: Vec<String> =
            super::Resource::ALL.iter().filter(|r| bits & r.cap() != 0).map(|r| r.name().to_string()).collect();
        let unknown = bits & !ALL;
        if unknown != 0 {
            out.push(format!("{unknown:#x}"));
        }
        if out.is_empty() {
            "none".into()
        } else {
            out.join(",")
        }
    }
}

/// What the host can privilege a VM's threads on. A resource is data: the coordinator, the
/// actuators, the state records, `DENY` and the metrics all carry one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// CPU scheduling of the VM's threads (`CPU 1` / `CPU 0`).
    Cpu,
    /// I/O priority of the VM's I/O-issuing threads (`IO 1` / `IO 0`).
    Io,
    /// A share of memory bandwidth (`MEMBW <permille>`).
    Membw,
    /// A boost the host starts on its own when an event for the VM arrives (FEAS).
    Event,
}

impl Resource {
    pub const ALL: [Resource; 4] = [Resource::Cpu, Resource::Io, Resource::Membw, Resource::Event];

    /// Its capability bit.
    pub fn cap(self) -> u64 {
        match self {
            Resource::Cpu => caps::CPU,
            Resource::Io => caps::IO,
            Resource::Membw => caps::MEMBW,
            Resource::Event => caps::EVENT,
        }
    }

    pub fn from_cap(bit: u64) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.cap() == bit)
    }

    /// Every resource whose bit is set in `bits`.
    pub fn in_caps(bits: u64) -> impl Iterator<Item = Resource> {
        Resource::ALL.into_iter().filter(move |r| bits & r.cap() != 0)
    }

    /// Lower-case name used in config keys, status, metrics labels and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Io => "io",
            Resource::Membw => "membw",
            Resource::Event => "event",
        }
    }

    pub fn from_name(s: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.name() == s)
    }

    /// The frame a guest sends to ask for it; `None` for a host-originated resource.
    pub fn request_kind(self) -> Option<Kind> {
        match self {
            Resource::Cpu => Some(Kind::Cpu),
            Resource::Io => Some(Kind::Io),
            Resource::Membw => Some(Kind::Membw),
            Resource::Event => None,
        }
    }

    /// The resource a guest frame asks for (`CPU`, `IO`, `MEMBW`).
    pub fn of_kind(kind: Kind) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.request_kind() == Some(kind))
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    Register = 1,
    Deregister = 2,
    Cpu = 3,
    Io = 4,
    Membw = 5,
    /// The guest's next real-time wake-up is due in `value & 0xffff_ffff` µs (bits 32-39: the
    /// RT priority of the task it wakes); `0` withdraws the prediction. See [`wake`].
    Wake = 6,
    Ack = 0x80,
    Deny = 0x81,
    Disable = 0x82,
    Enable = 0x83,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Register,
        Kind::Deregister,
        Kind::Cpu,
        Kind::Io,
        Kind::Membw,
        Kind::Wake,
        Kind::Ack,
        Kind::Deny,
        Kind::Disable,
        Kind::Enable,
    ];

    pub fn from_u8(b: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == b)
    }

    /// Upper-case protocol name, as in docs/architecture.md and the test vectors.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Register => "REGISTER",
            Kind::Deregister => "DEREGISTER",
            Kind::Cpu => "CPU",
            Kind::Io => "IO",
            Kind::Membw => "MEMBW",
            Kind::Wake => "WAKE",
            Kind::Ack => "ACK",
            Kind::Deny => "DENY",
            Kind::Disable => "DISABLE",
            Kind::Enable => "ENABLE",
        }
    }

    pub fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Frames a guest sends (the host replies to each with exactly one ACK or DENY).
    pub fn is_guest_to_host(self) -> bool {
        (self as u8) < 0x80
    }
}

/// Value of a `DENY` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum DenyReason {
    /// Coordination is disabled by the operator (globally or for this VM).
    Disabled = 1,
    /// The host does not support this capability.
    Unsupported = 2,
    /// A boost budget (continuous time or share of a window) is exhausted.
    Budget = 3,
    /// The frame could not be decoded.
    Malformed = 4,
    /// The guest sends frames faster than the host accepts them.
    RateLimited = 5,
    /// The guest has not registered (or was deregistered).
    NotRegistered = 6,
    /// The host keeps this much of the resource for itself (the CPU's host reserve): the boost
    /// would take it. Like `budget`, it passes when other VMs deboost.
    HostReserve = 7,
}

impl DenyReason {
    pub const ALL: [DenyReason; 7] = [
        DenyReason::Disabled,
        DenyReason::Unsupported,
        DenyReason::Budget,
        DenyReason::Malformed,
        DenyReason::RateLimited,
        DenyReason::NotRegistered,
        DenyReason::HostReserve,
    ];

    pub fn from_u64(v: u64) -> Option<DenyReason> {
        DenyReason::ALL.into_iter().find(|r| *r as u64 == v)
    }

    /// Snake-case name used in status output and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            DenyReason::Disabled => "disabled",
            DenyReason::Unsupported => "unsupported",
            DenyReason::Budget => "budget",
            DenyReason::Malformed => "malformed",
            DenyReason::RateLimited => "rate_limited",
            DenyReason::NotRegistered => "not_registered",
            DenyReason::HostReserve => "host_reserve",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One decoded frame. `value` is type-specific; the typed accessors below check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    pub kind: Kind,
    pub seq: u32,
    pub value: u64,
}

/// Why 16 bytes are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// bad magic {0:#04x} {1:#04x} (expected 0x43 0x53)
    #[error("bad magic {0:#04x} {1:#04x} (expected 0x43 0x53)")]
    BadMagic(u8, u8),
    #[error("unsupported protocol version {0} (this side speaks 1)")]
    BadVersion(u8),
    #[error("unknown frame type {kind:#04x} (seq {seq})")]
    UnknownType { kind: u8, seq: u32 },
    #[error("invalid value {value} for {kind} (seq {seq})")]
    InvalidValue { kind: &'static str, seq: u32, value: u64 },
}

impl DecodeError {
    /// The sequence number to echo in the `DENY(malformed)` reply, when the header was readable.
    pub fn seq(&self) -> Option<u32> {
        match *self {
            DecodeError::UnknownType { seq, .. } | DecodeError::InvalidValue { seq, .. } => Some(seq),
            _ => None,
        }
    }

    /// Short stable name (test vectors, logs).
    pub fn name(&self) -> &'static str {
        match self {
            DecodeError::BadMagic(..) => "bad_magic",
            DecodeError::BadVersion(_) => "bad_version",
            DecodeError::UnknownType { .. } => "unknown_type",
            DecodeError::InvalidValue { .. } => "invalid_value",
        }
    }
}

impl Frame {
    pub fn new(kind: Kind, seq: u32, value: u64) -> Frame {
        Frame { kind, seq, value }
    }

    pub fn register(seq: u32, caps: u64) -> Frame {
        Frame::new(Kind::Register, seq, caps)
    }
    pub fn deregister(seq: u32) -> Frame {
        Frame::new(Kind::Deregister, seq, 0)
    }
    pub fn cpu(seq: u32, boost: bool) -> Frame {
        Frame::new(Kind::Cpu, seq, boost as u64)
    }
    /// `CPU 1` that names the guest's need (RT priority, interrupt handling): see [`cpu`].
    pub fn cpu_rt(seq: u32, need: cpu::Need) -> Frame {
        Frame::new(Kind::Cpu, seq, need.encode())
    }
    /// `CPU 0` that carries the guest's next RT wake-up, due in `delay_us` µs (> 0) for a task
    /// at `priority`: see [`cpu`].
    pub fn cpu_deboost_wake(seq: u32, delay_us: u32, priority: u8) -> Frame {
        Frame::new(Kind::Cpu, seq, cpu::deboost_wake(delay_us, priority))
    }
    /// `WAKE`: the guest's next RT wake-up is due in `delay_us` µs (0: withdrawn), for a task at
    /// `priority`. See [`wake`].
    pub fn wake(seq: u32, delay_us: u32, priority: u8) -> Frame {
        Frame::new(Kind::Wake, seq, wake::encode(delay_us, priority))
    }
    /// A standing `WAKE`: due in `delay_us` µs (> 0), then every `period_us` µs. See [`wake`].
    pub fn wake_standing(seq: u32, delay_us: u32, priority: u8, period_us: u32) -> Frame {
        Frame::new(Kind::Wake, seq, wake::encode_standing(delay_us, priority, period_us))
    }
    pub fn ack(seq: u32, value: u64) -> Frame {
        Frame::new(Kind::Ack, seq, value)
    }
    /// A denial that concerns no one resource (a `REGISTER`, a malformed frame).
    pub fn deny(seq: u32, reason: DenyReason) -> Frame {
        Frame::new(Kind::Deny, seq, reason as u64)
    }
    /// A denial of `resource`: its capability bit in bits 8-15, the reason in bits 0-7. The host's
    /// own end of a boost (seq 0) names its resource this way too.
    pub fn deny_for(seq: u32, resource: Resource, reason: DenyReason) -> Frame {
        Frame::new(Kind::Deny, seq, reason as u64 | resource.cap() << 8)
    }
    /// Unsolicited: the operator turned these capabilities off.
    pub fn disable(caps: u64) -> Frame {
        Frame::new(Kind::Disable, 0, caps)
    }
    /// Unsolicited: the operator turned these capabilities back on.
    pub fn enable(caps: u64) -> Frame {
        Frame::new(Kind::Enable, 0, caps)
    }

    pub fn encode(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        b[..3].copy_from_slice(&HEADER);
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// Decodes one frame and checks that its value is valid for its type:
    /// `CPU` takes 0, a boost with its need, or a deboost with the next wake-up (see [`cpu`]),
    /// `IO` 0 or 1, `MEMBW` at most 1000 permille, `DEREGISTER` 0, `DENY` a known reason
    /// and at most one known resource.
    /// Unknown capability bits are not an error (a newer guest may offer more than we grant).
    pub fn decode(b: &[u8; FRAME_LEN]) -> Result<Frame, DecodeError> {
        if b[..2] != MAGIC {
            return Err(DecodeError::BadMagic(b[0], b[1]));
        }
        if b[2] != VERSION {
            return Err(DecodeError::BadVersion(b[2]));
        }
        let seq = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[8..16]);
        let value = u64::from_le_bytes(v);
        let kind = Kind::from_u8(b[3]).ok_or(DecodeError::UnknownType { kind: b[3], seq })?;
        let valid = match kind {
            Kind::Cpu => cpu::valid(value),
            Kind::Io => value <= 1,
            Kind::Wake => wake::valid(value),
            Kind::Membw => value <= 1000,
            Kind::Deregister => value == 0,
            Kind::Deny => {
                DenyReason::from_u64(value & 0xff).is_some()
                    && value >> 16 == 0
                    && (value >> 8 == 0 || Resource::from_cap(value >> 8).is_some())
            }
            Kind::Register | Kind::Ack | Kind::Disable | Kind::Enable => true,
        };
        if !valid {
            return Err(DecodeError::InvalidValue { kind: kind.name(), seq, value });
        }
        Ok(Frame { kind, seq, value })
    }

    /// For a `DENY` frame, its reason.
    pub fn deny_reason(&self) -> Option<DenyReason> {
        (self.kind == Kind::Deny).then(|| DenyReason::from_u64(self.value & 0xff)).flatten()
    }

    /// For a `DENY` frame, the resource it concerns (`None`: the registration, a malformed frame).
    pub fn deny_resource(&self) -> Option<Resource> {
        (self.kind == Kind::Deny).then(|| Resource::from_cap(self.value >> 8 & 0xff)).flatten()
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.deny_reason(), self.deny_resource()) {
            (Some(r), Some(res)) => write!(f, "DENY({res}: {r}) seq={}", self.seq),
            (Some(r), None) => write!(f, "DENY({r}) seq={}", self.seq),
            _ => write!(f, "{}({}) seq={}", self.kind.name(), self.value, self.seq),
        }
    }
}

/// The value of a `CPU` frame.
///
/// | bits  | meaning                                                                      |
/// |-------|------------------------------------------------------------------------------|
/// | 0     | 1: boost, 0: deboost                                                         |
/// | 8-15  | the RT priority (1..=99) of the highest-priority task the guest must run; 0: not given |
/// | 16    | the guest is handling an interrupt                                           |
///
/// Every other bit is 0, and a plain deboost (`CPU 0`) is exactly 0. An agent that sends plain
/// `CPU 1` (as protocol v1 first had it) gets what it always got: the VM's own priority.
///
/// **A deboost that carries the next wake-up** (`CPU 0` and `WAKE` in one frame, so one frame
/// per deboost goes through the channel instead of two): bit 0 is 0, bit 17 is 1, bits 8-15 the
/// RT priority (0..=99) of the task that wakes next, bits 32-63 the delay in µs until it wakes
/// (not 0: a deboost with no wake-up is plain `CPU 0`); every other bit 0. The host deboosts as
/// for `CPU 0`, then takes the delay as a `WAKE`'s; its one reply is the `WAKE`'s (`ACK` with the
/// delay it will boost after, or `DENY(cpu: ...)`, which refuses the prediction only: the
/// deboost is done either way). A host older than this form refuses it as malformed (and does
/// not deboost): the agent then sends `CPU 0` and `WAKE` apart, until it registers again.
pub mod cpu {
    /// The highest RT priority a guest can name (Linux: `MAX_RT_PRIO - 1`).
    pub const MAX_GUEST_PRIORITY: u8 = 99;
    const IRQ: u64 = 1 << 16;
    /// A deboost that carries the next wake-up (see the module).
    pub const WAKE: u64 = 1 << 17;

    /// What a guest's `CPU 1` says it needs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Need {
        /// 0: not given; else the guest task's RT priority (1..=99).
        pub priority: u8,
        /// The guest is in an interrupt handler.
        pub irq: bool,
    }

    impl Need {
        pub fn encode(self) -> u64 {
            1 | (self.priority.min(MAX_GUEST_PRIORITY) as u64) << 8 | if self.irq { IRQ } else { 0 }
        }

        /// The need a valid `CPU` value carries (`None` for `CPU 0`).
        pub fn decode(value: u64) -> Option<Need> {
            (value & 1 == 1).then_some(Need { priority: (value >> 8 & 0xff) as u8, irq: value & IRQ != 0 })
        }
    }

    /// The value of a deboost that carries the next wake-up, due in `delay_us` µs (not 0) for a
    /// task of RT priority `priority`.
    pub fn deboost_wake(delay_us: u32, priority: u8) -> u64 {
        WAKE | (priority.min(MAX_GUEST_PRIORITY) as u64) << 8 | (delay_us as u64) << 32
    }

    /// For a deboost that carries the next wake-up: (delay in µs, priority). `None` for any other
    /// value (a boost, plain `CPU 0`).
    pub fn wake_of(value: u64) -> Option<(u32, u8)> {
        (value & (WAKE | 1) == WAKE).then_some(((value >> 32) as u32, (value >> 8 & 0xff) as u8))
    }

    pub(crate) fn valid(value: u64) -> bool {
        let priority_ok = (value >> 8 & 0xff) <= MAX_GUEST_PRIORITY as u64;
        let boost = value & !(0xff01 | IRQ) == 0 && value & 1 == 1 && priority_ok;
        let deboost_wake = value & !(0xffff_ffff_0000_0000 | 0xff00 | WAKE) == 0
            && value & WAKE != 0
            && value >> 32 != 0
            && priority_ok;
        value == 0 || boost || deboost_wake
    }
}

/// The value of a `WAKE` frame: bits 0-31 the delay in µs from when the guest sends the frame to
/// its next real-time wake-up (0: the guest withdraws its prediction), bits 32-39 the RT
/// priority (0..=99) of the task that wakes, bits 40-63 a period in µs (0: one wake-up). Delays
/// are relative, so the two sides' clocks need not agree; the agent subtracts half its measured
/// round trip (the frame's travel) before sending. The host answers `ACK` with the delay it will
/// boost after, or `DENY(cpu: ...)`.
///
/// A period makes the prediction *standing*: the wake-ups are due at the delay and every period
/// after it, and the host boosts for each by itself, with no frame from the guest, until the
/// guest withdraws it (`WAKE 0`), replaces it (a new `WAKE`) or sends `CPU 1` (its wake-ups left
/// the pattern). The `ACK` to a standing `WAKE` carries, in bits 32-63, how long (µs) the host
/// holds each period's boost after its wake-up is due. A host older than this form refuses it as
/// malformed; a host that will not boost so often refuses it with `DENY(cpu: budget)`, and one
/// that stops on its own (a budget) sends `DENY(cpu: budget)` with seq 0.
pub mod wake {
    /// The longest period a standing prediction can name (24 bits of µs: 16.7 s).
    pub const MAX_PERIOD_US: u32 = (1 << 24) - 1;

    pub fn encode(delay_us: u32, priority: u8) -> u64 {
        delay_us as u64 | (priority.min(super::cpu::MAX_GUEST_PRIORITY) as u64) << 32
    }

    /// A standing prediction: due in `delay_us` µs, then every `period_us` µs (at most
    /// [`MAX_PERIOD_US`]).
    pub fn encode_standing(delay_us: u32, priority: u8, period_us: u32) -> u64 {
        encode(delay_us, priority) | (period_us.min(MAX_PERIOD_US) as u64) << 40
    }

    /// (delay in µs, priority).
    pub fn decode(value: u64) -> (u32, u8) {
        (value as u32, (value >> 32 & 0xff) as u8)
    }

    /// The period of a standing prediction in µs (0: one wake-up).
    pub fn period_of(value: u64) -> u32 {
        (value >> 40) as u32
    }

    /// The `ACK` to a standing `WAKE`: the delay the host boosts after (µs), and how long it holds
    /// each period's boost after the wake-up is due (µs).
    pub fn standing_ack(after_us: u64, hold_us: u64) -> u64 {
        after_us.min(u32::MAX as u64) | hold_us.min(u32::MAX as u64) << 32
    }

    /// (delay the host boosts after, hold after each due wake-up), µs, of a standing `ACK`.
    pub fn decode_standing_ack(value: u64) -> (u32, u32) {
        (value as u32, (value >> 32) as u32)
    }

    pub(crate) fn valid(value: u64) -> bool {
        (value >> 32 & 0xff) <= super::cpu::MAX_GUEST_PRIORITY as u64 && (period_of(value) == 0 || value as u32 != 0)
    }
}

/// What the stream decoder yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Frame(Frame),
    /// A 16-byte frame with a valid header but an unknown type or invalid value; it was consumed.
    Malformed(DecodeError),
    /// `skipped` bytes that do not start a frame were dropped while resynchronising on the next
    /// `43 53 01`.
    Garbage {
        skipped: usize,
    },
}

/// Turns a byte stream into frames.
///
/// The channel is a byte stream with no framing of its own, so after bad bytes the decoder skips
/// to the next `43 53 01` and reads frames from there. Skipped bytes are reported as one
/// [`Event::Garbage`] per contiguous run within what has been pushed so far, so a guest that keeps
/// writing garbage produces an event per read and trips the host's malformed-frame rate limit.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    buf: Vec<u8>,
}

/// The decoder never buffers more than this: a partial frame plus whatever one read brings.
const MAX_BUFFERED: usize = 64 * 1024;

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Appends bytes read from the channel. Call [`StreamDecoder::next_event`] until it returns
    /// `None` afterwards; `push` more than 64 KiB without draining and the oldest bytes are lost.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > MAX_BUFFERED {
            let drop = self.buf.len() - MAX_BUFFERED;
            self.buf.drain(..drop);
        }
    }

    /// Bytes buffered but not yet decoded (a partial frame).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    pub fn next_event(&mut self) -> Option<Event> {
        if self.buf.len() >= HEADER.len() && self.buf[..3] == HEADER {
            if self.buf.len() < FRAME_LEN {
                return None;
            }
            let mut b = [0u8; FRAME_LEN];
            b.copy_from_slice(&self.buf[..FRAME_LEN]);
            self.buf.drain(..FRAME_LEN);
            return Some(match Frame::decode(&b) {
                Ok(f) => Event::Frame(f),
                Err(e) => Event::Malformed(e),
            });
        }
        // Not at a header: skip to the next one, or to a header prefix at the end of the buffer.
        let skipped = find_header_or_prefix(&self.buf);
        if skipped == 0 {
            return None; // the buffer is a proper prefix of a header: wait for more bytes
        }
        self.buf.drain(..skipped);
        Some(Event::Garbage { skipped })
    }
}

/// Offset of the first position in `buf[1..]` (or 0 if `buf` itself is a header prefix) where a
/// header starts, or where a proper prefix of a header runs to the end of `buf`; `buf.len()` if
/// neither.
fn find_header_or_prefix(buf: &[u8]) -> usize {
    let is_start = |i: usize| {
        let tail = &buf[i..];
        let n = tail.len().min(HEADER.len());
        tail[..n] == HEADER[..n]
    };
    if buf.len() < HEADER.len() && is_start(0) {
        return 0;
    }
    (1..buf.len()).find(|&i| is_start(i)).unwrap_or(buf.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_kind() {
        for kind in Kind::ALL {
            let value = match kind {
                Kind::Deny => DenyReason::Budget as u64,
                Kind::Deregister => 0,
                _ => 1,
            };
            let f = Frame::new(kind, 0xdead_beef, value);
            assert_eq!(Frame::decode(&f.encode()), Ok(f));
        }
    }

    #[test]
    fn garbage_is_reported_per_read() {
        let mut d = StreamDecoder::new();
        d.push(b"hello ");
        assert_eq!(d.next_event(), Some(Event::Garbage { skipped: 6 }));
        assert_eq!(d.next_event(), None);
        d.push(b"world");
        assert_eq!(d.next_event(), Some(Event::Garbage { skipped: 5 }));
        d.push(&Frame::cpu(3, true).encode());
        assert_eq!(d.next_event(), Some(Event::Frame(Frame::cpu(3, true))));
        assert_eq!(d.next_event(), None);
    }

    #[test]
    fn frame_split_across_reads() {
        let bytes = Frame::register(1, caps::CPU).encode();
        let mut d = StreamDecoder::new();
        for b in &bytes[..15] {
            d.push(std::slice::from_ref(b));
            assert_eq!(d.next_event(), None);
        }
        d.push(&bytes[15..]);
        assert_eq!(d.next_event(), Some(Event::Frame(Frame::register(1, caps::CPU))));
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn header_prefix_at_end_of_garbage_is_kept() {
        let mut d = StreamDecoder::new();
        d.push(&[0xff, 0x43]);
        assert_eq!(d.next_event(), Some(Event::Garbage { skipped: 1 }));
        assert_eq!(d.next_event(), None);
        let f = Frame::cpu(9, false).encode();
        d.push(&f[1..]);
        assert_eq!(d.next_event(), Some(Event::Frame(Frame::cpu(9, false))));
    }

    #[test]
    fn deboost_carries_the_next_wake_up() {
        let f = Frame::cpu_deboost_wake(7, 9_500, 80);
        assert_eq!(f.value, 1 << 17 | 80 << 8 | 9_500 << 32);
        assert_eq!(Frame::decode(&f.encode()), Ok(f));
        assert_eq!(cpu::wake_of(f.value), Some((9_500, 80)));
        // Plain CPU 0 and boosts carry none; a boost's need is not a wake-up.
        assert_eq!(cpu::wake_of(0), None);
        assert_eq!(cpu::wake_of(cpu::Need { priority: 80, irq: true }.encode()), None);
        assert_eq!(cpu::Need::decode(f.value), None, "a deboost");
        // The largest delay and priority are valid; the priority is capped when encoding.
        assert_eq!(cpu::wake_of(Frame::cpu_deboost_wake(1, u32::MAX, 200).value), Some((u32::MAX, 99)));
        let invalid = |value: u64| {
            let b = Frame::new(Kind::Cpu, 3, value).encode();
            assert_eq!(
                Frame::decode(&b),
                Err(DecodeError::InvalidValue { kind: "CPU", seq: 3, value }),
                "{value:#x} must be refused"
            );
        };
        invalid(1 << 17); // no delay: that is plain CPU 0
        invalid(1 << 17 | 1 << 32 | 1); // a boost cannot carry a wake-up
        invalid(1 << 17 | 100 << 8 | 1 << 32); // priority above 99
        invalid(1 << 17 | 1 << 16 | 1 << 32); // the interrupt bit is a boost's
        invalid(1 << 17 | 1 << 18 | 1 << 32); // an unknown bit
        invalid(1 << 32); // a delay without bit 17
        invalid(5 << 8); // a priority alone
    }

    #[test]
    fn a_standing_wake_carries_its_period() {
        let f = Frame::wake_standing(9, 9_500, 80, 10_000);
        assert_eq!(f.value, 9_500 | 80 << 32 | 10_000 << 40);
        assert_eq!(Frame::decode(&f.encode()), Ok(f));
        assert_eq!(wake::decode(f.value), (9_500, 80));
        assert_eq!(wake::period_of(f.value), 10_000);
        // A plain WAKE has none; the longest period is 24 bits of µs, and longer ones are capped.
        assert_eq!(wake::period_of(Frame::wake(1, 9_500, 80).value), 0);
        assert_eq!(wake::period_of(Frame::wake_standing(1, 1, 0, u32::MAX).value), wake::MAX_PERIOD_US);
        assert_eq!(wake::decode_standing_ack(wake::standing_ack(7_500, 2_000)), (7_500, 2_000));
        // A period with no delay withdraws nothing and predicts nothing: refused.
        let b = Frame::new(Kind::Wake, 3, 10_000 << 40).encode();
        assert_eq!(Frame::decode(&b), Err(DecodeError::InvalidValue { kind: "WAKE", seq: 3, value: 10_000 << 40 }));
    }

    #[test]
    fn caps_names() {
        assert_eq!(caps::names(0), "none");
        assert_eq!(caps::names(caps::CPU | caps::IO), "cpu,io");
        assert_eq!(caps::names(0x11), "cpu,0x10");
        assert_eq!(caps::names(caps::ALL), "cpu,io,membw,event");
    }

    #[test]
    fn deny_names_its_resource() {
        let f = Frame::deny_for(0, Resource::Io, DenyReason::Budget);
        assert_eq!((f.deny_reason(), f.deny_resource()), (Some(DenyReason::Budget), Some(Resource::Io)));
        assert_eq!(Frame::decode(&f.encode()), Ok(f));
        assert_eq!(f.to_string(), "DENY(io: budget) seq=0");
        let plain = Frame::deny(3, DenyReason::Malformed);
        assert_eq!(plain.deny_resource(), None);
        for r in Resource::ALL {
            assert_eq!(Resource::from_cap(r.cap()), Some(r));
            assert_eq!(Resource::from_name(r.name()), Some(r));
            if let Some(k) = r.request_kind() {
                assert_eq!(Resource::of_kind(k), Some(r));
            }
        }
        assert_eq!(Resource::in_caps(caps::CPU | caps::MEMBW).collect::<Vec<_>>(), [Resource::Cpu, Resource::Membw]);
    }
}
