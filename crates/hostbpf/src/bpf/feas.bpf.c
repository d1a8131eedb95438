// SPDX-License-Identifier: GPL-2.0
/*
 * cosched FEAS event detection (after the FEAS paper): an event for a VM is one of its main-loop or
 * I/O threads woken by a device, or (on KVM) an interrupt injected by one of its non-vCPU threads.
 * When a vCPU thread of that VM is runnable but waiting for a CPU, and the VM is within n_limit
 * boosts this counting cycle, the daemon is woken to boost it (FEAS_BOOST); beyond the limit it is
 * told once per cycle (FEAS_POSTPONED). Nothing else leaves the kernel.
 *
 * Device or timer? sched_waking fires in the waker's context, so the context tells:
 *   - inside a timer callback (between hrtimer_expire_entry/exit or timer_expire_entry/exit on
 *     this CPU): a timer the VM set for itself (ppoll's timeout, a timerfd, KVM's emulated
 *     LAPIC timer) -- not an event;
 *   - inside a hard or soft interrupt handler (irq_handler_entry/exit, softirq_entry/exit): a
 *     packet (NET_RX), a disk completion (BLOCK, or the aio/io_uring eventfd signalled from the
 *     completion interrupt) -- an event, whoever's task was interrupted;
 *   - in a task: another process (the host's network stack on behalf of a sender writing to a
 *     tap or socket, a vhost worker) -- an event; a thread of the same VM -- not an event (a
 *     vCPU kicking its main loop, the main loop waking a worker), unless it is one of its
 *     "worker" threads finishing a read or write (aio=threads): that is a disk completion.
 * The woken thread first has to run to hand the event to the guest (QEMU reads the packet and
 * raises the virtual interrupt), so the event fires when that thread goes back to sleep.
 *
 * A busy main loop (a bulk transfer) is seldom woken: it finds the next packet before it sleeps.
 * So the devices themselves are watched too, and their events fire at once:
 *   - a packet queued to a VM's tap device (net_dev_queue: host -> guest goes through
 *     dev_queue_xmit on the tap), the tap named by (netns inode, name) in feas_netdevs;
 *   - a request completed on a block device a VM's QEMU holds open (block_rq_complete), by its
 *     dev_t in feas_blkdevs. An image file on a shared filesystem is not attributed: its
 *     device's completions are every user's.
 * The daemon finds both from the QEMU process's fds.
 *
 * vCPU states come from sched_waking (runnable) and sched_switch (running, preempted: waiting,
 * or asleep), and so does their run time, exact at any moment (the daemon charges boosts by it). A boosted vCPU (asked for in the last slice and at a real-time class) going to
 * sleep sends FEAS_BLOCKED: the boost ends.
 *
 * The same states time the run delay (feas_intf.h: rd_hists): a vCPU's wait runnable, from its
 * wake-up or its preemption to its switch in, per VM, level (rd_levels, written by the daemon)
 * and kind, in log2 buckets, unless feas_conf.run_delay is 0.
 *
 * Two sets of the same programs, one per attach mechanism (tp_btf, else raw_tp); the crate loads
 * one. The KVM injection tracepoints are raw_tp only and optional (no KVM: not attached).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "feas_intf.h"

char LICENSE[] SEC("license") = "GPL";

#define SCHED_FIFO 1
#define SCHED_RR 2

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, s32);	/* tid */
	__type(value, struct feas_thread);
} feas_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, s32);	/* tgid */
	__type(value, struct feas_vm);
} feas_vms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct feas_conf);
} feas_conf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} feas_msgs SEC(".maps");

/* A VM's devices (feas_intf.h): tap -> QEMU pid, block device (kernel dev_t) -> QEMU pid. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct feas_netdev);
	__type(value, s32);
} feas_netdevs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);	/* dev_t as the kernel keeps it: major << 20 | minor */
	__type(value, s32);
} feas_blkdevs SEC(".maps");

