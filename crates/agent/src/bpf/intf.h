/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the BPF program (cosched.bpf.c) and the agent (src/lib.rs): the single source
 * of truth for their layout. The Rust side gets them through the generated skeleton.
 */
#ifndef COSCHED_INTF_H
#define COSCHED_INTF_H

/* Why a CPU wants a boost (cosched_event.reason). */
enum cosched_reason {
	COSCHED_REASON_NONE = 0,	/* deboost at a switch, MIN_BOOST_TIME (or hold) elapsed */
	COSCHED_REASON_RT = 1,		/* an RT/DL task (prio < 100) was switched in */
	COSCHED_REASON_WATCHED = 2,	/* a watched (new or interactive) task was switched in */
	COSCHED_REASON_TIMER = 3,	/* deboost by the no-switch timer (a lone CPU hog) */
};

/* One transition of one CPU, sent through the ring buffer. */
struct cosched_event {
	unsigned long long ts_ns;
	unsigned int cpu;
	unsigned int want;	/* 1 boost, 0 deboost */
	unsigned int reason;	/* enum cosched_reason */
	unsigned int pid;	/* the task switched in */
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
};

#endif
