/* SPDX-License-Identifier: MIT */
/*
 * io_uring engine (liburing). Requests are queued as SQEs by submit and
 * handed to the kernel in batches by poll, which also reaps every available
 * CQE per pass. BI_IO_WORK runs on a small worker pool whose completions
 * wake the ring through an eventfd watched by a poll request on the ring,
 * so waiting on the ring covers both kinds of completion.
 */
#include "io/engine.h"
#include "io/pool.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* user_data of the eventfd poll request; no bi_io lives at address 1. */
#define TAG_POOL ((uint64_t)1)
/* user_data of poll-remove requests, whose completions are dropped (the
 * removed poll completes on its own with -ECANCELED). */
#define TAG_IGNORE ((uint64_t)2)
/* Workers for BI_IO_WORK (CPU work such as compression) and fallbacks. */
#define POOL_THREADS 16
/* CQEs copied out per batch while reaping. */
#define REAP_BATCH 64
/* Cancels waiting for a free SQE at once (one per fd watch direction). */
#define CANCEL_MAX 64
/* Slots for registered buffers (a sparse table, registered on first use). */
#define FIXED_SLOTS 64
/* Reads through the page cache from this size on go to the pool, as with
 * QEMU's aio=threads: a blocking read asks the kernel for its whole range
 * at once (readahead grows to the request), and the copies run on every
 * core. From the ring, a read that misses the cache starts only the
 * device's readahead window and its copy runs in this thread. Measured on
 * convert qcow2 -> qcow2, 2 GiB, default cache, 7 interleaved runs: ring
 * 1.04 s median (0.54 to 1.54), pool 0.57 s (0.50 to 0.76), qemu-img 0.66
 * to 0.73 s. Writes stay on the ring: io-wq runs those of one file in one
 * worker, where pool threads would queue on the inode lock. Smaller cached
 * reads stay on the ring too: from a warm cache they complete inline. */
#define POOL_CACHED_MIN (256u << 10)

struct fixed_buf {
    char *base; /* NULL: free slot */
    size_t len;
};

struct uring {
    struct io_uring ring;
    struct bi_pool *pool; /* created on first use */
    bool pool_armed;      /* the eventfd poll request is live */
    bool multishot_ok;    /* multishot poll works on this kernel */
    bool fallocate_ok;    /* the kernel knows IORING_OP_FALLOCATE */
    /* Requests that found the submission queue full even after a submit
     * (the kernel refused to take more for now): retried by poll. */
    struct bi_io *backlog_head, *backlog_tail;
    /* Requests run inline because no worker pool could be created; their
     * callbacks run at the next poll. */
    struct bi_io *inline_head, *inline_tail;
    /* Poll requests to cancel that found no free SQE: retried by poll
     * (up to CANCEL_MAX; a cancel is never lost, so no watch waits on a
     * socket that never becomes ready). */
    struct bi_io *cancel_later[CANCEL_MAX];
    unsigned n_cancel_later;
    /* Registered buffers: reads and writes inside one use the _fixed
     * opcodes (no page pinning per request). */
    int fixed_state; /* 0: not tried, 1: table registered, -1: unavailable */
    unsigned fixed_used;
    struct fixed_buf fixed[FIXED_SLOTS];
};

static void list_push(struct bi_io **head, struct bi_io **tail,
                      struct bi_io *io)
{
    io->next = NULL;
    if (*tail) {
        (*tail)->next = io;
    } else {
        *head = io;
    }
    *tail = io;
}

static int uring_init(struct bi_engine *e, unsigned depth)
{
    struct uring *u = calloc(1, sizeof(*u));
    struct io_uring_probe *probe;
    int r;

    if (!u) {
        return -ENOMEM;
    }
    if (depth == 0) {
        depth = 128;
    }
    /* Cooperative task running avoids interrupting the submitter to post
     * completions; with the task-run flag the kernel tells (in the SQ
     * flags) when completions wait to be posted, and liburing's peek then
     * enters the kernel, so non-blocking polls still see every completion.
     * CLAMP caps an over-large depth instead of failing. Older kernels
     * reject newer flags with -EINVAL: retry with fewer. */
    static const unsigned flag_sets[] = {
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG |
            IORING_SETUP_CLAMP,
        IORING_SETUP_CLAMP,
        0,
    };
    r = -EINVAL;
    for (size_t i = 0; i < sizeof(flag_sets) / sizeof(flag_sets[0]); i++) {
        r = io_uring_queue_init(depth, &u->ring, flag_sets[i]);
        if (r != -EINVAL) {
            break;
        }
    }
    if (r < 0) {
        free(u);
        return r;
    }
    probe = io_uring_get_probe_ring(&u->ring);
    if (probe) {
        u->fallocate_ok = io_uring_opcode_supported(probe, IORING_OP_FALLOCATE);
        io_uring_free_probe(probe);
    }
    u->multishot_ok = true;
    e->priv = u;
    e->in_flight = 0;
    return 0;
}

