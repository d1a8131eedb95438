// SPDX-License-Identifier: GPL-2.0
/*
 * cosched guest I/O detector (the Virtual-BFQ paper, sec. VII.A): reports when the guest's BFQ
 * has weight-raised busy queues, i.e. when an application that BFQ deems interactive or soft
 * real-time (typically one being started) waits for the disk, and when it no longer has any.
 *
 * BFQ keeps that count in bfqd->wr_busy_queues, one struct bfq_data per disk (BFQ instance).
 * The functions that change it are static and may be inlined, so the count is read after every
 * BFQ operation that can change it instead: the elevator ops BFQ registers (called through
 * pointers, never inlined) and its idle-slice timer, each with fexit. Each runs under bfqd->lock
 * and changes the count only there, so the value read right after one is the one it left.
 *   insert_requests      requests arrive: a queue becomes busy, an idle one gets weight-raised
 *   dispatch_request     a queue is expired or emptied, weight-raising ends (its time is up)
 *   finish_request,      completion: the in-service queue may be expired
 *   finish_requeue_request
 *   exit_icq             a process's I/O context goes (it exited): its queue, if in service
 *                        (e.g. idled on), is expired
 *   idle_slice_timer     BFQ stops idling for an empty in-service queue and expires it
 * (Left out: bfq_low_latency_store, the sysfs write that turns low_latency off and ends every
 * weight-raising at once; the next operation on the disk shows it.)
 * exit_queue (fentry) forgets an instance that goes away (scheduler switched, disk removed).
 *
 * Per instance: a sample with wr_busy_queues > 0 reports want=1 at once (the seed's 0 -> 1).
 * want=0 is reported only once no raised busy queue has been seen for io_hold_ns: by a sample,
 * or by the instance's timer, which runs every io_hold_ns while it is raised and reads the
 * count itself. An application's queue empties between its reads while
 * other queues are served (BFQ then takes it off the busy list), so without the hold one start
 * would flip IO 1 / IO 0 at nearly every read.
 *
 * CO-RE against the bfq module's BTF (bfq.h; /sys/kernel/btf/bfq in the guest).
 */
#include "vmlinux.h"
#include "bfq.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "io_intf.h"

char LICENSE[] SEC("license") = "GPL";

#define CLOCK_MONOTONIC 1
#define MAX_DISKS 256

/* Knob, set by the agent before load. */
const volatile u64 io_hold_ns = 50000000;

/* Dummy instance so that the skeleton's `types` module has `struct cosched_io_event` (see cpu.bpf.c). */
const volatile struct cosched_io_event cosched_io_event_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_DISKS);
	__type(key, u64);	/* struct bfq_data * */
	__type(value, struct cosched_io_state);
} io_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024);
} io_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cosched_io_stats);
} io_stats SEC(".maps");

static __always_inline struct cosched_io_stats *stats_get(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&io_stats, &zero);
}

/* Returns 1 if the agent will see the event (the ring buffer had room). */
static __always_inline int emit(u64 bfqd, struct cosched_io_state *st, u32 want, u64 now)
{
	struct cosched_io_event *e = bpf_ringbuf_reserve(&io_events, sizeof(*e), 0);
	struct cosched_io_stats *s = stats_get();

	if (!e) {
		if (s)
			s->events_dropped++;
		return 0;
	}
	e->ts_ns = now;
	e->bfqd = bfqd;
	e->want = want;
	e->wr_busy_queues = st->wr_busy_queues;
	__builtin_memcpy(e->disk, st->disk, sizeof(e->disk));
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	if (s) {
		if (want)
			s->raises++;
		else
			s->lowers++;
	}
	return 1;
}

static int hold_timer_cb(void *map, u64 *key, struct cosched_io_state *st);

/*
 * Moves st->raised from !want to want and reports it; 0 if another path got there first (or the
 * ring buffer was full: then it stays as it was). BFQ's operations nest on one CPU (a completion
 * in interrupt context runs into a sample in process context, and the timer too), so the flag
 * changes only by compare-and-swap: one transition, one event.
 */
static __always_inline int transition(u64 key, struct cosched_io_state *st, u32 want, u64 now)
{
	if (__sync_val_compare_and_swap(&st->raised, !want, want) != !want)
		return 0;
	if (emit(key, st, want, now))
		return 1;
	st->raised = !want;
	return 0;
}

static __always_inline void arm_timer(struct cosched_io_state *st, u64 ns)
{
	if (!st->timer_ready) {
		/* -EBUSY if a racing path initialised it first: fine either way. */
		bpf_timer_init(&st->timer, &io_states, CLOCK_MONOTONIC);
		bpf_timer_set_callback(&st->timer, hold_timer_cb);
		st->timer_ready = 1;
	}
	if (!st->timer_armed) {
		st->timer_armed = 1;
		bpf_timer_start(&st->timer, ns, 0);
	}
}

