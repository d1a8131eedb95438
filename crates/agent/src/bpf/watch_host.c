// SPDX-License-Identifier: GPL-2.0
/*
 * watch.h compiled for the host, for the agent's unit tests (src/watch_model.rs): the BPF
 * program's own arithmetic, callable with a fake clock. Not part of the agent's binary.
 */
#include "watch.h"

struct watched cosched_watch_new(unsigned long long budget_ns, unsigned int count)
{
	return watch_new(budget_ns, count);
}

int cosched_watch_is_on(unsigned long long budget_ns, unsigned int count)
{
	return watch_is_on(budget_ns, count);
}

unsigned int cosched_watch_in(struct watched *w, unsigned long long budget_ns, int back_from_agent,
			      unsigned long long now)
{
	return watch_in(w, budget_ns, back_from_agent, now);
}

unsigned int cosched_watch_out(struct watched *w, unsigned long long now, int runnable, unsigned int cpu)
{
	return watch_out(w, now, runnable, cpu);
}

void cosched_watch_wake(struct watched *w, unsigned long long budget_ns, unsigned long long refill_ns,
			unsigned int count)
{
	watch_wake(w, budget_ns, refill_ns, count);
}

/* The step flags, for the tests to read rather than copy. */
const unsigned int cosched_watch_boost = WATCH_BOOST;
const unsigned int cosched_watch_drop = WATCH_DROP;
const unsigned int cosched_watch_free = WATCH_FREE;
const unsigned int cosched_watch_spent = WATCH_SPENT;
const unsigned int cosched_watch_wait = WATCH_WAIT;
const unsigned int cosched_watch_waited = WATCH_WAITED;
