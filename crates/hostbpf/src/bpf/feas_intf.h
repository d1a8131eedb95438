/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the FEAS event detection (feas.bpf.c) and the crate (src/feas.rs): the single
 * source of truth for their layout.
 */
#ifndef COSCHED_FEAS_INTF_H
#define COSCHED_FEAS_INTF_H

/* vCPU threads of one VM the kernel side looks at (more are never reported waiting). */
#define FEAS_MAX_VCPUS 32

/* What a watched thread is to its VM (feas_thread.role). */
enum feas_role {
	FEAS_VCPU = 1,		/* "CPU n/KVM", "CPU n/TCG": boosted */
	FEAS_EVENT = 2,		/* main loop, "IO ..." threads: woken by the VM's devices */
	FEAS_WORKER = 3,	/* "worker" (aio=threads): its wake-ups of the others are disk completions */
};

/* What a vCPU thread is doing (feas_thread.state), from sched_waking and sched_switch. */
enum feas_state {
	FEAS_UNKNOWN = 0,	/* not seen switching yet */
	FEAS_SLEEPING = 1,
	FEAS_WAITING = 2,	/* runnable, not running */
	FEAS_RUNNING = 3,
};

/* Map feas_threads: tid -> this. Written by the daemon (tgid, role), updated by the programs. */
struct feas_thread {
	int tgid;
	unsigned int role;
	unsigned int state;
	unsigned int pending;	/* FEAS_EVENT: woken by a device; the VM's event fires when it sleeps */
	/* FEAS_VCPU: CPU time run up to `since` (ktime ns), and since when it runs (if RUNNING).
	 * /proc's schedstat lags a running thread by up to a tick; this does not. */
	unsigned long long run_ns;
	unsigned long long since;
	/* FEAS_VCPU: time spent asleep up to `since` (from its switch-out asleep to its wake-up):
	 * a vCPU that sleeps wants less than its share, and its boosts are not charged. */
	unsigned long long sleep_ns;
	/* FEAS_VCPU, while FEAS_WAITING: 1 if woken (sched_waking), 0 if preempted while runnable. */
	unsigned int woken;
	unsigned int pad;
};

/* Map feas_vms: QEMU pid -> this. Written by the daemon (on, vcpus); the rest by the programs. */
struct feas_vm {
	unsigned int on;	/* event boosting applies to this VM now */
	unsigned int nr_vcpus;
	int vcpus[FEAS_MAX_VCPUS];
	unsigned long long cycle;	/* the counting cycle of `count` */
	unsigned int count;	/* boosts asked for in `cycle` */
	unsigned int postponed;	/* a postponement was sent in `cycle` */
	unsigned long long boost_until;	/* a boost asked for may last until then (ktime ns) */
	/* ktime ns of the last event that found no vCPU waiting (0: none since): the guest was
	 * running when it came; if a vCPU is preempted within a cycle of it, before it could have
	 * handled it, the event fires then (deferred). */
	unsigned long long pending;
};

/* Map feas_conf[0]: the policy's knobs the kernel side applies. */
struct feas_conf {
	unsigned long long epoch_ns;	/* ktime (CLOCK_MONOTONIC) of cycle 0 */
	unsigned long long cycle_ns;
	unsigned long long slice_ns;
	unsigned int n_limit;
	unsigned int run_delay;	/* measure the run delay (rd_hists) */
	unsigned int boost_running;	/* an event while a vCPU runs (none waits) boosts too */
	unsigned int pad;
};

/* What wakes the daemon (ring buffer feas_msgs). */
enum feas_msg_kind {
	FEAS_BOOST = 1,		/* an event for a VM with a waiting (or running, boost_running) vCPU, within n_limit */
	FEAS_POSTPONED = 2,	/* the same beyond n_limit: boost at the next cycle (once per cycle) */
	FEAS_BLOCKED = 3,	/* a boosted (real-time) vCPU of the VM went to sleep */
};

struct feas_msg {
	enum feas_msg_kind kind;
	int tgid;
	unsigned long long ts;	/* ktime ns */
};

/* Counters, per CPU (summed by the crate). */
struct feas_stats {
	unsigned long long device;	/* event-thread wake-ups by a device (interrupt, another process, a worker) */
	unsigned long long timer;	/* ... by a timer: not events */
	unsigned long long internal;	/* ... by another thread of the same VM: not events */
	unsigned long long kvm_irq;	/* interrupt injections by a non-vCPU thread of the VM (KVM) */
	unsigned long long boost;	/* FEAS_BOOST sent */
	unsigned long long postponed;	/* FEAS_POSTPONED sent */
	unsigned long long limited;	/* events over n_limit after the postponement was sent */
	unsigned long long not_waiting;	/* events while no vCPU of the VM was waiting */
	unsigned long long blocked;	/* FEAS_BLOCKED sent */
	unsigned long long dropped;	/* messages lost: the ring buffer was full */
	unsigned long long net;	/* packets queued to a watched VM's tap (net_dev_queue): events */
	unsigned long long block;	/* requests completed on a watched VM's disk (block_rq_complete): events */
	unsigned long long deferred;	/* events that found no vCPU waiting, fired at a vCPU's preemption */
};

/* Map feas_netdevs: a VM's tap device -> its QEMU pid (written by the daemon). A device is named
 * by its network namespace (the inode of /proc/<pid>/ns/net) and its name: taps may live in a
 * namespace other than the daemon's, where another device has the same name. */
#define FEAS_IFNAMSIZ 16
struct feas_netdev {
	unsigned int netns;
	char name[FEAS_IFNAMSIZ];	/* NUL-padded */
};

/* Run delay: how long a vCPU thread waits runnable before it runs, from its wake-up
 * (sched_waking) or its preemption (switched out runnable) to its switch in, in log2 buckets of
 * ns per (VM, level, kind). The daemon says each VM's level (map rd_levels: tgid -> level). */
#define RD_BUCKETS 40	/* bucket i: [2^i, 2^(i+1)) ns; the last also holds everything longer */

enum rd_level {
	RD_NORMAL = 0,
	RD_BOOSTED = 1,		/* the CPU boost (the guest asked) */
	RD_EVENT = 2,		/* event boosting (FEAS) */
	RD_STATIC = 3,		/* a static FIFO tuning */
	RD_LEVELS = 4,
};

enum rd_kind {
	RD_PREEMPTED = 0,	/* switched out runnable, until switched in */
	RD_WOKEN = 1,		/* from its wake-up to its switch in */
};

struct rd_key {
	int tgid;
	unsigned short level;
	unsigned short kind;
};

/* Map rd_hists (per CPU): rd_key -> this. */
struct rd_hist {
	unsigned long long count;
	unsigned long long sum_ns;
	unsigned long long buckets[RD_BUCKETS];
};

#endif
