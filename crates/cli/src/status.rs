//! `cosched status`, `cosched status --watch` and `cosched membw`: the daemon's status
//! ([`cosched_status::Status`]) for people. `cosched status --json` prints the daemon's JSON.

use std::collections::BTreeMap;
use std::fmt::{Display, Write};
use std::path::Path;

use anyhow::Context;
use cosched_host::control::{request, Request};
use cosched_proto::Resource;
use cosched_status::rundelay::human_ns;
use cosched_status::{MembwStatus, RtStatus, RunDelay, Status, VmStatus};

mod origin;
pub use origin::changes_text;

/// The daemon's status, as it sent it.
pub fn json(socket: &Path) -> anyhow::Result<serde_json::Value> {
    request(socket, &Request::Status)?.context("empty status")
}

/// The daemon's status, typed.
pub fn get(socket: &Path) -> anyhow::Result<Status> {
    serde_json::from_value(json(socket)?).context("reading the daemon's status")
}

/// A float as the status's JSON writes it (`15.0`, `0.5`).
fn num(x: f64) -> String {
    serde_json::Number::from_f64(x).map_or_else(|| "null".into(), |n| n.to_string())
}

/// A figure the status may not have (`null`, as it reads in the JSON).
fn or_null<T: Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".into(), |v| v.to_string())
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn fmt_ms(ns_ms: f64) -> String {
    if ns_ms >= 1000.0 {
        format!("{:.1} s", ns_ms / 1000.0)
    } else {
        format!("{ns_ms:.1} ms")
    }
}

/// `cosched status --threads`: everything, each VM's threads too.
#[cfg(test)]
pub fn text(s: &Status) -> String {
    text_with(s, true)
}

/// `cosched status`: the host's coordination, then each VM (with `threads`, its threads too).
pub fn text_with(s: &Status, threads: bool) -> String {
    let mut out = String::new();
    resources(&mut out, s);
    for (what, why) in [("io", &s.io.unsupported), ("event", &s.event.unsupported)] {
        if let Some(why) = why {
            let _ = writeln!(out, "{what}: unsupported here: {why}");
        }
    }
    if let Some(why) = &s.run_delay.unsupported {
        let _ = writeln!(out, "run delay: unsupported here because {why}");
    }
    out += &membw_text(&s.membw);
    host(&mut out, s);
    origin::host(&mut out, s);
    let l = &s.latency;
    let _ = writeln!(
        out,
        "hint-to-applied latency: {} boosts/deboosts, p50 {} µs, p99 {} µs, max {} µs",
        l.count,
        num(l.p50_us),
        num(l.p99_us),
        num(l.max_us)
    );
    if s.vms.is_empty() {
        let _ = writeln!(out, "no VMs connected (socket directory {})", s.daemon.socket_dir.display());
    } else {
        out.push('\n');
        vm_header(&mut out);
    }
    for vm in &s.vms {
        vm_rows(&mut out, vm);
        vm_details(&mut out, vm, threads);
    }
    if !s.unconnected_sockets.is_empty() {
        // Quoted, as in the JSON.
        let quoted: Vec<String> =
            s.unconnected_sockets.iter().map(|p| serde_json::to_string(p).unwrap_or_default()).collect();
        let _ = writeln!(out, "\nsockets not connected (see the daemon's log): {}", quoted.join(", "));
    }
    out
}

/// `cosched status VM`: that VM's rows and details (with `threads`, its threads too).
pub fn vm_text(vm: &VmStatus, threads: bool) -> String {
    let mut out = String::new();
    vm_header(&mut out);
    vm_rows(&mut out, vm);
    vm_details(&mut out, vm, threads);
    out
}

/// The VM table's header.
fn vm_header(out: &mut String) {
    let _ = writeln!(
        out,
        "{:<16} {:>7} {:>4} {:>4} {:<6} {:>3} {:<8} {:>7} {:>9} {:>7} {:>9}  denied",
        "VM", "PID", "REG", "PRIO", "RES", "ON", "LEVEL", "BOOSTS", "BOOSTED", "BUDGET", "MALFORMED"
    );
}

/// No VM is named so (by name or QEMU pid).
#[derive(Debug, thiserror::Error)]
#[error("no VM named {key:?} (connected: {known})")]
pub struct NoVm {
    pub key: String,
    pub known: String,
}