/* Run delay (feas_intf.h): each VM's level, as the daemon applied it, and the histograms. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, s32);	/* tgid */
	__type(value, u32);	/* enum rd_level */
} rd_levels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096 * RD_LEVELS * 2);
	__type(key, struct rd_key);
	__type(value, struct rd_hist);
} rd_hists SEC(".maps");

/* Per CPU: how deep in timer callbacks and in interrupt handlers this CPU is. */
/* Which contexts a CPU is in, one bit each: each kind does not nest with itself on a CPU
 * (hrtimer callbacks run in hard interrupt context, timer_list callbacks in the timer softirq,
 * and neither softirqs nor hard interrupts nest with their own kind), so a bit set at entry and
 * cleared at exit needs no depth. A missed exit (a program attached between the two, or not run
 * while another BPF program ran on the CPU) then lasts only until that kind's next exit; a depth
 * counter stayed wrong for good, and every later wake-up on that CPU looked like a timer's. */
enum { CTX_HRTIMER = 1, CTX_TIMER = 2, CTX_SOFTIRQ = 4, CTX_HARDIRQ = 8 };
#define CTX_TIMERS (CTX_HRTIMER | CTX_TIMER)
#define CTX_IRQS (CTX_SOFTIRQ | CTX_HARDIRQ)

struct cpu_ctx {
	u32 in;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_ctx);
} cpu_ctx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct feas_stats);
} feas_stats SEC(".maps");

/* Puts the shared types in the object's BTF, so the skeleton generates them. */
const struct feas_msg *feas_msg_type __attribute__((unused));
const struct feas_thread *feas_thread_type __attribute__((unused));
const struct feas_vm *feas_vm_type __attribute__((unused));
const struct feas_conf *feas_conf_type __attribute__((unused));
const struct feas_netdev *feas_netdev_type __attribute__((unused));
const struct rd_key *rd_key_type __attribute__((unused));
const struct rd_hist *rd_hist_type __attribute__((unused));
const enum rd_level *rd_level_type __attribute__((unused));
const enum rd_kind *rd_kind_type __attribute__((unused));

static __always_inline struct feas_stats *stats(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&feas_stats, &zero);
}

static __always_inline struct cpu_ctx *ctx_here(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_ctx, &zero);
}

static __always_inline void enter(u32 kind)
{
	struct cpu_ctx *c = ctx_here();

	if (c)
		c->in |= kind;
}

static __always_inline void leave(u32 kind)
{
	struct cpu_ctx *c = ctx_here();

	if (c)
		c->in &= ~kind;
}

static __always_inline void send(enum feas_msg_kind kind, s32 tgid, u64 now)
{
	struct feas_stats *st = stats();
	struct feas_msg *m = bpf_ringbuf_reserve(&feas_msgs, sizeof(*m), 0);

	if (!m) {
		if (st)
			st->dropped++;
		return;
	}
	m->kind = kind;
	m->tgid = tgid;
	m->ts = now;
	bpf_ringbuf_submit(m, 0);
}

static __always_inline u32 log2_u64(u64 v)
{
	u32 r = 0;

	if (v >> 32) {
		v >>= 32;
		r += 32;
	}
	if (v >> 16) {
		v >>= 16;
		r += 16;
	}
	if (v >> 8) {
		v >>= 8;
		r += 8;
	}
	if (v >> 4) {
		v >>= 4;
		r += 4;
	}
	if (v >> 2) {
		v >>= 2;
		r += 2;
	}
	if (v >> 1)
		r += 1;
	return r;
}

/* A vCPU thread of VM `tgid` waited `ns` runnable before it ran: into its VM's histogram at the
 * VM's level now. */
static __always_inline void run_delay(s32 tgid, u32 kind, u64 ns)
{
	struct rd_key key = { .tgid = tgid, .kind = kind };
	struct rd_hist *h;
	u32 zero = 0, *level, b = log2_u64(ns);
	struct feas_conf *conf = bpf_map_lookup_elem(&feas_conf, &zero);

	if (!conf || !conf->run_delay)
		return;
	level = bpf_map_lookup_elem(&rd_levels, &tgid);
	key.level = level && *level < RD_LEVELS ? *level : RD_NORMAL;
	h = bpf_map_lookup_elem(&rd_hists, &key);
	if (!h) {
		struct rd_hist zero = {};

		bpf_map_update_elem(&rd_hists, &key, &zero, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&rd_hists, &key);
		if (!h)
			return;
	}
	if (b >= RD_BUCKETS)
		b = RD_BUCKETS - 1;
	h->count++;
	h->sum_ns += ns;
	h->buckets[b]++;
}

