/* SPDX-License-Identifier: MIT */
/*
 * The event loop of the block-layer thread: one engine, a queue of woken
 * coroutines, and the count of requests in flight.
 */
#ifndef BI_AIO_H
#define BI_AIO_H

#include "io/engine.h"
#include "util/coroutine.h"
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
/* Whether a pass of bi_loop_run_once that did `did` things leaves the
 * loop with nothing it could ever do: no I/O pending, no coroutine
 * ready. Coroutines still waiting then wait for something outside the
 * loop. */
bool bi_loop_idle(int did);
/* What may end such a wait: the one party that parks coroutines outside
 * the loop (a blkdebug breakpoint) registers a hook that releases one and
 * returns true, or returns false when it holds none. Waits that must end
 * (draining, a synchronous call) call it before giving up. */
void bi_loop_set_stall_hook(bool (*hook)(void));

/* Requests in flight at the public API level (bi_aio_*). */
void bi_loop_request_started(void);
void bi_loop_request_done(void);
int bi_loop_requests(void);

/*
 * Sockets in the loop (network protocols: libnbd's connection). A watch
 * arms one-shot polls of one descriptor for reading and/or writing; when
 * one fires, cb runs in the loop (never inside a coroutine) with the
 * revents, and the owner arms again what it still wants. Waiting on the
 * loop thus covers file I/O, worker threads and sockets at once.
 */
struct bi_fd_watch {
    void (*cb)(struct bi_fd_watch *w, unsigned revents);
    /* private */
    struct bi_io in, out;
    bool armed_in, armed_out;
    bool stopping;
    int fd;
    bi_co *waiter; /* a coroutine in bi_fd_watch_stop */
};
/* Prepares w (no poll armed). */
void bi_fd_watch_init(struct bi_fd_watch *w,
                      void (*cb)(struct bi_fd_watch *w, unsigned revents));
/* Arms polls of fd for reading (in) and/or writing (out), each unless one
 * is armed already. When fd differs from the watched descriptor, the
 * armed polls are cancelled instead and cb runs with revents 0 once they
 * ended, so the owner arms again for the new descriptor. */
void bi_fd_watch_arm(struct bi_fd_watch *w, int fd, bool in, bool out);
/* Cancels the armed polls without waiting; cb is not called for them
 * (until the next arm). For a descriptor that died in a callback. */
void bi_fd_watch_cancel(struct bi_fd_watch *w);
/* Cancels the armed polls and waits until they ended (yielding in a
 * coroutine, running the loop outside one; never from cb). Afterwards
 * the descriptor may be closed and w freed. */
void bi_fd_watch_stop(struct bi_fd_watch *w);
/* Whether no poll of w is armed or being cancelled: after
 * bi_fd_watch_cancel, w may be freed once this is true (an owner that
 * cannot wait, as in a callback, frees it later). */
bool bi_fd_watch_idle(const struct bi_fd_watch *w);

#endif