/// The status with only the VM named `key` (its name or QEMU pid) in `vms`.
pub fn only(mut s: Status, key: &str) -> Result<Status, NoVm> {
    let pid: Option<i32> = key.parse().ok();
    let known: Vec<&str> = s.vms.iter().map(|v| v.name.as_str()).collect();
    let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
    let vm = s.vms.iter().position(|v| v.name == key || Some(v.pid) == pid);
    let vm = vm.ok_or_else(|| NoVm { key: key.to_string(), known })?;
    s.vms = vec![s.vms.swap_remove(vm)];
    Ok(s)
}

/// A line per resource: its switch, its budgets, and what it runs on.
fn resources(out: &mut String, s: &Status) {
    for (r, v) in &s.resources {
        let ms = |ns: u64| ns / 1_000_000;
        let (continuous, share, window) = match &v.limits {
            Some(l) => (ms(l.max_continuous_ns), l.max_share_permille.to_string(), ms(l.window_ns)),
            None => (0, "null".into(), 0),
        };
        let _ = write!(
            out,
            "{r}: {}   (budgets: boost <= {continuous} ms at a time, <= {share}‰ of {window} ms",
            if v.enabled { "enabled" } else { "DISABLED" }
        );
        if r == Resource::Io.name() {
            let io = &s.io;
            let _ = write!(out, "; lever {} through {}", io.lever.name(), io.acts_through.as_deref().unwrap_or("?"));
        }
        if r == Resource::Event.name() {
            let e = &s.event;
            let c = e.counters.as_ref();
            let _ = write!(
                out,
                "; boosting {} VMs, {} per {} ms, slices {} µs, charging {}, detection {}: {} device / {} timer / {} \
                 internal wake-ups",
                e.config.vms.name(),
                e.config.n_limit,
                e.config.cycle_ms,
                e.config.slice_us,
                on_off(e.config.charge),
                e.detection.as_deref().unwrap_or("?"),
                or_null(c.map(|c| c.device_wakeups)),
                or_null(c.map(|c| c.timer_wakeups)),
                or_null(c.map(|c| c.internal_wakeups))
            );
        }
        if r == Resource::Cpu.name() {
            let _ = write!(
                out,
                "; real-time guard {}‰ of {} ms; host reserve: {} of at most {} vCPU(s) boosted",
                s.policy.rt_guard_max_share_permille,
                s.policy.rt_guard_window_ms,
                or_null(v.figures.boosted_vcpus),
                or_null(v.figures.boost_capacity_vcpus)
            );
        }
        out.push_str(")\n");
    }
}

/// The host's shield and the privileges the daemon lost.
fn host(out: &mut String, s: &Status) {
    let sh = &s.shield;
    if !sh.shielded_cpus.is_empty() {
        let irqs: Vec<String> = sh.irqs_moved.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "shield: CPUs {} for shielded vCPUs, housekeeping {}; IRQs moved [{}], fixed [{}]; host groups moved [{}]; \
             per-CPU kernel threads left [{}]",
            sh.shielded_cpus,
            sh.housekeeping_cpus,
            irqs.join(", "),
            sh.irqs_fixed.join(", "),
            sh.groups_moved.join(", "),
            sh.kthreads_left.join(", ")
        );
    }
    for e in &sh.errors {
        let _ = writeln!(out, "shield: {e}");
    }
    for l in s.privileges.iter().flat_map(|p| &p.lost) {
        let _ = writeln!(out, "privileges: lost {} (needs {})", l.feature, l.needs);
    }
}

/// `denied` as `reason=n` words.
fn denials(d: &BTreeMap<String, u64>) -> Vec<String> {
    d.iter().map(|(k, n)| format!("{k}={n}")).collect()
}

/// A VM's row per resource; the VM-wide denials go on its first.
fn vm_rows(out: &mut String, vm: &VmStatus) {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut vm_denied = denials(&vm.counters.denied);
    for (i, (r, res)) in vm.resources.iter().enumerate() {
        let c = &res.counters;
        let mut d = denials(&c.denied);
        let first = i == 0;
        if first {
            d.append(&mut vm_denied);
        }
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>4} {:>4} {:<6} {:>3} {:<8} {:>7} {:>9} {:>7} {:>9}  {}",
            if first { vm.name.as_str() } else { "" },
            if first { vm.pid.to_string() } else { String::new() },
            if first { yes(vm.registered) } else { "" },
            if first { vm.priority.to_string() } else { String::new() },
            r,
            yes(res.active),
            res.level.name(),
            c.boosts,
            fmt_ms(res.boosted_ms()),
            c.budget_exhausted,
            if first { vm.counters.malformed.to_string() } else { String::new() },
            if d.is_empty() { "-".into() } else { d.join(" ") }
        );
    }
}

