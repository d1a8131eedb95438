// SPDX-License-Identifier: GPL-2.0
/*
 * cosched guest detector: decides, at every context switch of the guest, whether the guest
 * needs its host's help, and reports per-CPU transitions (boost / deboost) to the agent.
 *
 * This is the paravirtual schedule() of the Coordinated Task Scheduling paper, sec. VII, Fig. 6,
 * with need_to_be_boosted():
 *   - a task with prio < 100 (RT or DL) needs a boost;
 *   - a new task (sched_wakeup_new) enters a watch list with a counter of watch_count; each
 *     switch-in of a watched task uses one unit and needs a boost, each wake-up from a sleep
 *     gives one back (up to watch_count); at 0 the task leaves the list.
 *     Budget mode (watch_budget_ns > 0) instead: a new task gets watch_budget_ns of run time,
 *     charged from each switch-in to the switch-out; each wake-up from a sleep earns back
 *     watch_refill_ns (up to watch_budget_ns); at 0 the task leaves the list. At most watch_max
 *     tasks are watched at once (the map's size); an exiting task leaves the list. A watched
 *     task preempted (switched out still runnable) keeps its CPU's need while it waits there,
 *     whatever runs meanwhile, for at most watch_budget_ns of waiting (watch.h): the guest's
 *     other tasks, its CPU hogs say, then run boosted.
 * State machine, per CPU: on need -> remember the time, send boost if not boosted; otherwise, if
 * boosted and now >= last_need + hold -> send deboost. The need lasts until the needing task leaves
 * the CPU, so the hold counts from then. hold is MIN_BOOST_TIME (min_boost_ns), or,
 * when needs recur with a period below hold_periodic_max_ns, 2 periods + MIN_BOOST_TIME: a periodic
 * RT task then keeps its VM boosted across the stray switches (kworkers) between two activations,
 * even when one activation comes late. A timer
 * deboosts a CPU that stays on a task that needs no boost without switching (a lone CPU hog).
 *
 * Each boosted CPU also reports the priority of its need (the RT priority of the task, 99 for
 * SCHED_DEADLINE, 0 for a watched task): raised at once, lowered only once the higher need's hold
 * is over, so a periodic RT task's priority is not dropped for the tasks between its activations.
 * A change while boosted is one event (COSCHED_REASON_PRIO). Whether the need's task was woken
 * from an interrupt handler (hardirq, NMI, or a softirq being served: the waker's context at
 * sched_waking) travels with it.
 *
 * Predictions: an RT task that starts an hrtimer whose function is hrtimer_wakeup (every timed
 * sleep: clock_nanosleep, a poll/epoll/futex timeout) and then switches out asleep with that
 * timer still queued is entered in the sleepers map with the timer's expiry; the agent reads the
 * earliest one when the VM deboosts. A sleeper woken before its expiry (a signal) is a
 * withdrawal, reported at once.
 *
 * Standing predictions: while the host boosts for a periodic RT task's every wake-up by itself,
 * the agent keeps the window around each due wake-up in the standing map. An RT activation of a
 * deboosted CPU inside it is a silent boost (no event), and its end a silent deboost; a need
 * still on at a switch past the window, or of a higher priority, sends the boost after all.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "intf.h"
#include "watch.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_CPUS 1024
#define CLOCK_MONOTONIC 1
#define MAX_RT_PRIO 100

/* Knobs, set by the agent before load. */
const volatile u64 min_boost_ns = 500000;
const volatile u64 idle_deboost_ns = 20000000;
const volatile u64 hold_periodic_max_ns = 25000000;
const volatile u32 watch_count = 8;
const volatile u64 watch_budget_ns = 0;
const volatile u64 watch_refill_ns = 0;
const volatile u32 agent_tgid = 0;
/* Report each new RT episode on a boosted CPU (COSCHED_REASON_EPISODE): the agent's channel
 * probe (--probe-frames) sends a frame there, where an unboosted CPU's event would send CPU 1. */
const volatile u32 report_episodes = 0;
/* Address of hrtimer_wakeup (the agent reads /proc/kallsyms); 0: no timer predictions. */
const volatile u64 hrtimer_wakeup_addr = 0;