static void uring_cleanup(struct bi_engine *e)
{
    struct uring *u = e->priv;

    if (!u) {
        return;
    }
    /* Closing the ring cancels the eventfd poll; the pool then drains. */
    io_uring_queue_exit(&u->ring);
    bi_pool_free(u->pool);
    free(u);
    e->priv = NULL;
}

/* A free SQE, submitting what is queued to make room if the SQ is full. */
static struct io_uring_sqe *get_sqe(struct uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

    if (!sqe) {
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    return sqe;
}

/* Queues the removal of poll request io; false when no SQE is free. */
static bool queue_poll_remove(struct uring *u, struct bi_io *io)
{
    struct io_uring_sqe *sqe = get_sqe(u);

    if (!sqe) {
        return false;
    }
    io_uring_prep_poll_remove(sqe, (__u64)(uintptr_t)io);
    io_uring_sqe_set_data64(sqe, TAG_IGNORE);
    io_uring_submit(&u->ring);
    return true;
}

static int uring_buf_register(struct bi_engine *e, void *base, size_t len)
{
    struct uring *u = e->priv;
    struct iovec iov = {base, len};
    __u64 tag = 0;
    unsigned i;
    int r;

    if (u->fixed_state == 0) {
        r = io_uring_register_buffers_sparse(&u->ring, FIXED_SLOTS);
        u->fixed_state = r == 0 ? 1 : -1;
    }
    if (u->fixed_state < 0) {
        return -ENOTSUP;
    }
    for (i = 0; i < FIXED_SLOTS && u->fixed[i].base; i++) {
    }
    if (i == FIXED_SLOTS) {
        return -ENOSPC;
    }
    /* Fails (ENOMEM) past RLIMIT_MEMLOCK for unprivileged users. */
    r = io_uring_register_buffers_update_tag(&u->ring, i, &iov, &tag, 1);
    if (r < 0) {
        return r;
    }
    u->fixed[i].base = base;
    u->fixed[i].len = len;
    u->fixed_used++;
    return 0;
}

static void uring_buf_unregister(struct bi_engine *e, void *base)
{
    struct uring *u = e->priv;
    struct iovec iov = {NULL, 0};
    __u64 tag = 0;

    for (unsigned i = 0; i < FIXED_SLOTS; i++) {
        if (u->fixed[i].base == base) {
            /* The kernel keeps the pages until requests using them end. */
            io_uring_register_buffers_update_tag(&u->ring, i, &iov, &tag, 1);
            u->fixed[i].base = NULL;
            u->fixed_used--;
            return;
        }
    }
}

/* The registered buffer holding v entirely, or -1. */
static int fixed_index(const struct uring *u, const struct iovec *v)
{
    const char *p = v->iov_base;

    for (int i = 0; u->fixed_used && i < FIXED_SLOTS; i++) {
        const struct fixed_buf *f = &u->fixed[i];
        if (f->base && p >= f->base && v->iov_len <= f->len &&
            (size_t)(p - f->base) <= f->len - v->iov_len) {
            return i;
        }
    }
    return -1;
}

static void arm_pool_poll(struct uring *u)
{
    struct io_uring_sqe *sqe = get_sqe(u);

    if (!sqe) {
        return; /* poll retries: pool_armed stays false */
    }
    if (u->multishot_ok) {
        io_uring_prep_poll_multishot(sqe, bi_pool_fd(u->pool), POLLIN);
    } else {
        io_uring_prep_poll_add(sqe, bi_pool_fd(u->pool), POLLIN);
    }
    io_uring_sqe_set_data64(sqe, TAG_POOL);
    u->pool_armed = true;
}

static void to_pool(struct uring *u, struct bi_io *io)
{
    if (!u->pool) {
        u->pool = bi_pool_new(POOL_THREADS, true);
        if (!u->pool) {
            /* No pool at all: do it here, report it at the next poll. */
            bi_io_exec(io);
            list_push(&u->inline_head, &u->inline_tail, io);
            return;
        }
    }
    if (!u->pool_armed) {
        arm_pool_poll(u);
    }
    bi_pool_submit(u->pool, io);
}

/* A read or a write: one buffer by address (a registered one by its slot),
 * several by iovec array. */
static void prep_rw(const struct uring *u, struct io_uring_sqe *sqe,
                    const struct bi_io *io)
{
    bool w = io->op == BI_IO_WRITE;
    const struct iovec *v = &io->iov[0];
    int fi;

    if (io->iovcnt != 1 || v->iov_len > UINT32_MAX) {
        io_uring_prep_rw(w ? IORING_OP_WRITEV : IORING_OP_READV, sqe, io->fd,
                         io->iov, (unsigned)io->iovcnt, io->offset);
    } else if ((fi = fixed_index(u, v)) >= 0) {
        io_uring_prep_rw(w ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED, sqe,
                         io->fd, v->iov_base, (unsigned)v->iov_len, io->offset);
        sqe->buf_index = (__u16)fi;
    } else {
        io_uring_prep_rw(w ? IORING_OP_WRITE : IORING_OP_READ, sqe, io->fd,
                         v->iov_base, (unsigned)v->iov_len, io->offset);
    }
}

static bool prep(struct uring *u, struct bi_io *io)
{
    struct io_uring_sqe *sqe = get_sqe(u);

    if (!sqe) {
        return false;
    }
    switch (io->op) {
    case BI_IO_READ:
    case BI_IO_WRITE:
        prep_rw(u, sqe, io);
        break;
    case BI_IO_FSYNC:
        io_uring_prep_fsync(sqe, io->fd, IORING_FSYNC_DATASYNC);
        break;
    case BI_IO_FALLOCATE:
        io_uring_prep_fallocate(sqe, io->fd, io->mode, (off_t)io->offset,
                                (off_t)io->len);
        break;
    case BI_IO_POLL:
        io_uring_prep_poll_add(sqe, io->fd, (unsigned)io->mode);
        break;
    default:
        io_uring_prep_nop(sqe); /* not reached: filtered by submit */
        break;
    }
    io_uring_sqe_set_data(sqe, io);
    return true;
}

static bool to_pool_cached(const struct bi_io *io)
{
    if (!io->cached || io->op != BI_IO_READ) {
        return false;
    }
    size_t len = 0;
    for (int i = 0; i < io->iovcnt && len < POOL_CACHED_MIN; i++) {
        len += io->iov[i].iov_len;
    }
    return len >= POOL_CACHED_MIN;
}

static void uring_submit(struct bi_engine *e, struct bi_io *io)
{
    struct uring *u = e->priv;

    e->in_flight++;
    if (io->op == BI_IO_WORK || to_pool_cached(io) ||
        (io->op == BI_IO_FALLOCATE && !u->fallocate_ok)) {
        to_pool(u, io);
        return;
    }
    if (u->backlog_head || !prep(u, io)) {
        /* Keep order behind earlier refused ones. */
        list_push(&u->backlog_head, &u->backlog_tail, io);
    }
}

static void complete(struct bi_engine *e, struct bi_io *io, int64_t ret)
{
    io->ret = ret;
    e->in_flight--;
    io->cb(io);
}

/* Runs the callbacks of finished pool requests; returns how many. */
static int reap_pool(struct bi_engine *e, struct uring *u)
{
    if (!u->pool) {
        return 0;
    }
    return bi_engine_complete_list(e, bi_pool_take(u->pool));
}

/* Queues refused requests again as SQ space allows. */
static void flush_backlog(struct uring *u)
{
    while (u->backlog_head && prep(u, u->backlog_head)) {
        u->backlog_head = u->backlog_head->next;
    }
    if (!u->backlog_head) {
        u->backlog_tail = NULL;
    }
}

/* Runs the callbacks of requests done inline; returns how many. */
static int reap_inline(struct bi_engine *e, struct uring *u)
{
    struct bi_io *io = u->inline_head;

    u->inline_head = u->inline_tail = NULL;
    return bi_engine_complete_list(e, io);
}

static int reap_ring(struct bi_engine *e, struct uring *u)
{
    struct io_uring_cqe *cqes[REAP_BATCH];
    int n = 0;

    for (;;) {
        struct {
            uint64_t data;
            int32_t res;
            uint32_t flags;
        } got[REAP_BATCH];
        unsigned cnt = io_uring_peek_batch_cqe(&u->ring, cqes, REAP_BATCH);

        if (cnt == 0) {
            return n;
        }
        /* Copy out and release the CQ slots before running callbacks, so
         * that callbacks may submit or even poll again. */
        for (unsigned i = 0; i < cnt; i++) {
            got[i].data = cqes[i]->user_data;
            got[i].res = cqes[i]->res;
            got[i].flags = cqes[i]->flags;
        }
        io_uring_cq_advance(&u->ring, cnt);
        for (unsigned i = 0; i < cnt; i++) {
            if (got[i].data == TAG_IGNORE) {
                continue;
            }
            if (got[i].data == TAG_POOL) {
                uint64_t v;

                if (got[i].res == -EINVAL && u->multishot_ok) {
                    u->multishot_ok = false; /* fall back to one-shot */
                }
                if (got[i].res > 0) {
                    /* Reset the counter; the queue is drained below. */
                    (void)!read(bi_pool_fd(u->pool), &v, sizeof(v));
                }
                if (!(got[i].flags & IORING_CQE_F_MORE)) {
                    /* The poll request ended: watch the eventfd again
                     * before anyone waits on the ring. */
                    u->pool_armed = false;
                    arm_pool_poll(u);
                }
                n += reap_pool(e, u);
                continue;
            }
            struct bi_io *io = (struct bi_io *)(uintptr_t)got[i].data;

            if (io->op == BI_IO_FALLOCATE &&
                (got[i].res == -EINVAL || got[i].res == -EOPNOTSUPP)) {
                /* Some kernels take the opcode but not every mode through
                 * the ring: do it as a plain system call instead. */
                to_pool(u, io);
                continue;
            }
            complete(e, io, got[i].res);
            n++;
        }
        if (cnt < REAP_BATCH) {
            return n;
        }
    }
}

static int uring_poll(struct bi_engine *e, unsigned min_complete)
{
    struct uring *u = e->priv;
    int done = 0;

    for (;;) {
        int r;

        if (u->backlog_head) {
            flush_backlog(u);
        }
        while (u->n_cancel_later &&
               queue_poll_remove(u, u->cancel_later[u->n_cancel_later - 1])) {
            u->n_cancel_later--;
        }
        if (u->inline_head) {
            done += reap_inline(e, u);
        }
        if (u->pool && !u->pool_armed) {
            arm_pool_poll(u);
        }
        done += reap_ring(e, u);
        if (u->pool && bi_pool_has_done(u->pool)) {
            done += reap_pool(e, u);
        }
        if ((unsigned)done >= min_complete || e->in_flight == 0) {
            if (io_uring_sq_ready(&u->ring) > 0) {
                r = io_uring_submit(&u->ring);
                if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
                    return r;
                }
            }
            return done;
        }
        if (u->pool && !u->pool_armed) {
            arm_pool_poll(u); /* never wait blind to pool completions */
        }
        if (u->pool && !u->pool_armed) {
            /* No room to watch the pool: wait with a short timeout. */
            struct __kernel_timespec ts = {.tv_nsec = 1000000};
            struct io_uring_cqe *cqe;

            r = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, &ts, NULL);
        } else {
            /* Submit what is queued and wait for a completion: one
             * system call. */
            r = io_uring_submit_and_wait(&u->ring, 1);
        }
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY &&
            r != -ETIME) {
            return r;
        }
    }
}

