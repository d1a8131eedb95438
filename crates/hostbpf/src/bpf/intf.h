/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the BPF programs (threads.bpf.c) and the crate (src/lib.rs): the single source
 * of truth for their layout. The Rust side gets them through the generated skeleton.
 */
#ifndef COSCHED_HOSTBPF_INTF_H
#define COSCHED_HOSTBPF_INTF_H

#define HOSTBPF_COMM_LEN 16

/* What happened to a thread (thread_event.kind). */
enum thread_event_kind {
	THREAD_CREATED = 1,	/* a new thread in a watched process (comm is empty) */
	THREAD_RENAMED = 2,	/* a thread of a watched process got a new name (comm) */
	THREAD_EXITED = 3,	/* a thread of a watched process exited (comm is empty) */
};

/* One event, sent through the ring buffer `events`. */
struct thread_event {
	enum thread_event_kind kind;
	int tgid;		/* the process (QEMU's pid) */
	int tid;		/* the thread */
	char comm[HOSTBPF_COMM_LEN];	/* THREAD_RENAMED: the new name, NUL-terminated */
};

/* Counters, per CPU (summed by the crate). */
struct thread_stats {
	unsigned long long sent;	/* events put in the ring buffer */
	unsigned long long dropped;	/* events lost: the ring buffer was full */
	unsigned long long forgotten;	/* watched processes whose last thread exited */
};

#endif