/* The interrupt context of this CPU, and its runqueue (weak: a kernel without them just gives
 * no answer). x86: __preempt_count (Linux < 6.2; later kernels keep it in pcpu_hot). */
extern const int __preempt_count __ksym __weak;
extern const struct rq runqueues __ksym __weak;

#define SOFTIRQ_OFFSET 0x100
#define HARDIRQ_MASK 0xf0000
#define NMI_MASK 0xf00000

/*
 * Dummy instance so that the skeleton's `types` module has `struct cosched_event`: the ring buffer
 * has no value type, and libbpf-cargo generates only the types a map or a global refers to.
 */
const volatile struct cosched_event cosched_event_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, u32);
	__type(value, struct cpu_state);
} cpu_states SEC(".maps");

/* Sized by the agent before load (watch_max in budget mode); a full map watches no newcomer. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);	/* pid (thread id) */
	__type(value, struct watched);
} watch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cosched_stats);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);	/* pid */
	__type(value, struct sleeper);
} sleepers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cosched_standing);
} standing SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);	/* pid of an RT task woken from an interrupt handler, until it runs */
	__type(value, u32);
} irq_woken SEC(".maps");

/* The RT priority of a task that needs a boost (prio < 100): 99 for SCHED_DEADLINE (prio -1). */
static __always_inline u32 rt_prio(const struct task_struct *p)
{
	int prio = p->prio;

	return prio < 0 ? 99 : MAX_RT_PRIO - 1 - prio;
}

/* True if this CPU is in a hard interrupt or an NMI, or (softirq) serving a softirq. */
static __always_inline bool in_irq_ctx(bool softirq)
{
	const int *pc;
	u32 c;

	if (!bpf_ksym_exists(&__preempt_count))
		return false;
	pc = bpf_this_cpu_ptr(&__preempt_count);
	c = *pc;
	return (c & (HARDIRQ_MASK | NMI_MASK)) || (softirq && (c & SOFTIRQ_OFFSET));
}

/* RT or DL tasks queued on this CPU (they run before anything else: a switch to one is due). */
static __always_inline bool rt_queued(u32 cpu)
{
	const struct rq *rq;

	if (!bpf_ksym_exists(&runqueues))
		return false;
	rq = bpf_per_cpu_ptr(&runqueues, cpu);
	return rq && (rq->rt.rt_nr_running || rq->dl.dl_nr_running);
}

static __always_inline struct cosched_stats *stats_get(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&stats, &zero);
}

/* True if `now` is in the standing prediction's window of one of its wake-ups (the agent's
 * StandingWindow::covers). The agent writes the map as a whole while this may read it: a torn
 * read concerns one activation, which then sends its boost (or keeps silent) as the agent's
 * window before or after the write would have. */
static __always_inline bool standing_covers(u64 now)
{
	u32 zero = 0;
	struct cosched_standing *w = bpf_map_lookup_elem(&standing, &zero);
	u64 d;

	if (!w || !w->period_ns)
		return false;
	if (now < w->anchor_ns)
		return w->anchor_ns - now <= w->before_ns;
	d = (now - w->anchor_ns) % w->period_ns;
	return d <= w->after_ns || w->period_ns - d <= w->before_ns;
}

/* A CPU boosted silently leaves the boost without an event (the host ends its own). */
static __always_inline bool silent_deboost(struct cpu_state *st, struct cosched_stats *s)
{
	if (!st->silent)
		return false;
	st->silent = 0;
	st->boosted = 0;
	st->prio = 0;
	st->irq = 0;
	if (s)
		s->silent_deboosts++;
	return true;
}

static __always_inline u64 hold_ns(struct cpu_state *st)
{
	u64 hold = min_boost_ns;

	if (hold_periodic_max_ns && st->period_ns && st->period_ns <= hold_periodic_max_ns) {
		u64 h = 2 * st->period_ns + min_boost_ns;

		if (h > hold)
			hold = h;
	}
	return hold;
}

/* Returns 1 if the agent will see the event (the ring buffer had room). */
static __always_inline int emit(u32 cpu, u32 want, u32 reason, u32 pid, u64 now, struct cpu_state *st)
{
	struct cosched_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	struct cosched_stats *s;

	if (!e) {
		s = stats_get();
		if (s)
			s->events_dropped++;
		return 0;
	}
	e->ts_ns = now;
	e->cpu = cpu;
	e->want = want;
	e->reason = reason;
	e->pid = pid;
	e->prio = want ? st->prio : 0;
	e->irq = want ? st->irq : 0;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 1;
}