/* An event for VM `tgid`: boost, postpone, or nothing (then it is pending: vm->pending). */
static __always_inline void fire(s32 tgid)
{
	struct feas_stats *st = stats();
	struct feas_vm *vm = bpf_map_lookup_elem(&feas_vms, &tgid);
	struct feas_conf *conf;
	u32 zero = 0, i, n;
	bool waiting = false, running = false;
	u64 now, cycle;

	if (!vm || !vm->on || !st)
		return;
	conf = bpf_map_lookup_elem(&feas_conf, &zero);
	if (!conf || !conf->cycle_ns)
		return;
	n = vm->nr_vcpus;
	for (i = 0; i < FEAS_MAX_VCPUS; i++) {
		struct feas_thread *t;
		s32 tid;

		if (i >= n)
			break;
		tid = vm->vcpus[i];
		t = bpf_map_lookup_elem(&feas_threads, &tid);
		if (t && t->state == FEAS_WAITING) {
			waiting = true;
			break;
		}
		if (t && t->state == FEAS_RUNNING)
			running = true;
	}
	now = bpf_ktime_get_ns();
	/* A vCPU that runs when the event comes handles it, unless it is preempted first: with
	 * boost_running, the boost keeps it on its CPU until it has run the policy's run_us.
	 * Otherwise the event is pending, and fires if a vCPU is preempted within a cycle. */
	if (!waiting && !(running && conf->boost_running)) {
		st->not_waiting++;
		vm->pending = now;
		return;
	}
	vm->pending = 0;
	cycle = (now - conf->epoch_ns) / conf->cycle_ns;
	if (vm->cycle != cycle) {
		vm->cycle = cycle;
		vm->count = 0;
		vm->postponed = 0;
	}
	if (vm->count < conf->n_limit) {
		vm->count++;
		vm->boost_until = now + conf->slice_ns;
		st->boost++;
		send(FEAS_BOOST, tgid, now);
	} else if (!vm->postponed) {
		vm->postponed = 1;
		st->postponed++;
		send(FEAS_POSTPONED, tgid, now);
	} else {
		st->limited++;
	}
}

static __always_inline void on_waking(struct task_struct *p)
{
	s32 tid = BPF_CORE_READ(p, pid), tgid;
	struct feas_thread *t = bpf_map_lookup_elem(&feas_threads, &tid);
	struct feas_stats *st;
	struct cpu_ctx *c;
	u64 cur;

	if (!t)
		return;
	tgid = BPF_CORE_READ(p, tgid);
	if (t->tgid != tgid)
		return; /* a recycled id: not the thread the daemon meant */
	if (t->role == FEAS_VCPU) {
		u64 now = bpf_ktime_get_ns();

		/* A thread woken before it switched out (it set itself asleep, then was woken) or
		 * one already waiting preempted is runnable all along: its time and wait go on. */
		if (t->state == FEAS_RUNNING || t->state == FEAS_WAITING)
			return;
		if (t->state == FEAS_SLEEPING && t->since && now > t->since)
			t->sleep_ns += now - t->since;
		t->since = now;
		t->state = FEAS_WAITING;
		t->woken = 1;
		return;
	}
	if (t->role != FEAS_EVENT && t->role != FEAS_WORKER)
		return;
	st = stats();
	c = ctx_here();
	if (!st || !c)
		return;
	if (c->in & CTX_TIMERS) {
		st->timer++;
		return;
	}
	if (!(c->in & CTX_IRQS)) {
		cur = bpf_get_current_pid_tgid();
		if ((s32)(cur >> 32) == tgid) {
			s32 waker = (u32)cur;
			struct feas_thread *w = bpf_map_lookup_elem(&feas_threads, &waker);

			if (!w || w->role != FEAS_WORKER) {
				st->internal++;
				return;
			}
		}
	}
	st->device++;
	t->pending = 1;
}

