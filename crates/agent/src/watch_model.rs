//! The new-task heuristic (the BPF program's watch list) under a fake clock: the very
//! arithmetic the program runs (`src/bpf/watch.h`), compiled for the host
//! (`src/bpf/watch_host.c`, built by build.rs) and driven by simulated task lives. The map glue
//! around it (lookup, delete, statistics, the count of tasks waiting with a need on a CPU) is the
//! few lines of `watch_charge`, `watch_run_out`, `on_wakeup_new`, `on_wakeup` and `on_exit` in
//! `cpu.bpf.c`; `List` below does the same (for one CPU).

use std::collections::HashMap;

/// `struct watched` of watch.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Watched {
    budget_ns: u64,
    since_ns: u64,
    wait_ns: u64,
    wait_since_ns: u64,
    count: u32,
    wait_cpu: u32,
}

#[link(name = "cosched_watch_host", kind = "static")]
extern "C" {
    static cosched_watch_boost: u32;
    static cosched_watch_drop: u32;
    static cosched_watch_free: u32;
    static cosched_watch_spent: u32;
    static cosched_watch_wait: u32;
    static cosched_watch_waited: u32;
    fn cosched_watch_new(budget_ns: u64, count: u32) -> Watched;
    fn cosched_watch_is_on(budget_ns: u64, count: u32) -> i32;
    fn cosched_watch_in(w: *mut Watched, budget_ns: u64, back_from_agent: i32, now: u64) -> u32;
    fn cosched_watch_out(w: *mut Watched, now: u64, runnable: i32, cpu: u32) -> u32;
    fn cosched_watch_wake(w: *mut Watched, budget_ns: u64, refill_ns: u64, count: u32);
}

/// watch.h's step flags (WATCH_BOOST, WATCH_DROP, WATCH_FREE, WATCH_SPENT, WATCH_WAIT,
/// WATCH_WAITED), as watch_host.c exports them.
struct Flags {
    boost: u32,
    drop: u32,
    free: u32,
    spent: u32,
    wait: u32,
    waited: u32,
}

fn flags() -> Flags {
    // SAFETY: `const unsigned int`s defined in watch_host.c, never written.
    unsafe {
        Flags {
            boost: cosched_watch_boost,
            drop: cosched_watch_drop,
            free: cosched_watch_free,
            spent: cosched_watch_spent,
            wait: cosched_watch_wait,
            waited: cosched_watch_waited,
        }
    }
}

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

/// The watch list as the BPF program keeps it: knobs, a map of at most `max` tasks, statistics,
/// and one CPU's count of watched tasks waiting on it with a need and the end of the latest
/// one's allowance (`cpu_state.watch_waiting`, `wait_until_ns`).
struct List {
    budget_ns: u64,
    refill_ns: u64,
    count: u32,
    max: usize,
    map: HashMap<u32, Watched>,
    spent: u32,
    full: u32,
    agent_returns: u32,
    waiting: u32,
    wait_until_ns: u64,
}

impl List {
    fn budget(budget_ms: u64) -> List {
        List::new(budget_ms * MS, 2_000 * US, 8, 16)
    }

    fn count(count: u32) -> List {
        List::new(0, 0, count, usize::MAX)
    }

    fn new(budget_ns: u64, refill_ns: u64, count: u32, max: usize) -> List {
        List {
            budget_ns,
            refill_ns,
            count,
            max,
            map: HashMap::new(),
            spent: 0,
            full: 0,
            agent_returns: 0,
            waiting: 0,
            wait_until_ns: 0,
        }
    }

    /// sched_wakeup_new (on_wakeup_new).
    fn new_task(&mut self, pid: u32) {
        // SAFETY: plain C functions of integers.
        if unsafe { cosched_watch_is_on(self.budget_ns, self.count) } == 0 {
            return;
        }
        if self.map.len() >= self.max && !self.map.contains_key(&pid) {
            self.full += 1;
            return;
        }
        // SAFETY: as above.
        self.map.insert(pid, unsafe { cosched_watch_new(self.budget_ns, self.count) });
    }