static int idle_timer_cb(void *map, u32 *key, struct cpu_state *st)
{
	u64 now = bpf_ktime_get_ns();
	u64 since = now - st->last_switch_ns;
	u64 until_hold;
	struct cosched_stats *s;

	st->timer_armed = 0;
	if (!st->boosted)
		return 0;
	/* A waiting watched task's need ends with its allowance, switch or not. */
	if (st->cur_needs == 2 && now >= st->wait_until_ns) {
		st->cur_needs = 0;
		st->last_need_ns = st->wait_until_ns;
	}
	if (st->cur_needs) {
		if (st->cur_needs == 2) {
			bpf_timer_start(&st->timer, st->wait_until_ns - now, 0);
			st->timer_armed = 1;
		}
		return 0;
	}
	until_hold = st->last_need_ns + hold_ns(st);
	if (since >= idle_deboost_ns && now >= until_hold) {
		/* The Performance Tuning paper deboosts only once no interrupt is being handled and
		 * no RT task is pending. This callback runs in the timer's own softirq, after its
		 * hard interrupt has returned; an RT/DL task queued here (woken by that interrupt,
		 * say) gets the CPU as soon as this returns, and a deboost now would be followed by
		 * a boost. */
		if (in_irq_ctx(false) || rt_queued(*key)) {
			s = stats_get();
			if (s)
				s->timer_deboosts_deferred++;
			bpf_timer_start(&st->timer, min_boost_ns, 0);
			st->timer_armed = 1;
			return 0;
		}
		if (silent_deboost(st, stats_get()))
			return 0;
		if (emit(*key, 0, COSCHED_REASON_TIMER, 0, now, st)) {
			st->boosted = 0;
			st->prio = 0;
			st->irq = 0;
			s = stats_get();
			if (s)
				s->timer_deboosts++;
		}
		return 0;
	}
	/* A switch happened since the timer was armed: wait for the rest. */
	bpf_timer_start(&st->timer, since < idle_deboost_ns ? idle_deboost_ns - since : until_hold - now, 0);
	st->timer_armed = 1;
	return 0;
}

/*
 * The watch list, at the switch-in of a task that is not RT: returns COSCHED_REASON_WATCHED if
 * `pid` is watched with units (count mode) or run time (budget mode) left. The arithmetic is
 * watch.h's.
 */
static __always_inline u32 watch_charge(struct cosched_stats *s, u32 pid, bool back_from_agent, u64 now)
{
	struct watched *w;
	u32 r;

	w = bpf_map_lookup_elem(&watch, &pid);
	if (!w)
		return COSCHED_REASON_NONE;
	r = watch_in(w, watch_budget_ns, back_from_agent, now);
	if (r & WATCH_WAITED) {
		/* Its wait is over: uncounted on the CPU it waited on (it may have migrated). A
		 * task switched in as RT is not uncounted: its CPU's need then ends with the
		 * allowance (wait_until_ns) instead. */
		u32 wcpu = w->wait_cpu;
		struct cpu_state *ws = bpf_map_lookup_elem(&cpu_states, &wcpu);

		if (ws && ws->watch_waiting)
			__sync_fetch_and_add(&ws->watch_waiting, -1);
	}
	if (r & WATCH_BOOST)
		s->need_watched++;
	if (r & WATCH_FREE)
		s->watch_agent_returns++;
	if (r & WATCH_DROP)
		bpf_map_delete_elem(&watch, &pid);
	return r & WATCH_BOOST ? COSCHED_REASON_WATCHED : COSCHED_REASON_NONE;
}

/* Budget mode, at a watched task's switch-out from this CPU (`st`): its run since the switch-in
 * is charged; still runnable, it waits here with a need (counted on this CPU, until its
 * switch-in: watch_charge) for at most its waiting allowance. */
static __always_inline void watch_run_out(struct cosched_stats *s, struct cpu_state *st, u32 cpu,
					  struct task_struct *prev, u64 now)
{
	u32 pid = prev->pid;
	struct watched *w;
	u32 r;