/// Under a VM's rows: RT co-scheduling, memory bandwidth, threads (with `threads`), static
/// tunings, disks.
fn vm_details(out: &mut String, vm: &VmStatus, threads: bool) {
    origin::vm(out, vm);
    for (r, why) in vm.resources.iter().filter_map(|(r, res)| Some((r, res.not_applied.as_ref()?))) {
        let level = vm.resources[r].level.name();
        let _ = writeln!(out, "    {r}: {level} decided but NOT APPLIED to its threads: {}", shorten(why, 300));
    }
    if let Some(line) = run_delay_text(&vm.run_delay, None) {
        let _ = writeln!(out, "    {line}");
    }
    if let Some(rt) = vm.resources.get(Resource::Cpu.name()).and_then(|r| r.rt.as_ref()) {
        rt_text(out, rt);
    }
    if let Some(line) = event_text(vm) {
        let _ = writeln!(out, "    {line}");
    }
    if let Some(m) = &vm.membw {
        let st = &m.stats;
        let state = match (m.throttled, m.stopped) {
            (true, true) => "THROTTLED now",
            // Decided, but the freezer has not stopped every vCPU yet (FREEZING).
            (true, false) => "THROTTLED now, still stopping",
            _ => "running",
        };
        let _ = writeln!(
            out,
            "    membw: share {}‰{} = {} MB/s guaranteed; last period {:.0} MB/s; {state}; throttled {} time(s), {}; \
             borrowed {:.1} MB, lent {:.1} MB",
            m.effective_permille,
            m.requested_permille.map_or(String::new(), |r| format!(" (asked by the guest: {r}‰)")),
            num(m.guarantee_mbps),
            m.last_period_mbps,
            st.throttles,
            fmt_ms(st.throttled_ns as f64 / 1e6),
            st.borrowed_bytes as f64 / 1e6,
            st.lent_bytes as f64 / 1e6
        );
    }
    for t in vm.threads.iter().filter(|_| threads) {
        // The I/O lever's setting on the thread, if it has one.
        let io = t.io().map(|(k, v)| format!("  {k} {v}")).unwrap_or_default();
        let stat = t.statics().map(|v| format!("  static: {v}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "    {:>7} {:<7} {:<18} {}{io}{stat}",
            t.tid,
            t.role.name(),
            t.comm,
            t.sched().unwrap_or("?")
        );
    }
    let st = &vm.statics;
    if st.tuning != "none" && !st.tuning.is_empty() {
        let _ = writeln!(out, "    static tuning: {}", st.tuning);
    }
    if let Some(g) = &st.guard {
        let _ = writeln!(
            out,
            "    static guard: {} ms at FIFO of {} ms allowed per {} ms, {} demotion(s){}",
            g.rt_ms.round(),
            g.max_ms,
            g.window_ms,
            g.demotions,
            if g.guarded { ", guarding now" } else { "" }
        );
    }
    for n in &st.notes {
        let _ = writeln!(out, "    static tuning: {n}");
    }
    for d in &vm.disks {
        let _ = writeln!(
            out,
            "    disk {} on /dev/{}: scheduler {}{}",
            d.image.display(),
            d.device,
            d.scheduler,
            if d.scheduler == "bfq" { "" } else { " (not bfq: I/O coordination cannot help this VM there)" }
        );
    }
}

/// Event boosting's pay-back account for a VM, once it has one: what it owes (or has paid in
/// advance) and the share of a CPU its holds are priced at.
fn event_text(vm: &VmStatus) -> Option<String> {
    let balance = vm.event_balance_ns.filter(|&b| b != 0 || vm.event_share_ppm.is_some())?;
    let owes = if balance > 0 {
        format!("owes {} of CPU time", fmt_ms(balance as f64 / 1e6))
    } else {
        format!("{} paid in advance", fmt_ms(-balance as f64 / 1e6))
    };
    let share = vm.event_share_ppm.map_or("not measured yet (a hold pays its whole length)".to_string(), |p| {
        format!("{:.1}% of a CPU", p as f64 / 1e4)
    });
    Some(format!("event pay-back: {owes}; its vCPUs' share at the normal level: {share}"))
}

/// A VM's RT co-scheduling and predictive boost, when it has used them.
fn rt_text(out: &mut String, rt: &RtStatus) {
    let p = &rt.predictions;
    if rt.guest_priority != 0 || p.received != 0 {
        let host = rt.host_priority.map_or("-".to_string(), |h| format!("FIFO {h}"));
        let _ = writeln!(
            out,
            "    rt: guest priority {} -> host {host} (map {}, ceiling {})",
            rt.guest_priority,
            rt.priority_map.name(),
            rt.ceiling
        );
    }
    if p.received != 0 {
        let (e, l) = (&rt.predict_error_us, &rt.predict_apply_late_us);
        let _ = writeln!(
            out,
            "    predictions: {} received, {} applied, {} covered, {} confirmed ({} early), {} unconfirmed, {} refused, \
             {} denied, {} cancelled{}; lead {} µs; error p50 {} / p99 {} µs; applied late p50 {} / p99 {} / max {} µs",
            p.received,
            p.applied,
            p.covered,
            p.confirmed,
            p.early,
            p.unconfirmed,
            p.refused,
            p.denied,
            p.cancelled,
            p.standing.map_or(String::new(), |n| format!(", {n} standing")),
            num(rt.lead_us),
            num(e.p50_us),
            num(e.p99_us),
            num(l.p50_us),
            num(l.p99_us),
            num(l.max_us)
        );
    }
}

/// The memory-bandwidth regulation, host-wide (`cosched membw`, and in `cosched status`).
pub fn membw_text(m: &MembwStatus) -> String {
    let mut out = String::new();
    if let Some(why) = &m.unsupported {
        let _ = writeln!(out, "membw: unsupported here: {why}");
        return out;
    }
    if let Some(w) = &m.warning {
        let _ = writeln!(out, "membw: *** {w} ***");
    }
    let c = m.counters.as_ref();
    let _ = writeln!(
        out,
        "membw: {} counters, {} MB/s guaranteed, {}‰ committed; period {} ms, reclaim {}, best effort {}; throttling \
         through the {}; {} periods, {} with best effort",
        m.backend,
        m.guaranteed_mbps,
        or_null(m.committed_permille),
        m.period_ms,
        on_off(m.reclaim),
        on_off(m.best_effort),
        m.throttles_through.as_deref().unwrap_or("?"),
        or_null(c.map(|c| c.periods)),
        or_null(c.map(|c| c.best_effort_periods))
    );
    for n in m.notes.iter().flatten() {
        let _ = writeln!(out, "membw: {n}");
    }
    out
}

/// `cosched status --watch`: redraws [`watch_frame`] every `interval_ms` (on a terminal, from the
/// top of a cleared screen), `count` times or until interrupted; with `vm`, that VM only.
pub fn watch(socket: &Path, interval_ms: u64, count: Option<u64>, vm: Option<&str>) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<(Status, std::time::Instant)> = None;
    let mut n = 0;
    loop {
        let s = match vm {
            Some(key) => only(get(socket)?, key)?,
            None => get(socket)?,
        };
        let now = std::time::Instant::now();
        let frame = watch_frame(prev.as_ref().map(|(p, t)| (p, now.duration_since(*t).as_secs_f64())), &s);
        print!("{}{frame}", if tty { "\x1b[H\x1b[2J" } else { "" });
        std::io::Write::flush(&mut std::io::stdout())?;
        prev = Some((s, now));
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(interval_ms));
    }
}