static __always_inline void on_switch(bool preempt, struct task_struct *prev, struct task_struct *next)
{
	s32 tid = BPF_CORE_READ(prev, pid), tgid;
	struct feas_thread *t = bpf_map_lookup_elem(&feas_threads, &tid);

	if (t) {
		tgid = BPF_CORE_READ(prev, tgid);
		if (t->tgid == tgid) {
			bool asleep = !preempt && BPF_CORE_READ(prev, __state) != 0;

			if (t->role == FEAS_VCPU) {
				u64 now = bpf_ktime_get_ns();

				if (t->state == FEAS_RUNNING && t->since && now > t->since)
					t->run_ns += now - t->since;
				t->since = now;
				t->state = asleep ? FEAS_SLEEPING : FEAS_WAITING;
				t->woken = 0;
				if (!asleep) {
					/* Preempted with an event of its VM pending (it came while the
					 * vCPUs ran, within a cycle): the guest has not had the CPU to
					 * handle it; it fires now that this vCPU waits. */
					struct feas_vm *vm = bpf_map_lookup_elem(&feas_vms, &tgid);
					struct feas_conf *conf;
					u32 zero = 0;

					conf = bpf_map_lookup_elem(&feas_conf, &zero);
					if (vm && vm->on && vm->pending && conf && now - vm->pending <= conf->cycle_ns) {
						struct feas_stats *st = stats();

						vm->pending = 0;
						if (st)
							st->deferred++;
						fire(tgid);
					}
				}
				if (asleep) {
					struct feas_vm *vm = bpf_map_lookup_elem(&feas_vms, &tgid);
					u32 policy = BPF_CORE_READ(prev, policy);

					if (vm && vm->boost_until > now && (policy == SCHED_RR || policy == SCHED_FIFO)) {
						struct feas_stats *st = stats();

						vm->boost_until = 0;
						if (st)
							st->blocked++;
						send(FEAS_BLOCKED, tgid, now);
					}
				}
			} else if (t->pending && asleep) {
				t->pending = 0;
				fire(tgid);
			}
		}
	}
	tid = BPF_CORE_READ(next, pid);
	t = bpf_map_lookup_elem(&feas_threads, &tid);
	if (t && t->role == FEAS_VCPU && t->tgid == BPF_CORE_READ(next, tgid)) {
		u64 now = bpf_ktime_get_ns();

		if (t->state == FEAS_WAITING && t->since && now > t->since)
			run_delay(t->tgid, t->woken ? RD_WOKEN : RD_PREEMPTED, now - t->since);
		t->state = FEAS_RUNNING;
		t->since = now;
	}
}

/* A KVM interrupt injection: an event when a thread of a VM, other than its vCPUs, injects. */
static __always_inline void on_kvm_irq(void)
{
	u64 cur = bpf_get_current_pid_tgid();
	s32 tgid = cur >> 32, tid = (u32)cur;
	struct feas_thread *t;
	struct feas_stats *st;

	if (!bpf_map_lookup_elem(&feas_vms, &tgid))
		return;
	t = bpf_map_lookup_elem(&feas_threads, &tid);
	if (t && t->role == FEAS_VCPU)
		return; /* the vCPU itself runs: nothing to boost */
	st = stats();
	if (st)
		st->kvm_irq++;
	fire(tgid);
}

/* A packet queued to a device: an event if the device is a watched VM's tap. */
static __always_inline void on_net_queue(struct sk_buff *skb)
{
	struct feas_netdev key = {};
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	struct feas_stats *st;
	s32 *tgid;

	if (!dev)
		return;
	key.netns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
	BPF_CORE_READ_STR_INTO(&key.name, dev, name);
	tgid = bpf_map_lookup_elem(&feas_netdevs, &key);
	if (!tgid)
		return;
	st = stats();
	if (st)
		st->net++;
	fire(*tgid);
}