    /// A switch to `pid` (watch_charge): whether it needs a boost.
    fn switch_in(&mut self, pid: u32, back_from_agent: bool, now: u64) -> bool {
        let Some(w) = self.map.get_mut(&pid) else { return false };
        // SAFETY: `w` is a valid, exclusive `struct watched`.
        let r = unsafe { cosched_watch_in(w, self.budget_ns, back_from_agent as i32, now) };
        let f = flags();
        if r & f.free != 0 {
            self.agent_returns += 1;
        }
        if r & f.waited != 0 {
            self.waiting = self.waiting.saturating_sub(1);
        }
        if r & f.drop != 0 {
            self.map.remove(&pid);
        }
        r & f.boost != 0
    }

    /// A switch away from `pid`, still runnable (preempted) or not (watch_run_out; budget mode
    /// only).
    fn switch_out(&mut self, pid: u32, runnable: bool, now: u64) {
        if self.budget_ns == 0 {
            return;
        }
        let Some(w) = self.map.get_mut(&pid) else { return };
        // SAFETY: as above.
        let r = unsafe { cosched_watch_out(w, now, runnable as i32, 0) };
        let until = now + w.wait_ns;
        let f = flags();
        if r & f.spent != 0 {
            self.spent += 1;
            self.map.remove(&pid);
        }
        if r & f.wait != 0 {
            if self.waiting == 0 || until > self.wait_until_ns {
                self.wait_until_ns = until;
            }
            self.waiting += 1;
        }
    }

    /// Whether the CPU needs a boost at `now` for a watched task waiting on it (on_switch, at the
    /// switch-in of a task that needs nothing itself).
    fn waiting_need(&self, now: u64) -> bool {
        self.waiting > 0 && now < self.wait_until_ns
    }

    /// sched_wakeup (on_wakeup).
    fn wake(&mut self, pid: u32) {
        if let Some(w) = self.map.get_mut(&pid) {
            // SAFETY: as above.
            unsafe { cosched_watch_wake(w, self.budget_ns, self.refill_ns, self.count) };
        }
    }

    /// sched_process_exit (on_exit).
    fn exit(&mut self, pid: u32) {
        self.map.remove(&pid);
    }
}

/// How a run of a simulated task ends.
#[derive(Clone, Copy)]
enum End {
    /// Preempted (a guest hog's turn, or the tick): back on the CPU after this long.
    Preempted(u64),
    /// Asleep by choice (a read, a timer): woken after this long.
    Sleeps(u64),
}

/// The result of a simulated life: boosted run time, total run time, the time its CPU needed a
/// boost for it while it waited preempted (the others' runs), and the clock at its end.
#[derive(Debug)]
struct Life {
    boosted_ns: u64,
    run_ns: u64,
    wait_boosted_ns: u64,
    end_ns: u64,
}

/// Lives `runs` (run time, how it ends) of task `pid` from `start` on, on a fake clock.
fn live(list: &mut List, pid: u32, start: u64, runs: impl IntoIterator<Item = (u64, End)>) -> Life {
    let mut now = start;
    let mut life = Life { boosted_ns: 0, run_ns: 0, wait_boosted_ns: 0, end_ns: 0 };
    for (run, end) in runs {
        let boosted = list.switch_in(pid, false, now);
        now += run;
        life.run_ns += run;
        if boosted {
            life.boosted_ns += run;
        }
        list.switch_out(pid, matches!(end, End::Preempted(_)), now);
        match end {
            End::Preempted(d) => {
                // The others run from now on: the CPU needs for this task until its allowance ends.
                if list.waiting_need(now) {
                    life.wait_boosted_ns += d.min(list.wait_until_ns - now);
                }
                now += d;
            }
            End::Sleeps(d) => {
                now += d;
                list.wake(pid);
            }
        }
    }
    life.end_ns = now;
    life
}

/// A CPU-bound task: `total` of run time in slices of `slice`, preempted for as long each time.
fn cpu_bound(total: u64, slice: u64) -> impl Iterator<Item = (u64, End)> {
    std::iter::repeat_n((slice, End::Preempted(slice)), (total / slice) as usize)
}

