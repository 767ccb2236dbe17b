/* SPDX-License-Identifier: MIT */
/*
 * The event loop of the block-layer thread: one engine, a queue of woken
 * coroutines, and the count of requests in flight.
 */
#ifndef BI_AIO_H
#define BI_AIO_H

#include "io/engine.h"
#include <stdbool.h>

/* The process engine (created on first use with the selected kind). */
struct bi_engine *bi_engine_get(void);

/* Submits io and waits for it: inside a coroutine the coroutine yields until
 * completion; outside one the loop is polled until it completes. io->cb and
 * io->opaque are overwritten. Returns io->ret. */
int64_t bi_io_run(struct bi_io *io);

/* Registers a buffer that will carry many requests (the io_uring engine
 * then pins its pages once, not for every request). Best effort: false
 * when it is not registered, which changes nothing but speed. A registered
 * buffer must be unregistered before it is freed. */
bool bi_io_buf_register(void *base, size_t len);
void bi_io_buf_unregister(void *base);

/* Runs fn(args[i]) for each i < n on worker threads at once and waits for
 * all of them (the caller's coroutine yields; outside one the loop runs).
 * Returns the first nonzero result in index order, or 0. */
int bi_run_in_threads(int (*fn)(void *), void *const *args, int n);
/* One loop iteration: enters woken coroutines, polls the engine (waiting
 * for an event if blocking and something is in flight). Returns the number
 * of things done. */
int bi_loop_run_once(bool blocking);

/* Requests in flight at the public API level (bi_aio_*). */
void bi_loop_request_started(void);
void bi_loop_request_done(void);
int bi_loop_requests(void);

/* Queue of coroutines woken with bi_co_wake (used by coroutine.c). */
void bi_loop_schedule_co(void *co);

#endif