/* Asks the kernel to end a poll request; the request then completes with
 * -ECANCELED (or with its revents if it fired first). A request still in
 * the backlog never reached the kernel: it completes at once. */
static void uring_cancel(struct bi_engine *e, struct bi_io *io)
{
    struct uring *u = e->priv;

    if (io->op != BI_IO_POLL) {
        return;
    }
    for (struct bi_io **p = &u->backlog_head; *p; p = &(*p)->next) {
        if (*p == io) {
            *p = io->next;
            if (u->backlog_tail == io) {
                u->backlog_tail = NULL;
                for (struct bi_io *t = u->backlog_head; t; t = t->next) {
                    u->backlog_tail = t;
                }
            }
            io->ret = -ECANCELED;
            list_push(&u->inline_head, &u->inline_tail, io);
            return;
        }
    }
    if (!queue_poll_remove(u, io) && u->n_cancel_later < CANCEL_MAX) {
        u->cancel_later[u->n_cancel_later++] = io; /* retried by poll */
    }
}

const struct bi_engine_ops bi_engine_uring_ops = {
    .name = "io_uring",
    .init = uring_init,
    .cleanup = uring_cleanup,
    .submit = uring_submit,
    .poll = uring_poll,
    .buf_register = uring_buf_register,
    .buf_unregister = uring_buf_unregister,
    .cancel = uring_cancel,
};