#[test]
fn the_flags_are_distinct_bits() {
    let f = flags();
    let all = [f.boost, f.drop, f.free, f.spent, f.wait, f.waited];
    for (i, a) in all.iter().enumerate() {
        assert_eq!(a.count_ones(), 1, "{a:#x}");
        assert!(all[i + 1..].iter().all(|b| a & b == 0));
    }
}

#[test]
fn a_cpu_bound_newcomer_is_released_once_its_budget_is_spent() {
    let mut list = List::budget(300);
    list.new_task(7);
    // 2 s of run time in 4 ms slices: boosted for its first 300 ms of run time, charged at each
    // switch-out, so the slice that crosses the budget is the last one boosted.
    let life = live(&mut list, 7, MS, cpu_bound(2_000 * MS, 4 * MS));
    assert_eq!(life.run_ns, 2_000 * MS);
    assert_eq!(life.boosted_ns, 300 * MS, "{life:?}");
    assert_eq!(list.spent, 1);
    assert!(list.map.is_empty());
    // Meanwhile it waited 74 slices of 4 ms with a need, within its 300 ms of waiting.
    assert_eq!(life.wait_boosted_ns, 74 * 4 * MS, "{life:?}");
    assert_eq!(list.waiting, 0);
    // Waiting (preempted) is not charged to the run budget: it has its own allowance.
    let mut list = List::budget(300);
    list.new_task(7);
    let slow = live(&mut list, 7, MS, std::iter::repeat_n((4 * MS, End::Preempted(400 * MS)), 100));
    assert_eq!(slow.boosted_ns, 300 * MS, "{slow:?}");
    assert_eq!(slow.wait_boosted_ns, 300 * MS, "the first wait spends the allowance: {slow:?}");
    assert!(slow.end_ns > 30_000 * MS);
}

#[test]
fn a_newcomer_waiting_behind_guest_hogs_keeps_its_cpu_boosted_while_it_waits() {
    // A start-up behind 2 guest hogs: 4 ms runs, each followed by 8 ms of the hogs' turns, with a
    // short read at the end. Its CPU needs a boost the whole time: while it runs and while the
    // hogs run for it.
    let startup = || (0..37).map(|i| (4 * MS, if i == 36 { End::Sleeps(MS) } else { End::Preempted(8 * MS) }));
    let mut list = List::budget(300);
    list.new_task(9);
    let life = live(&mut list, 9, MS, startup());
    assert_eq!(life.boosted_ns, life.run_ns, "{life:?}");
    assert_eq!(life.wait_boosted_ns, 36 * 8 * MS, "{life:?}");
    assert_eq!(list.waiting, 0, "no wait under way once it is asleep");
    // A switch-out asleep is no wait: nothing runs for it.
    assert!(!list.waiting_need(life.end_ns));
    // The count mode has no waiting need.
    let mut count = List::count(8);
    count.new_task(9);
    let c = live(&mut count, 9, MS, startup());
    assert_eq!(c.wait_boosted_ns, 0, "{c:?}");
}

#[test]
fn a_task_that_stays_runnable_holds_its_cpu_boosted_for_at_most_its_two_allowances() {
    // Starved: 1 ms of run, then 1 s of waiting, 1000 times (1000 s runnable). Its run is boosted
    // for its run budget, its waiting for its waiting allowance, and then it leaves the list.
    let mut list = List::budget(300);
    list.new_task(2);
    let life = live(&mut list, 2, MS, std::iter::repeat_n((MS, End::Preempted(1_000 * MS)), 1_000));
    assert_eq!(life.boosted_ns, 300 * MS, "{life:?}");
    assert_eq!(life.wait_boosted_ns, 300 * MS, "{life:?}");
    assert_eq!((list.spent, list.waiting), (1, 0));
    assert!(list.map.is_empty());
    assert!(life.end_ns > 1_000_000 * MS);
}

