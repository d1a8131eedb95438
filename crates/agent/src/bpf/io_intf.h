/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the I/O detector's BPF program (io.bpf.c) and the agent (src/io.rs), as
 * intf.h is for the CPU detector: the Rust side uses the types libbpf-cargo generates from the
 * program's BTF (the io skeleton's `types` module), never a copied layout. Each type is referred
 * to by a map or a global of io.bpf.c, so that it is generated. Every field accepts any bit
 * pattern (integers, arrays of them, opaque kernel structs). Include after vmlinux.h.
 */
#ifndef COSCHED_IO_INTF_H
#define COSCHED_IO_INTF_H

#define IO_DISK_NAME_LEN 32

/* One transition of one BFQ instance (a disk), sent through the ring buffer. */
struct cosched_io_event {
	unsigned long long ts_ns;
	unsigned long long bfqd;	/* the instance's struct bfq_data: the unit's key */
	unsigned int want;		/* 1: it has weight-raised busy queues; 0: none for io_hold_ns */
	int wr_busy_queues;		/* bfqd->wr_busy_queues when seen */
	char disk[IO_DISK_NAME_LEN];	/* e.g. "vda" */
};

/* Counters, per CPU (summed by the agent). */
struct cosched_io_stats {
	unsigned long long samples;	/* wr_busy_queues read after a BFQ operation */
	unsigned long long raises;	/* 0 -> >0 reported */
	unsigned long long lowers;	/* back to 0 for io_hold_ns, reported */
	unsigned long long holds;	/* 0 seen while raised: the hold timer started or ran on */
	unsigned long long exits;	/* BFQ instances that went away (scheduler switched, disk removed) */
	unsigned long long events_dropped;
};

/*
 * The detector's state of one BFQ instance (value of the io_states hash map, keyed by the
 * struct bfq_data's address). The agent reads `raised` (the ground truth its reconciliation
 * compares against); the bpf_timer is opaque to it (16 bytes of padding in the generated type).
 */
struct cosched_io_state {
	unsigned long long last_busy_ns;	/* last time wr_busy_queues > 0 was seen */
	int wr_busy_queues;		/* as last seen */
	unsigned int raised;		/* reported to the agent: 1 after a 0 -> >0 event */
	unsigned int timer_armed;
	unsigned int timer_ready;
	char disk[IO_DISK_NAME_LEN];
	struct bpf_timer timer;
};

#endif
