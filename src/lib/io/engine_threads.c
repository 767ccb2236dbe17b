/* SPDX-License-Identifier: MIT */
/*
 * Thread-pool engine: worker threads run preadv/pwritev/fdatasync/
 * fallocate/work; completions come back through the pool's queue and run
 * in the polling thread. Used where io_uring is unavailable or refused.
 */
#include "io/engine.h"
#include "io/pool.h"

#include <errno.h>
#include <stddef.h>

/* Enough workers to keep a deep queue busy on fast storage; they start
 * only as the load needs them. */
#define THREADS_MAX 64

static int threads_init(struct bi_engine *e, unsigned depth)
{
    (void)depth;
    struct bi_pool *p = bi_pool_new(THREADS_MAX, false);

    if (!p) {
        return -errno;
    }
    e->priv = p;
    e->in_flight = 0;
    return 0;
}

static void threads_cleanup(struct bi_engine *e)
{
    bi_pool_free(e->priv);
    e->priv = NULL;
}

static void threads_submit(struct bi_engine *e, struct bi_io *io)
{
    e->in_flight++;
    bi_pool_submit(e->priv, io);
}

static int threads_poll(struct bi_engine *e, unsigned min_complete)
{
    struct bi_pool *p = e->priv;
    int done = 0;

    for (;;) {
        struct bi_io *io = bi_pool_take(p);

        while (io) {
            struct bi_io *next = io->next;

            e->in_flight--;
            done++;
            io->cb(io);
            io = next;
        }
        if ((unsigned)done >= min_complete || e->in_flight == 0) {
            return done;
        }
        bi_pool_wait(p);
    }
}

const struct bi_engine_ops bi_engine_threads_ops = {
    .name = "threads",
    .init = threads_init,
    .cleanup = threads_cleanup,
    .submit = threads_submit,
    .poll = threads_poll,
};