	if (!watch_budget_ns)
		return;
	w = bpf_map_lookup_elem(&watch, &pid);
	if (!w)
		return;
	r = watch_out(w, now, prev->__state == 0 /* TASK_RUNNING */, cpu);
	if (r & WATCH_SPENT) {
		s->watch_spent++;
		bpf_map_delete_elem(&watch, &pid);
	}
	if (r & WATCH_WAIT) {
		u64 until = now + w->wait_ns;

		/* The latest allowance of the waits under way (a stale one is in the past). */
		if (__sync_fetch_and_add(&st->watch_waiting, 1) == 0 || until > st->wait_until_ns)
			st->wait_until_ns = until;
	}
}

/* A switch to a task that needs a boost: track the episodes (and their period) of this CPU. */
static __always_inline void track_episode(struct cpu_state *st, u64 now, u32 prio)
{
	if (st->cur_needs) {
		if (prio > st->episode_prio)
			st->episode_prio = prio;
	} else {
		st->episode_prio = prio;
		/* A new episode: track the period of recurring needs. */
		if (st->episode_start_ns) {
			u64 d = now - st->episode_start_ns;

			if (d > hold_periodic_max_ns || !st->period_ns)
				st->period_ns = d;
			else
				st->period_ns = (3 * st->period_ns + d) / 4;
		}
		st->episode_start_ns = now;
	}
	st->cur_needs = 1;
	st->last_need_ns = now;
}

/* Arms the no-switch timer of this CPU (initialising it on first use), unless it is armed. */
static __always_inline void arm_idle_timer(struct cpu_state *st)
{
	if (!st->timer_ready) {
		/* -EBUSY if a racing path initialised it first: fine either way. */
		bpf_timer_init(&st->timer, &cpu_states, CLOCK_MONOTONIC);
		bpf_timer_set_callback(&st->timer, idle_timer_cb);
		st->timer_ready = 1;
	}
	if (!st->timer_armed) {
		st->timer_armed = 1;
		bpf_timer_start(&st->timer, idle_deboost_ns, 0);
	}
}

/* The deboost decision, at a switch to a task that needs no boost. */
static __always_inline void maybe_deboost(struct cpu_state *st, struct cosched_stats *s, u32 cpu, u32 pid,
					  u64 now)
{
	st->cur_needs = 0;
	if (!st->boosted)
		return;
	if (now >= st->last_need_ns + hold_ns(st)) {
		if (silent_deboost(st, s))
			return;
		if (emit(cpu, 0, COSCHED_REASON_NONE, pid, now, st)) {
			st->boosted = 0;
			st->prio = 0;
			st->irq = 0;
			s->deboosts++;
		}
		return;
	}
	/* Still within hold: if no switch comes, the timer deboosts. */
	arm_idle_timer(st);
}

/*
 * The CPU's need priority, at the switch-in of a task that needs a boost with priority `prio`
 * (woken from an interrupt: `irq`). A higher one replaces it at once; a lower one only once the
 * current one's hold is over (prio_need_ns is refreshed while a task of that priority runs), as
 * the boost itself would have ended: the tasks between a periodic RT task's activations do not
 * lower it. Returns true if the priority changed.
 */
static __always_inline bool update_prio(struct cpu_state *st, u32 prio, u32 irq, u64 now)
{
	u32 old = st->prio;

	st->cur_prio = prio;
	if (prio >= old || now >= st->prio_need_ns + hold_ns(st)) {
		st->prio = prio;
		st->irq = irq;
	}
	if (prio == st->prio)
		st->prio_need_ns = now;
	return st->prio != old;
}

/* An RT task switching out asleep: if it armed an hrtimer_wakeup timer that is still queued, its
 * wake-up is predicted (the sleeper becomes ASLEEP); otherwise its entry is stale. */
