/* SPDX-License-Identifier: MIT */
/*
 * A pool of worker threads that execute bi_io requests with plain system
 * calls. Both engines use it: the thread-pool engine for everything, the
 * io_uring engine for BI_IO_WORK (and operations the ring cannot do).
 * Workers never run callbacks: completed requests are queued and an eventfd
 * is signalled; the block-layer thread takes them with bi_pool_take().
 */
#ifndef BI_POOL_H
#define BI_POOL_H

#include "io/engine.h"

#include <stdbool.h>

struct bi_pool;

/* Runs io synchronously in the calling thread and sets io->ret. */
void bi_io_exec(struct bi_io *io);

/* Creates a pool that starts up to max_threads workers as load demands.
 * The eventfd is non-blocking if nonblock. Returns NULL with errno set. */
struct bi_pool *bi_pool_new(unsigned max_threads, bool nonblock);
/* Joins the workers (after they finish what is queued) and frees. */
void bi_pool_free(struct bi_pool *p);
/* Readable (counter > 0) once a completion was queued since last read. */
int bi_pool_fd(const struct bi_pool *p);
void bi_pool_submit(struct bi_pool *p, struct bi_io *io);
/* Takes every completed request, oldest first, linked through ->next. */
struct bi_io *bi_pool_take(struct bi_pool *p);
/* Cheap check whether bi_pool_take() would return something. */
bool bi_pool_has_done(struct bi_pool *p);
/* Blocks until some completion was signalled (may return spuriously). */
void bi_pool_wait(struct bi_pool *p);

#endif
