/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the BPF program (cpu.bpf.c) and the agent (src/cpu.rs): the single source
 * of truth for their layout. The Rust side never copies a layout or an offset: it uses the types
 * libbpf-cargo generates from the program's BTF into the skeleton's `types` module. A type is
 * generated only if a map or a global refers to it, so each one here is referred to by one
 * (cpu_states, stats, sleepers, and the `cosched_event_type` global in cpu.bpf.c).
 *
 * The agent reads map values and ring-buffer records into these types as raw bytes, so every
 * field must accept any bit pattern: integers, arrays of them, enums (4 bytes), opaque kernel
 * structs; never a bool. Include after vmlinux.h (struct bpf_timer).
 */
#ifndef COSCHED_INTF_H
#define COSCHED_INTF_H

/* Why a CPU wants a boost (cosched_event.reason). */
enum cosched_reason {
	COSCHED_REASON_NONE = 0,	/* deboost at a switch, MIN_BOOST_TIME (or hold) elapsed */
	COSCHED_REASON_RT = 1,		/* an RT/DL task (prio < 100) was switched in */
	COSCHED_REASON_WATCHED = 2,	/* a watched (new or interactive) task was switched in */
	COSCHED_REASON_TIMER = 3,	/* deboost by the no-switch timer (a lone CPU hog) */
	COSCHED_REASON_PRIO = 4,	/* a boosted CPU's need changed priority (want stays 1) */
	COSCHED_REASON_WITHDRAW = 5,	/* a predicted RT wake-up will not come (the task woke early):
					 * not a transition, want is the CPU's boosted flag */
	COSCHED_REASON_EPISODE = 6,	/* only with report_episodes (the agent's --probe-frames): an RT
					 * task starts a new episode on a CPU boosted already, where no
					 * boost goes out; not a transition (want 1) */
};

/* One transition of one CPU, sent through the ring buffer. */
struct cosched_event {
	unsigned long long ts_ns;
	unsigned int cpu;
	unsigned int want;		/* 1 boost, 0 deboost */
	enum cosched_reason reason;	/* 4 bytes, like the unsigned int it replaces */
	unsigned int pid;		/* the task switched in (WITHDRAW: the task woken early) */
	unsigned int prio;		/* want 1: the CPU's need priority (RT 1..99, DEADLINE 99, 0 for
					 * a watched task) */
	unsigned int irq;		/* want 1: that need's task was woken from an interrupt */
};

/* Counters, per CPU (summed by the agent). */
struct cosched_stats {
	unsigned long long switches;
	unsigned long long need_rt;
	unsigned long long need_watched;
	unsigned long long boosts;
	unsigned long long deboosts;
	unsigned long long timer_deboosts;
	unsigned long long watch_added;
	unsigned long long events_dropped;
	unsigned long long watch_agent_returns;	/* victim -> agent -> victim: not charged */
	unsigned long long prio_changes;	/* a boosted CPU's need priority changed (events) */
	unsigned long long irq_wakeups;		/* RT tasks woken from an interrupt handler */
	unsigned long long sleeps_predicted;	/* RT tasks gone to sleep on an armed hrtimer */
	unsigned long long withdrawals;		/* ... of which woken before their timer */
	unsigned long long timer_deboosts_deferred;	/* the no-switch timer found an RT/DL task
							 * queued or an interrupt under way */
	unsigned long long watch_full;		/* new tasks not watched: watch_max already are */
	unsigned long long watch_spent;		/* watched tasks that used up their budget */
	unsigned long long silent_boosts;	/* RT activations in a standing window: no event */
	unsigned long long silent_deboosts;	/* ... their ends: no event either */
	unsigned long long silent_broken;	/* needs still on past the window: a boost sent */
};

/*
 * The standing prediction's window (value of the one-entry standing map, written by the agent
 * when the host takes a periodic task's wake-ups, zeroed when it ends; CLOCK_MONOTONIC): an RT
 * activation from before_ns before to after_ns after anchor_ns + k * period_ns finds the host's
 * boost in force and sends nothing. period_ns 0: none stands.
 */
struct cosched_standing {
	unsigned long long anchor_ns;
	unsigned long long period_ns;
	unsigned long long before_ns;
	unsigned long long after_ns;
};

/* The watch map's value, struct watched, is in watch.h with the heuristic's arithmetic. */

/* Where a sleeper stands (sleeper.state). */
enum cosched_sleeper_state {
	COSCHED_SLEEPER_ARMED = 1,	/* it started an hrtimer_wakeup timer, not asleep yet */
	COSCHED_SLEEPER_ASLEEP = 2,	/* it switched out asleep with that timer queued */
};

/*
 * An RT task's armed wake-up timer (value of the sleepers hash map, key: its pid). The agent
 * reads the ASLEEP ones: the earliest wake_ns is the guest's next predicted RT wake-up.
 */
struct sleeper {
	unsigned long long wake_ns;	/* the timer's (soft) expiry, CLOCK_MONOTONIC */
	unsigned long long timer;	/* the struct hrtimer's address, to check it is still queued */
	unsigned int prio;		/* the task's RT priority when it armed it */
	enum cosched_sleeper_state state;
};

/*
 * The detector's state of one CPU (value of the cpu_states array map). The agent reads `boosted`
 * (the ground truth its reconciliation compares against). The bpf_timer is opaque to user space:
 * the kernel's BTF declares it as two unnamed 64-bit fields, which libbpf-cargo turns into a
 * 16-byte padding array; the agent never touches it.
 */
struct cpu_state {
	unsigned long long last_need_ns;	/* last time a task that needs a boost was on the CPU
						 * (its switch-in, or its switch-out: see on_switch) */
	unsigned long long last_switch_ns;
	unsigned long long episode_start_ns;	/* start of the current run of needing switches */
	unsigned long long period_ns;		/* smoothed time between episode starts */
	unsigned int boosted;
	unsigned int cur_needs;		/* the task switched in last needs a boost (1), or it does not
					 * but a watched task waits runnable on this CPU (2) */
	unsigned int timer_armed;
	unsigned int timer_ready;
	unsigned int agent_victim;	/* the task the agent preempted, if the agent runs now */
	unsigned int prio;		/* the CPU's need priority (reported in events, see on_switch) */
	unsigned int irq;		/* that need's task was woken from an interrupt */
	unsigned int cur_prio;		/* priority of the need of the task switched in last */
	unsigned int episode_prio;	/* highest priority seen in the current episode */
	unsigned int watch_waiting;	/* watched tasks waiting runnable here with a need (watch.h) */
	unsigned long long prio_need_ns;	/* last time a need of priority `prio` was on the CPU */
	unsigned long long wait_until_ns;	/* when the latest of those waits' allowances ends */
	unsigned int silent;		/* boosted by a standing prediction: no event was sent, and
					 * none goes out at its end */
	unsigned int pad;
	struct bpf_timer timer;
};

#endif