static __always_inline void note_sleep(struct task_struct *prev, struct cosched_stats *s, u64 now)
{
	u32 pid = prev->pid;
	struct sleeper *sl = bpf_map_lookup_elem(&sleepers, &pid);
	struct hrtimer *t;
	u8 state = 0;
	s64 expires = 0;

	if (!sl || sl->state != COSCHED_SLEEPER_ARMED)
		return;
	t = (struct hrtimer *)sl->timer;
	/* The timer lives on the task's stack (do_nanosleep): read it as untrusted memory. */
	if (bpf_probe_read_kernel(&state, sizeof(state), &t->state) ||
	    bpf_probe_read_kernel(&expires, sizeof(expires), &t->_softexpires) || !(state & 1) ||
	    (u64)expires != sl->wake_ns || sl->wake_ns <= now) {
		bpf_map_delete_elem(&sleepers, &pid);
		return;
	}
	sl->state = COSCHED_SLEEPER_ASLEEP;
	s->sleeps_predicted++;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *st = bpf_map_lookup_elem(&cpu_states, &cpu);
	struct cosched_stats *s = stats_get();
	u32 reason = COSCHED_REASON_NONE;
	u32 pid = next->pid;
	bool back_from_agent;
	u32 prio = 0, irq = 0;
	bool waiting = false;
	u64 now;

	if (!st || !s)
		return 0;
	now = bpf_ktime_get_ns();
	s->switches++;
	st->last_switch_ns = now;
	/* The task leaving the CPU needed a boost (or it is the agent, which preempted such a task
	 * to send its hint): the need lasted until now, and the hold counts from here. Counted from
	 * the task's switch-in, a run longer than the hold deboosted the VM at its very end: the
	 * guest's clock runs on while the host stalls the vCPU, so under host load one 1 ms
	 * activation of a real-time task can span its 2 periods + MIN_BOOST_TIME. */
	if (st->cur_needs) {
		/* A waiting watched task's need ends with its allowance. */
		st->last_need_ns = st->cur_needs == 2 && now > st->wait_until_ns ? st->wait_until_ns : now;
		if (st->cur_prio == st->prio)
			st->prio_need_ns = st->last_need_ns;
	}
	if (hrtimer_wakeup_addr && !preempt && prev->prio < MAX_RT_PRIO && prev->__state != 0 /* TASK_RUNNING */)
		note_sleep(prev, s, now);
	watch_run_out(s, st, cpu, prev, now);
	/* The agent's own wake-ups say nothing about the guest's needs. */
	if (agent_tgid && next->tgid == agent_tgid) {
		st->agent_victim = prev->pid;
		return 0;
	}
	/* Back to the very task the agent preempted (victim -> agent -> victim). */
	back_from_agent = agent_tgid && prev->tgid == agent_tgid && st->agent_victim == pid;
	st->agent_victim = 0;

	if (next->prio < MAX_RT_PRIO) {
		u32 *woken = bpf_map_lookup_elem(&irq_woken, &pid);

		reason = COSCHED_REASON_RT;
		s->need_rt++;
		prio = rt_prio(next);
		if (woken) {
			irq = 1;
			bpf_map_delete_elem(&irq_woken, &pid);
		}
	} else {
		reason = watch_charge(s, pid, back_from_agent, now);
		/* A watched task waits runnable on this CPU: whatever runs meanwhile (not the idle
		 * task) runs for it. */
		if (reason == COSCHED_REASON_NONE && pid && st->watch_waiting && now < st->wait_until_ns) {
			reason = COSCHED_REASON_WATCHED;
			waiting = true;
		}
	}

	if (reason != COSCHED_REASON_NONE) {
		bool changed, raised, new_episode = !st->cur_needs;

		track_episode(st, now, prio);
		if (waiting) {
			st->cur_needs = 2;
			/* The allowance may end before the next switch: the timer ends it. */
			arm_idle_timer(st);
		}
		raised = prio > st->prio;
		changed = update_prio(st, prio, irq, now);
		if (!st->boosted) {
			if (reason == COSCHED_REASON_RT && standing_covers(now)) {
				/* The host boosts for this wake-up by itself. */
				st->boosted = 1;
				st->silent = 1;
				s->silent_boosts++;
			} else if (emit(cpu, 1, reason, pid, now, st)) {
				st->boosted = 1;
				s->boosts++;
			}
		} else if (st->silent && (raised || !standing_covers(now))) {
			/* Past the window, or a higher priority: the host's boost is not enough. (A lower
			 * one, a watched task after the RT task, say, runs under it.) */
			if (emit(cpu, 1, reason, pid, now, st)) {
				st->silent = 0;
				s->boosts++;
				s->silent_broken++;
			}
		} else if (changed && emit(cpu, 1, COSCHED_REASON_PRIO, pid, now, st)) {
			s->prio_changes++;
		} else if (report_episodes && new_episode && reason == COSCHED_REASON_RT) {
			emit(cpu, 1, COSCHED_REASON_EPISODE, pid, now, st);
		}
		return 0;
	}

	maybe_deboost(st, s, cpu, pid, now);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	u32 pid = p->pid;
	struct watched w = watch_new(watch_budget_ns, watch_count);
	struct cosched_stats *s;

	if (!watch_is_on(watch_budget_ns, watch_count) || (agent_tgid && p->tgid == agent_tgid))
		return 0;
	s = stats_get();
	if (bpf_map_update_elem(&watch, &pid, &w, BPF_ANY)) {
		if (s)
			s->watch_full++; /* watch_max tasks watched already */
		return 0;
	}
	if (s)
		s->watch_added++;
	return 0;
}