#[test]
fn a_wait_is_charged_at_the_next_switch_in_and_its_need_ends_with_the_allowance() {
    let mut list = List::budget(10);
    list.new_task(5);
    assert!(list.switch_in(5, false, MS));
    list.switch_out(5, true, 2 * MS); // ran 1 ms; waits from 2 ms with 10 ms of waiting
    assert_eq!((list.waiting, list.wait_until_ns), (1, 12 * MS));
    assert!(list.waiting_need(11 * MS));
    assert!(!list.waiting_need(12 * MS), "the allowance is over");
    assert!(list.switch_in(5, false, 6 * MS)); // waited 4 ms
    assert_eq!(list.waiting, 0);
    assert_eq!((list.map[&5].wait_ns, list.map[&5].budget_ns), (6 * MS, 9 * MS));
    // Wake-ups earn waiting back too, never past the budget.
    list.switch_out(5, false, 7 * MS);
    for _ in 0..10 {
        list.wake(5);
    }
    assert_eq!((list.map[&5].wait_ns, list.map[&5].budget_ns), (10 * MS, 10 * MS));
    // Spent waiting: its runs still need, its waits no longer do.
    assert!(list.switch_in(5, false, 8 * MS));
    list.switch_out(5, true, 9 * MS);
    assert!(list.switch_in(5, false, 30 * MS)); // waited 21 ms: 10 charged, none left
    assert_eq!(list.map[&5].wait_ns, 0);
    list.switch_out(5, true, 31 * MS);
    assert!(!list.waiting_need(31 * MS));
    assert_eq!(list.waiting, 0);
}

#[test]
fn a_run_that_crosses_the_budget_is_boosted_in_full_and_then_released() {
    let mut list = List::budget(10);
    list.new_task(1);
    let life = live(&mut list, 1, MS, cpu_bound(40 * MS, 7 * MS));
    // 7 + 7 = 14 >= 10: the second slice is the last one boosted.
    assert_eq!(life.boosted_ns, 14 * MS, "{life:?}");
    assert_eq!(list.spent, 1);
}

#[test]
fn a_task_that_sleeps_more_than_it_runs_stays_boosted() {
    let mut list = List::budget(300);
    list.new_task(3);
    // 1 ms of run, then a 10 ms sleep, 2000 times: each wake-up earns back 2 ms.
    let life = live(&mut list, 3, MS, std::iter::repeat_n((MS, End::Sleeps(10 * MS)), 2_000));
    assert_eq!(life.boosted_ns, life.run_ns);
    assert_eq!(list.map[&3].budget_ns, 300 * MS, "refilled to the budget, never past it");
    assert_eq!(list.spent, 0);
}

#[test]
fn a_task_that_runs_more_than_its_sleeps_earn_drains_its_budget() {
    let mut list = List::budget(300);
    list.new_task(3);
    // 3 ms of run per 2 ms earned back: 1 ms lost per round. Round k (from 1) starts with
    // 300 - (k - 1) ms left and is the last one when 3 ms is all that is left: k = 298.
    let life = live(&mut list, 3, MS, std::iter::repeat_n((3 * MS, End::Sleeps(5 * MS)), 1_000));
    assert_eq!(life.boosted_ns, 298 * 3 * MS, "{life:?}");
    assert_eq!(list.spent, 1);
}

#[test]
fn sleeping_does_not_bank_more_than_one_budget() {
    let mut list = List::budget(300);
    list.new_task(5);
    let sleeper = live(&mut list, 5, MS, std::iter::repeat_n((100 * US, End::Sleeps(MS)), 10_000));
    assert_eq!(list.map[&5].budget_ns, 300 * MS);
    assert_eq!(list.map[&5].wait_ns, 300 * MS);
    // Then CPU-bound: no more than its budget, however long it slept before.
    let bound = live(&mut list, 5, sleeper.end_ns, cpu_bound(5_000 * MS, 4 * MS));
    assert_eq!(bound.boosted_ns, 300 * MS);
}

