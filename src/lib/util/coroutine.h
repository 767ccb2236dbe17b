/* SPDX-License-Identifier: MIT */
/*
 * Coroutines: every block-layer request runs as straight-line code in a
 * coroutine; waiting for I/O yields to the event loop, which re-enters the
 * coroutine when the I/O completes. One thread runs all coroutines.
 */
#ifndef BI_COROUTINE_H
#define BI_COROUTINE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/queue.h>

typedef struct bi_co bi_co;
typedef void bi_co_fn(void *arg);

/* Creates a coroutine (stacks are pooled). It starts on bi_co_enter. */
bi_co *bi_co_create(bi_co_fn *fn, void *arg);
/* Switches into co until it yields or terminates. A terminated coroutine
 * is freed automatically. Must not be called for the running coroutine. */
void bi_co_enter(bi_co *co);
/* Returns to whoever entered the running coroutine. */
void bi_co_yield(void);
/* The running coroutine, or NULL in the main context. */
bi_co *bi_co_self(void);
static inline bool bi_in_co(void)
{
    return bi_co_self() != NULL;
}

/* Schedules co to be entered from the event loop (safe from anywhere in
 * the block-layer thread, including from another coroutine). Waking the
 * running coroutine does nothing: waits loop on their condition. */
void bi_co_wake(bi_co *co);
/* The event loop registers how a woken coroutine is queued for it (util
 * depends on nothing above it; src/lib/io/loop.c sets this at load). */
typedef void bi_co_wake_hook(bi_co *co);
void bi_co_set_wake_hook(bi_co_wake_hook *hook);

/* A FIFO of waiting coroutines. */
struct bi_co_waiter {
    bi_co *co;
    TAILQ_ENTRY(bi_co_waiter) link;
};
typedef TAILQ_HEAD(bi_co_queue, bi_co_waiter) bi_co_queue;
void bi_co_queue_init(bi_co_queue *q);
/* Yields until woken by bi_co_queue_wake_*. Coroutine only. */
void bi_co_queue_wait(bi_co_queue *q);
/* Wakes the first waiter; returns false if none. */
bool bi_co_queue_wake_next(bi_co_queue *q);
void bi_co_queue_wake_all(bi_co_queue *q);
bool bi_co_queue_empty(const bi_co_queue *q);

/* A coroutine mutex (for metadata caches and the like). */
typedef struct bi_co_mutex {
    bool locked;
    bi_co_queue waiters;
} bi_co_mutex;
void bi_co_mutex_init(bi_co_mutex *m);
void bi_co_mutex_lock(bi_co_mutex *m);
void bi_co_mutex_unlock(bi_co_mutex *m);

#endif