/// One redraw of `status --watch`: the host's resources, then a line per VM and resource with
/// its level and, against `prev` (the last status and the seconds since), boosts/s, the share
/// of the time boosted, denials/s, and the memory bandwidth.
pub fn watch_frame(prev: Option<(&Status, f64)>, s: &Status) -> String {
    let mut out = String::new();
    let res: Vec<String> =
        s.resources.iter().map(|(r, v)| format!("{r} {}", if v.enabled { "on" } else { "OFF" })).collect();
    let _ = writeln!(
        out,
        "cosched: {} VM(s); {}; hint-to-applied p50 {} µs, p99 {} µs{}",
        s.vms.len(),
        res.join(", "),
        s.latency.p50_us,
        s.latency.p99_us,
        prev.map_or("; rates from the next redraw".to_string(), |(_, dt)| format!("; rates over {dt:.1} s"))
    );
    let _ = writeln!(
        out,
        "\n{:<16} {:>7} {:<6} {:<9} {:>8} {:>8} {:>8} {:>8}  MEMBW",
        "VM", "PID", "RES", "LEVEL", "BOOSTS", "BOOST/S", "BOOSTED", "DENY/S"
    );
    for vm in &s.vms {
        // The same VM in the last status: same name, same QEMU process.
        let before =
            prev.and_then(|(p, dt)| p.vms.iter().find(|v| v.name == vm.name && v.pid == vm.pid).map(|b| (b, dt)));
        watch_rows(&mut out, vm, before);
    }
    if s.vms.is_empty() {
        let _ = writeln!(out, "no VMs (socket directory {})", s.daemon.socket_dir.display());
    }
    if let Some(why) = &s.run_delay.unsupported {
        let _ = writeln!(out, "run delay: unsupported here because {why}");
    }
    out
}