#[test]
fn a_starting_program_is_boosted_for_its_whole_start_up_in_budget_mode_only() {
    // A start-up from a hot page cache: 150 ms of run time, preempted by a guest hog
    // every 4 ms, with a short read after every 8th run. The old count mode boosts its first 8
    // switch-ins, a fifth of it, and drops it before its first read could give a unit back;
    // the budget covers it all.
    let startup = || (0..38).map(|i| (4 * MS, if i % 8 == 7 { End::Sleeps(200 * US) } else { End::Preempted(4 * MS) }));
    let mut budget = List::budget(300);
    budget.new_task(9);
    let b = live(&mut budget, 9, MS, startup());
    assert_eq!(b.boosted_ns, b.run_ns, "{b:?}");
    let mut count = List::count(8);
    count.new_task(9);
    let c = live(&mut count, 9, MS, startup());
    assert_eq!(c.boosted_ns, 8 * 4 * MS, "{c:?}");
    assert!(count.map.is_empty());
}

#[test]
fn a_guest_that_starts_a_cpu_bound_program_every_second_is_boosted_for_its_budgets_only() {
    // The forking guest of the experiment: a 1 s busy loop started every second for 20 s, on
    // one guest CPU (the loops take turns with nothing else: slices of 4 ms, no waiting).
    let mut list = List::budget(300);
    let mut boosted = 0;
    let mut now = MS;
    for pid in 100..120 {
        list.new_task(pid);
        let life = live(&mut list, pid, now, std::iter::repeat_n((4 * MS, End::Preempted(0)), 250));
        boosted += life.boosted_ns;
        now = life.end_ns;
        list.exit(pid);
    }
    assert_eq!(now - MS, 20_000 * MS);
    assert_eq!(boosted, 20 * 300 * MS, "300 ms of every second: a 30% boosted share");
    assert_eq!(list.spent, 20);
}

#[test]
fn at_most_watch_max_tasks_are_watched_and_an_exit_makes_room() {
    let mut list = List::budget(300);
    for pid in 0..20 {
        list.new_task(pid);
    }
    assert_eq!((list.map.len(), list.full), (16, 4));
    assert!(!list.switch_in(19, false, MS), "not watched: no boost");
    list.exit(0);
    list.new_task(19);
    assert!(list.switch_in(19, false, MS));
}

#[test]
fn a_switch_out_without_a_switch_in_or_a_clock_going_back_charges_nothing() {
    let mut w = Watched { budget_ns: 10 * MS, ..Default::default() };
    // SAFETY: a valid, exclusive `struct watched`.
    assert_eq!(unsafe { cosched_watch_out(&mut w, 50 * MS, 1, 0) }, 0);
    assert_eq!(w.budget_ns, 10 * MS);
    // SAFETY: as above.
    unsafe { cosched_watch_in(&mut w, 10 * MS, 0, 50 * MS) };
    // SAFETY: as above.
    assert_eq!(unsafe { cosched_watch_out(&mut w, 40 * MS, 0, 0) }, 0);
    assert_eq!((w.budget_ns, w.since_ns), (10 * MS, 0));
}

#[test]
fn count_mode_returns_from_the_agent_are_free_and_wake_ups_give_units_back() {
    let mut list = List::count(3);
    list.new_task(4);
    assert!(list.switch_in(4, false, MS)); // 2 left
    assert!(list.switch_in(4, true, 2 * MS)); // back from the agent: still 2
    assert_eq!((list.agent_returns, list.map[&4].count), (1, 2));
    list.wake(4);
    list.wake(4); // capped at the count
    assert_eq!(list.map[&4].count, 3);
    assert!(list.switch_in(4, false, 3 * MS));
    assert!(list.switch_in(4, false, 4 * MS));
    assert!(list.switch_in(4, false, 5 * MS), "the last unit is boosted too");
    assert!(!list.map.contains_key(&4), "and the task leaves");
    assert!(!list.switch_in(4, false, 6 * MS));
    // Budget mode ignores where the task comes back from: its run time is what counts.
    let mut list = List::budget(1);
    list.new_task(4);
    assert!(list.switch_in(4, true, MS));
    assert_eq!(list.agent_returns, 0);
}

#[test]
fn off_means_no_task_is_watched() {
    let mut list = List::count(0);
    list.new_task(1);
    assert!(list.map.is_empty());
    assert!(!list.switch_in(1, false, MS));
}