/* A block request completed: an event if its device is one a watched VM holds. */
static __always_inline void on_block_complete(struct request *rq)
{
	struct feas_stats *st;
	u32 dev = BPF_CORE_READ(rq, part, bd_dev);
	s32 *tgid;

	if (!dev)
		return;
	tgid = bpf_map_lookup_elem(&feas_blkdevs, &dev);
	if (!tgid)
		return;
	st = stats();
	if (st)
		st->block++;
	fire(*tgid);
}

/* ---- tp_btf ---- */

SEC("tp_btf/sched_waking")
int BPF_PROG(btf_waking, struct task_struct *p)
{
	on_waking(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(btf_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	on_switch(preempt, prev, next);
	return 0;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(btf_hrtimer_entry)
{
	enter(CTX_HRTIMER);
	return 0;
}

SEC("tp_btf/hrtimer_expire_exit")
int BPF_PROG(btf_hrtimer_exit)
{
	leave(CTX_HRTIMER);
	return 0;
}

SEC("tp_btf/timer_expire_entry")
int BPF_PROG(btf_timer_entry)
{
	enter(CTX_TIMER);
	return 0;
}

SEC("tp_btf/timer_expire_exit")
int BPF_PROG(btf_timer_exit)
{
	leave(CTX_TIMER);
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(btf_softirq_entry)
{
	enter(CTX_SOFTIRQ);
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(btf_softirq_exit)
{
	leave(CTX_SOFTIRQ);
	return 0;
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(btf_irq_entry)
{
	enter(CTX_HARDIRQ);
	return 0;
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(btf_irq_exit)
{
	leave(CTX_HARDIRQ);
	return 0;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(btf_net_queue, struct sk_buff *skb)
{
	on_net_queue(skb);
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(btf_block_complete, struct request *rq)
{
	on_block_complete(rq);
	return 0;
}

/* ---- raw_tp ---- */

SEC("raw_tp/sched_waking")
int BPF_PROG(raw_waking, struct task_struct *p)
{
	on_waking(p);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	on_switch(preempt, prev, next);
	return 0;
}

SEC("raw_tp/hrtimer_expire_entry")
int BPF_PROG(raw_hrtimer_entry)
{
	enter(CTX_HRTIMER);
	return 0;
}

SEC("raw_tp/hrtimer_expire_exit")
int BPF_PROG(raw_hrtimer_exit)
{
	leave(CTX_HRTIMER);
	return 0;
}

SEC("raw_tp/timer_expire_entry")
int BPF_PROG(raw_timer_entry)
{
	enter(CTX_TIMER);
	return 0;
}

SEC("raw_tp/timer_expire_exit")
int BPF_PROG(raw_timer_exit)
{
	leave(CTX_TIMER);
	return 0;
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(raw_softirq_entry)
{
	enter(CTX_SOFTIRQ);
	return 0;
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(raw_softirq_exit)
{
	leave(CTX_SOFTIRQ);
	return 0;
}

SEC("raw_tp/irq_handler_entry")
int BPF_PROG(raw_irq_entry)
{
	enter(CTX_HARDIRQ);
	return 0;
}

SEC("raw_tp/irq_handler_exit")
int BPF_PROG(raw_irq_exit)
{
	leave(CTX_HARDIRQ);
	return 0;
}

SEC("raw_tp/net_dev_queue")
int BPF_PROG(raw_net_queue, struct sk_buff *skb)
{
	on_net_queue(skb);
	return 0;
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(raw_block_complete, struct request *rq)
{
	on_block_complete(rq);
	return 0;
}

/* ---- KVM (optional) ---- */

SEC("raw_tp/kvm_set_irq")
int BPF_PROG(raw_kvm_set_irq)
{
	on_kvm_irq();
	return 0;
}

SEC("raw_tp/kvm_msi_set_irq")
int BPF_PROG(raw_kvm_msi_set_irq)
{
	on_kvm_irq();
	return 0;
}