/// A VM's rows of `status --watch`, with rates against `before` (the VM in the last status,
/// and the seconds since).
fn watch_rows(out: &mut String, vm: &VmStatus, before: Option<(&VmStatus, f64)>) {
    let denied = |d: &BTreeMap<String, u64>| -> f64 { d.values().map(|n| *n as f64).sum() };
    for (i, (r, res)) in vm.resources.iter().enumerate() {
        let c = &res.counters;
        let rates = before.map(|(b, dt)| {
            // A resource it did not have counts from 0.
            let b = b.resources.get(r).cloned().unwrap_or_default();
            (
                (c.boosts as f64 - b.counters.boosts as f64) / dt,
                0.1 * (res.boosted_ms() - b.boosted_ms()) / dt,
                (denied(&c.denied) - denied(&b.counters.denied)) / dt,
            )
        });
        let first = i == 0;
        let membw = match &vm.membw {
            Some(m) if first => format!(
                "{:.0} MB/s of {} guaranteed{}",
                m.last_period_mbps,
                num(m.guarantee_mbps),
                if m.throttled { ", THROTTLED" } else { "" }
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:<6} {:<9} {:>8} {:>8} {:>8} {:>8}  {membw}",
            if first { vm.name.as_str() } else { "" },
            if first { vm.pid.to_string() } else { String::new() },
            r,
            if res.active { res.level.name() } else { "off" },
            c.boosts,
            rates.map_or("-".into(), |r| format!("{:.1}", r.0)),
            rates.map_or("-".into(), |r| format!("{:.0}%", r.1)),
            rates.map_or("-".into(), |r| format!("{:.1}", r.2)),
        );
    }
    // The waits of the last interval (the first redraw: since the VM was found).
    if let Some(line) = run_delay_text(&vm.run_delay, before.map(|(b, _)| &b.run_delay)) {
        let _ = writeln!(out, "{:<16} {line}", "");
    }
}

/// `run delay: boosted p50 3 µs p99 40 µs (n 812); normal p50 1.2 ms p99 9.8 ms (n 95)`: per
/// level, the vCPUs' waits runnable before they ran; with `before` (the same VM's in an earlier
/// status), only those since. `None` without any.
fn run_delay_text(now: &BTreeMap<String, RunDelay>, before: Option<&BTreeMap<String, RunDelay>>) -> Option<String> {
    let levels: Vec<String> = now
        .iter()
        .filter_map(|(level, d)| {
            let mut d = d.clone();
            if let Some(b) = before.and_then(|b| b.get(level)) {
                for (n, was) in d.counts.iter_mut().zip(&b.counts) {
                    *n = n.saturating_sub(*was);
                }
                d.count = d.count.saturating_sub(b.count);
                d.sum_ns = d.sum_ns.saturating_sub(b.sum_ns);
            }
            let (p50, p99) = (d.quantile_ns(0.5)?, d.quantile_ns(0.99)?);
            Some(format!("{level} p50 {} p99 {} (n {})", human_ns(p50), human_ns(p99), d.count))
        })
        .collect();
    (!levels.is_empty())
        .then(|| format!("run delay{}: {}", if before.is_some() { " since" } else { "" }, levels.join("; ")))
}

/// `text` cut to about `max` characters, saying so (a refused change's message can run to
/// kilobytes; the daemon's log has it whole).
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}... (whole in the daemon's log)", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests;