/* An exiting task leaves the watch list (the map is no LRU: its room is the cap). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	u32 pid = p->pid;

	bpf_map_delete_elem(&watch, &pid);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	u32 pid = p->pid;
	struct watched *w = bpf_map_lookup_elem(&watch, &pid);

	/* A wake-up ends a sleep the task chose (I/O, timer): it stays interactive. */
	if (w)
		watch_wake(w, watch_budget_ns, watch_refill_ns, watch_count);
	return 0;
}

/*
 * In the waker's context (sched_wakeup may run in the IPI that queues a remote wake-up): an RT
 * task woken from an interrupt handler is marked until it runs; a sleeper woken before its timer
 * is a withdrawn prediction.
 */
SEC("tp_btf/sched_waking")
int BPF_PROG(on_waking, struct task_struct *p)
{
	u32 pid = p->pid;
	struct sleeper *sl;
	struct cosched_stats *s;
	u32 one = 1;
	u64 now;

	if (p->prio < MAX_RT_PRIO) {
		if (in_irq_ctx(true)) {
			bpf_map_update_elem(&irq_woken, &pid, &one, BPF_ANY);
			s = stats_get();
			if (s)
				s->irq_wakeups++;
		} else {
			bpf_map_delete_elem(&irq_woken, &pid);
		}
	}
	if (!hrtimer_wakeup_addr)
		return 0;
	sl = bpf_map_lookup_elem(&sleepers, &pid);
	if (!sl)
		return 0;
	now = bpf_ktime_get_ns();
	if (sl->state == COSCHED_SLEEPER_ASLEEP && now < sl->wake_ns) {
		u32 cpu = bpf_get_smp_processor_id();
		struct cpu_state *st = bpf_map_lookup_elem(&cpu_states, &cpu);

		s = stats_get();
		if (s)
			s->withdrawals++;
		if (st)
			emit(cpu, st->boosted, COSCHED_REASON_WITHDRAW, pid, now, st);
	}
	bpf_map_delete_elem(&sleepers, &pid);
	return 0;
}

/* An RT task arms its wake-up timer (do_nanosleep, schedule_hrtimeout): remember its expiry. Only
 * CLOCK_MONOTONIC timers: their expiry is in bpf_ktime_get_ns()'s time. */
SEC("tp_btf/hrtimer_start")
int BPF_PROG(on_hrtimer_start, struct hrtimer *t)
{
	struct task_struct *cur;
	struct sleeper sl = {};
	u32 pid;

	if (!hrtimer_wakeup_addr || (u64)t->function != hrtimer_wakeup_addr)
		return 0;
	cur = bpf_get_current_task_btf();
	if (cur->prio >= MAX_RT_PRIO || !t->base || t->base->clockid != CLOCK_MONOTONIC)
		return 0;
	pid = cur->pid;
	sl.wake_ns = t->_softexpires;
	sl.timer = (u64)t;
	sl.prio = rt_prio(cur);
	sl.state = COSCHED_SLEEPER_ARMED;
	bpf_map_update_elem(&sleepers, &pid, &sl, BPF_ANY);
	return 0;
}
