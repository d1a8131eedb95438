/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The new-task heuristic's arithmetic (the watch list of cpu.bpf.c): pure functions of a
 * watched task's state, the knobs and the time, with no map, helper or kernel type. The BPF
 * program does the map lookups, deletions and statistics around them; the agent's unit tests
 * compile this same header on the host (src/bpf/watch_host.c) and drive it with a fake clock
 * (src/watch_model.rs). It uses only C's own integer types, so it compiles in the BPF program
 * (after vmlinux.h and bpf_helpers.h) and on the host alike.
 *
 * Count mode (budget_ns == 0): a new task gets `count` boosted switch-ins; each switch-in uses
 * one, except a direct return from the agent (victim -> agent -> victim), which the task did not
 * cause; each wake-up from a sleep gives one back, up to the count. At 0 the task leaves.
 * Budget mode (budget_ns > 0): a new task gets budget_ns of run time, charged from each
 * switch-in to its switch-out; each wake-up earns back refill_ns, up to budget_ns. A run that
 * uses up the rest (ran >= what is left) ends the watch. It also gets budget_ns of waiting: a
 * watched task switched out still runnable (preempted, by a guest hog say) keeps its CPU's need
 * while it waits there, charged from that switch-out to its next switch-in; each wake-up earns
 * back refill_ns of it too, up to budget_ns. Waiting is charged to its own allowance, not to the
 * run budget: a start-up behind k guest hogs waits about k times its run time, and charged to
 * the run budget that wait would end its boost before its run did. A task whose waiting
 * allowance is spent still needs while it runs, but no longer while it waits; it leaves when its
 * run budget is spent, as before. So a new task keeps its VM boosted for at most 2 x budget_ns
 * plus 2 x refill_ns per wake-up, however long it stays runnable. Times are CLOCK_MONOTONIC ns,
 * never 0.
 */
#ifndef COSCHED_WATCH_H
#define COSCHED_WATCH_H

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* A watched task (the watch map's value). Count mode: `count` boosted switch-ins left. Budget
 * mode: `budget_ns` of run time left, `since_ns` its current switch-in (0: not on a CPU),
 * `wait_ns` of waiting left, `wait_since_ns` the switch-out it waits since (0: not waiting with
 * a need) and `wait_cpu` the CPU it waits on. */
struct watched {
	unsigned long long budget_ns;
	unsigned long long since_ns;
	unsigned long long wait_ns;
	unsigned long long wait_since_ns;
	unsigned int count;
	unsigned int wait_cpu;
};

/* What a step asks of the caller (bits). */
#define WATCH_BOOST 1u	/* this switch-in needs a boost */
#define WATCH_DROP 2u	/* the task leaves the watch list */
#define WATCH_FREE 4u	/* count mode: a return from the agent, not charged */
#define WATCH_SPENT 8u	/* budget mode: this run used up the budget */
#define WATCH_WAIT 16u	/* budget mode: the task waits runnable on wait_cpu, needing, for at most
			 * wait_ns (the caller counts it on that CPU) */
#define WATCH_WAITED 32u	/* budget mode: a wait with a need ended (the caller uncounts it on
				 * wait_cpu) */

/* A new task's state (sched_wakeup_new). */
static __always_inline struct watched watch_new(unsigned long long budget_ns, unsigned int count)
{
	struct watched w = { .budget_ns = budget_ns, .wait_ns = budget_ns, .count = count };

	return w;
}

/* Whether new tasks are watched at all. */
static __always_inline int watch_is_on(unsigned long long budget_ns, unsigned int count)
{
	return budget_ns ? 1 : count > 0;
}

/* A watched task is switched in at `now`. */
static __always_inline unsigned int watch_in(struct watched *w, unsigned long long budget_ns, int back_from_agent,
					     unsigned long long now)
{
	unsigned int r = 0;

	if (budget_ns) {
		/* The wait since the switch-out (watch_out) is charged now. */
		if (w->wait_since_ns) {
			unsigned long long waited = now > w->wait_since_ns ? now - w->wait_since_ns : 0;

			w->wait_ns = waited < w->wait_ns ? w->wait_ns - waited : 0;
			w->wait_since_ns = 0;
			r = WATCH_WAITED;
		}
		/* The run is charged at the switch-out (watch_out). */
		if (w->budget_ns > 0) {
			w->since_ns = now;
			return r | WATCH_BOOST;
		}
		return r | WATCH_DROP;
	}
	if (w->count > 0) {
		r = WATCH_BOOST;
		/* Every hint wakes the agent, which preempts the task that caused it: coming back
		 * from the agent is not the task's doing, and charging it would make a task leave
		 * the list in proportion to the hints it caused. Only a direct return is free:
		 * after task -> kworker -> agent -> task, the task pays for the kworker's
		 * preemption as usual. */
		if (back_from_agent)
			r |= WATCH_FREE;
		else
			__sync_fetch_and_add(&w->count, -1); /* BPF has no atomic sub */
	}
	if (w->count == 0)
		r |= WATCH_DROP;
	return r;
}

/* Budget mode: a watched task is switched out at `now` from CPU `cpu`, still runnable or not; its
 * run since the switch-in is charged. Still runnable with waiting left, it waits with a need. */
static __always_inline unsigned int watch_out(struct watched *w, unsigned long long now, int runnable,
					      unsigned int cpu)
{
	unsigned long long ran;

	if (!w->since_ns)
		return 0;
	ran = now > w->since_ns ? now - w->since_ns : 0;
	w->since_ns = 0;
	if (ran >= w->budget_ns) {
		w->budget_ns = 0;
		return WATCH_SPENT | WATCH_DROP;
	}
	w->budget_ns -= ran;
	if (runnable && w->wait_ns > 0) {
		w->wait_since_ns = now;
		w->wait_cpu = cpu;
		return WATCH_WAIT;
	}
	return 0;
}

/* A watched task wakes up from a sleep it chose (I/O, timer): it stays interactive. */
static __always_inline void watch_wake(struct watched *w, unsigned long long budget_ns, unsigned long long refill_ns,
				       unsigned int count)
{
	if (budget_ns) {
		unsigned long long b = w->budget_ns + refill_ns;

		w->budget_ns = b < budget_ns ? b : budget_ns;
		b = w->wait_ns + refill_ns;
		w->wait_ns = b < budget_ns ? b : budget_ns;
	} else if (w->count < count) {
		__sync_fetch_and_add(&w->count, 1);
	}
}

#endif /* COSCHED_WATCH_H */
