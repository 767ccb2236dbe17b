/* SPDX-License-Identifier: MIT */
/*
 * Thread-pool engine: worker threads run preadv/pwritev/fdatasync/
 * fallocate/work; completions come back through the pool's queue and run
 * in the polling thread. Used where io_uring is unavailable or refused.
 *
 * Poll requests (BI_IO_POLL) never go to a worker: the engine keeps them
 * and waits for their descriptors together with the pool's eventfd in one
 * poll(2), so a socket and the workers wake the same wait.
 */
#include "io/engine.h"
#include "io/pool.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

/* Enough workers to keep a deep queue busy on fast storage; they start
 * only as the load needs them. */
#define THREADS_MAX 64
/* Descriptors one wait can watch besides the pool's eventfd. */
#define POLL_MAX 64

struct threads {
    struct bi_pool *pool;
    struct bi_io *polls;    /* armed poll requests, linked by ->next */
    struct bi_io *finished; /* cancelled polls, completed at next poll */
};

static int threads_init(struct bi_engine *e, unsigned depth)
{
    (void)depth;
    struct threads *t = calloc(1, sizeof(*t));

    if (!t) {
        return -ENOMEM;
    }
    t->pool = bi_pool_new(THREADS_MAX, false);
    if (!t->pool) {
        int r = -errno;
        free(t);
        return r;
    }
    e->priv = t;
    e->in_flight = 0;
    return 0;
}

static void threads_cleanup(struct bi_engine *e)
{
    struct threads *t = e->priv;

    bi_pool_free(t->pool);
    free(t);
    e->priv = NULL;
}

static void threads_submit(struct bi_engine *e, struct bi_io *io)
{
    struct threads *t = e->priv;

    e->in_flight++;
    if (io->op == BI_IO_POLL) {
        io->next = t->polls;
        t->polls = io;
        return;
    }
    bi_pool_submit(t->pool, io);
}

static void threads_cancel(struct bi_engine *e, struct bi_io *io)
{
    struct threads *t = e->priv;

    for (struct bi_io **p = &t->polls; *p; p = &(*p)->next) {
        if (*p == io) {
            *p = io->next;
            io->ret = -ECANCELED;
            io->next = t->finished;
            t->finished = io;
            return;
        }
    }
}

/* One poll(2) over the armed poll requests (and, when waiting, the pool's
 * eventfd): completes those whose descriptor is ready. timeout_ms as for
 * poll(2). Returns the callbacks run. */
static int check_polls(struct bi_engine *e, int timeout_ms)
{
    struct threads *t = e->priv;
    struct pollfd fds[POLL_MAX + 1];
    struct bi_io *ios[POLL_MAX];
    struct bi_io *ready = NULL, **tail = &ready;
    nfds_t n = 0;
    int r;

    for (struct bi_io *io = t->polls; io && n < POLL_MAX; io = io->next) {
        fds[n] = (struct pollfd){.fd = io->fd, .events = (short)io->mode};
        ios[n++] = io;
    }
    fds[n] = (struct pollfd){.fd = bi_pool_fd(t->pool), .events = POLLIN};
    r = poll(fds, n + (timeout_ms != 0), timeout_ms);
    if (r <= 0) {
        return 0;
    }
    if (timeout_ms != 0 && (fds[n].revents & POLLIN)) {
        bi_pool_wait(t->pool); /* readable: does not block */
    }
    for (nfds_t i = 0; i < n; i++) {
        if (!fds[i].revents) {
            continue;
        }
        for (struct bi_io **p = &t->polls; *p; p = &(*p)->next) {
            if (*p == ios[i]) {
                *p = ios[i]->next;
                break;
            }
        }
        ios[i]->ret = fds[i].revents;
        ios[i]->next = NULL;
        *tail = ios[i];
        tail = &ios[i]->next;
    }
    return bi_engine_complete_list(e, ready);
}

static int threads_poll(struct bi_engine *e, unsigned min_complete)
{
    struct threads *t = e->priv;
    int done = 0;

    for (;;) {
        struct bi_io *fin = t->finished;

        t->finished = NULL;
        done += bi_engine_complete_list(e, fin);
        done += bi_engine_complete_list(e, bi_pool_take(t->pool));
        if (t->polls) {
            done += check_polls(e, 0);
        }
        if ((unsigned)done >= min_complete || e->in_flight == 0) {
            return done;
        }
        if (t->polls) {
            done += check_polls(e, -1);
        } else {
            bi_pool_wait(t->pool);
        }
    }
}

const struct bi_engine_ops bi_engine_threads_ops = {
    .name = "threads",
    .init = threads_init,
    .cleanup = threads_cleanup,
    .submit = threads_submit,
    .poll = threads_poll,
    .cancel = threads_cancel,
};
