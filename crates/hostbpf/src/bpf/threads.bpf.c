// SPDX-License-Identifier: GPL-2.0
/*
 * cosched host thread watch: the threads of watched processes (QEMU) as they are created, renamed
 * and exit, sent to the host daemon through the ring buffer `events`.
 *
 * The filter runs here: an event leaves the kernel only when the thread's process (tgid) is in
 * the map `watched`, which the daemon fills with the QEMU pids it adopted. Every other process on
 * the host costs one hash lookup per thread creation, rename and exit, and never wakes the daemon.
 *
 * Tracepoints:
 *   - task_newtask(task, clone_flags): fires in copy_process() once the new task has its pid and
 *     is in its thread group, before it first runs, so a thread's creation always comes before
 *     its rename. It fires for every new task, including the kernel-made threads that join a
 *     process (io_uring workers, vhost and KVM worker tasks), which sched_process_fork misses
 *     (they are made by copy_process() outside kernel_clone()).
 *   - task_rename(task, comm): prctl(PR_SET_NAME), a write to /proc/<pid>/task/<tid>/comm (only
 *     from the same process) and exec.
 *   - sched_process_exit(task[, group_dead]): do_exit() of each thread, in that thread. When the
 *     last thread of a watched process exits, the process is dropped from `watched` (a recycled
 *     pid is never watched by accident).
 *
 * Three sets of the same programs, one per attach mechanism; the crate loads one set: tp_btf if
 * the kernel allows it, else raw_tp, else the classic tracepoints (which need tracefs mounted).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

#define CLONE_THREAD 0x00010000

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);	/* tgid */
	__type(value, u32);	/* unused (1) */
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct thread_stats);
} stats SEC(".maps");

/* Puts struct thread_event in the object's BTF, so the skeleton generates it (types::thread_event). */
const struct thread_event *thread_event_type __attribute__((unused));

/* sched_process_exit's record since Linux 6.16 (the 6.1 vmlinux.h predates it). */
struct trace_event_raw_sched_process_exit___group_dead {
	bool group_dead;
} __attribute__((preserve_access_index));

static __always_inline struct thread_stats *stats_get(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&stats, &zero);
}

static __always_inline bool is_watched(s32 tgid)
{
	u32 key = tgid;

	return bpf_map_lookup_elem(&watched, &key) != NULL;
}

/* Reserves an event with an empty comm; counts it as sent, or as dropped when the ring is full. */
static __always_inline struct thread_event *reserve(enum thread_event_kind kind, s32 tgid, s32 tid)
{
	struct thread_stats *st = stats_get();
	struct thread_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		if (st)
			st->dropped++;
		return NULL;
	}
	if (st)
		st->sent++;
	e->kind = kind;
	e->tgid = tgid;
	e->tid = tid;
	__builtin_memset(e->comm, 0, sizeof(e->comm));
	return e;
}

static __always_inline void send(enum thread_event_kind kind, s32 tgid, s32 tid)
{
	struct thread_event *e = reserve(kind, tgid, tid);

	if (e)
		bpf_ringbuf_submit(e, 0);
}

/* A rename, the new name read from kernel memory (the tracepoint's argument). */
static __always_inline void send_renamed(s32 tgid, s32 tid, const char *comm)
{
	struct thread_event *e = reserve(THREAD_RENAMED, tgid, tid);

	if (!e)
		return;
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), comm);
	bpf_ringbuf_submit(e, 0);
}

/* The exit of a watched thread; the last one of its process ends the watch. */
static __always_inline void on_exit(s32 tgid, s32 tid, bool group_dead)
{
	u32 key = tgid;
	struct thread_stats *st;

	send(THREAD_EXITED, tgid, tid);
	if (group_dead && bpf_map_delete_elem(&watched, &key) == 0) {
		st = stats_get();
		if (st)
			st->forgotten++;
	}
}

/* ---- tp_btf: BTF-typed arguments, direct reads (no probe_read for task fields) ---- */

SEC("tp_btf/task_newtask")
int BPF_PROG(btf_newtask, struct task_struct *task, u64 clone_flags)
{
	s32 tgid = task->tgid;

	if (is_watched(tgid))
		send(THREAD_CREATED, tgid, task->pid);
	return 0;
}

SEC("tp_btf/task_rename")
int BPF_PROG(btf_rename, struct task_struct *task, const char *comm)
{
	s32 tgid = task->tgid;

	if (is_watched(tgid))
		send_renamed(tgid, task->pid, comm);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(btf_exit, struct task_struct *task)
{
	s32 tgid = task->tgid;

	if (is_watched(tgid))
		on_exit(tgid, task->pid, BPF_CORE_READ(task, signal, live.counter) == 0);
	return 0;
}

/* ---- raw_tp: untyped arguments, task fields read with CO-RE probe reads ---- */

SEC("raw_tp/task_newtask")
int BPF_PROG(raw_newtask, struct task_struct *task, u64 clone_flags)
{
	s32 tgid = BPF_CORE_READ(task, tgid);

	if (is_watched(tgid))
		send(THREAD_CREATED, tgid, BPF_CORE_READ(task, pid));
	return 0;
}

SEC("raw_tp/task_rename")
int BPF_PROG(raw_rename, struct task_struct *task, const char *comm)
{
	s32 tgid = BPF_CORE_READ(task, tgid);

	if (is_watched(tgid))
		send_renamed(tgid, BPF_CORE_READ(task, pid), comm);
	return 0;
}

SEC("raw_tp/sched_process_exit")
int BPF_PROG(raw_exit, struct task_struct *task)
{
	s32 tgid = BPF_CORE_READ(task, tgid);

	if (is_watched(tgid))
		on_exit(tgid, BPF_CORE_READ(task, pid), BPF_CORE_READ(task, signal, live.counter) == 0);
	return 0;
}

/*
 * ---- tracepoint: the classic records (no kernel pointers) ----
 * A record names the thread but not its process. A new thread (CLONE_THREAD) joins the process
 * of its creator (current). A renamed thread is current (prctl, exec) or in current's process
 * (/proc/<pid>/task/<tid>/comm writes are refused from other processes); the one exception, a
 * kernel thread named by the process that asked for it (Linux < 6.13 KVM workers), gives a
 * Renamed for a tid that is not in /proc/<tgid>/task.
 */

SEC("tp/task/task_newtask")
int tp_newtask(struct trace_event_raw_task_newtask *ctx)
{
	s32 tgid = bpf_get_current_pid_tgid() >> 32;

	if ((ctx->clone_flags & CLONE_THREAD) && is_watched(tgid))
		send(THREAD_CREATED, tgid, ctx->pid);
	return 0;
}

SEC("tp/task/task_rename")
int tp_rename(struct trace_event_raw_task_rename *ctx)
{
	s32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (!is_watched(tgid))
		return 0;
	send_renamed(tgid, ctx->pid, ctx->newcomm);
	return 0;
}

SEC("tp/sched/sched_process_exit")
int tp_exit(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct trace_event_raw_sched_process_exit___group_dead *rec = ctx;
	bool group_dead = false;

	if (!is_watched(id >> 32))
		return 0;
	if (bpf_core_field_exists(rec->group_dead))
		group_dead = rec->group_dead;
	on_exit(id >> 32, (u32)id, group_dead);
	return 0;
}