/*
 * While an instance is raised its timer runs every io_hold_ns and reads the count itself: IO 0
 * then never depends on a BFQ operation coming after the one that emptied the last raised queue
 * (a path this program does not hook, such as the low_latency sysfs switch, or two CPUs whose
 * samples crossed).
 */
static int hold_timer_cb(void *map, u64 *key, struct cosched_io_state *st)
{
	struct bfq_data *bfqd = (struct bfq_data *)*key;
	u64 now = bpf_ktime_get_ns();
	int wr = BPF_CORE_READ(bfqd, wr_busy_queues);
	u64 until;

	st->timer_armed = 0;
	if (!st->raised)
		return 0;
	st->wr_busy_queues = wr;
	if (wr > 0)
		st->last_busy_ns = now;
	until = st->last_busy_ns + io_hold_ns;
	if (wr <= 0 && now >= until) {
		transition(*key, st, 0, now);
		return 0;
	}
	st->timer_armed = 1;
	bpf_timer_start(&st->timer, wr > 0 ? io_hold_ns : until - now, 0);
	return 0;
}

static __always_inline void sample(struct bfq_data *bfqd)
{
	u64 key = (u64)bfqd;
	struct cosched_io_state *st;
	struct cosched_io_stats *s;
	int wr;
	u64 now;

	if (!bfqd)
		return;
	wr = BPF_CORE_READ(bfqd, wr_busy_queues);
	st = bpf_map_lookup_elem(&io_states, &key);
	if (!st) {
		struct cosched_io_state init = {};

		/* An instance is tracked from its first raised busy queue on. */
		if (wr <= 0)
			return;
		BPF_CORE_READ_STR_INTO(&init.disk, bfqd, queue, disk, disk_name);
		bpf_map_update_elem(&io_states, &key, &init, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&io_states, &key);
		if (!st)
			return;
	}
	s = stats_get();
	if (s)
		s->samples++;
	now = bpf_ktime_get_ns();
	st->wr_busy_queues = wr;
	if (wr > 0) {
		st->last_busy_ns = now;
		if (!st->raised && transition(key, st, 1, now) && io_hold_ns)
			arm_timer(st, io_hold_ns);
		return;
	}
	if (!st->raised)
		return;
	if (!io_hold_ns) {
		transition(key, st, 0, now);
		return;
	}
	if (s)
		s->holds++;
	arm_timer(st, io_hold_ns);
}

static __always_inline struct bfq_data *hctx_bfqd(struct blk_mq_hw_ctx *hctx)
{
	return BPF_CORE_READ(hctx, queue, elevator, elevator_data);
}

static __always_inline struct bfq_data *rq_bfqd(struct request *rq)
{
	return BPF_CORE_READ(rq, q, elevator, elevator_data);
}

SEC("fexit/bfq_insert_requests")
int BPF_PROG(io_insert, struct blk_mq_hw_ctx *hctx)
{
	sample(hctx_bfqd(hctx));
	return 0;
}

SEC("fexit/bfq_dispatch_request")
int BPF_PROG(io_dispatch, struct blk_mq_hw_ctx *hctx)
{
	sample(hctx_bfqd(hctx));
	return 0;
}

SEC("fexit/bfq_finish_request")
int BPF_PROG(io_finish, struct request *rq)
{
	sample(rq_bfqd(rq));
	return 0;
}

SEC("fexit/bfq_finish_requeue_request")
int BPF_PROG(io_requeue, struct request *rq)
{
	sample(rq_bfqd(rq));
	return 0;
}

SEC("fexit/bfq_exit_icq")
int BPF_PROG(io_exit_icq, struct io_cq *icq)
{
	sample(BPF_CORE_READ(icq, q, elevator, elevator_data));
	return 0;
}

SEC("fexit/bfq_idle_slice_timer")
int BPF_PROG(io_idle_timer, struct hrtimer *timer)
{
	sample((struct bfq_data *)((void *)timer - bpf_core_field_offset(struct bfq_data, idle_slice_timer)));
	return 0;
}

SEC("fentry/bfq_exit_queue")
int BPF_PROG(io_exit, struct elevator_queue *e)
{
	u64 key = (u64)BPF_CORE_READ(e, elevator_data);
	struct cosched_io_state *st = bpf_map_lookup_elem(&io_states, &key);
	struct cosched_io_stats *s;

	if (!st)
		return 0;
	s = stats_get();
	if (s)
		s->exits++;
	st->wr_busy_queues = 0;
	transition(key, st, 0, bpf_ktime_get_ns());
	/* Deleting the element cancels its timer. */
	bpf_map_delete_elem(&io_states, &key);
	return 0;
}
