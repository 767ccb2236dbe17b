/* SPDX-License-Identifier: MIT */
/*
 * I/O engines: a small table of operations behind which io_uring and a
 * thread pool look the same. The block layer submits bi_io requests; the
 * engine reports completions through bi_io.cb, always from bi_engine_poll()
 * in the block-layer thread.
 */
#ifndef BI_ENGINE_H
#define BI_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum bi_io_op {
    BI_IO_READ,      /* preadv(fd, iov, iovcnt, offset) */
    BI_IO_WRITE,     /* pwritev(fd, iov, iovcnt, offset) */
    BI_IO_FSYNC,     /* fdatasync(fd) */
    BI_IO_FALLOCATE, /* fallocate(fd, mode, offset, len) */
    BI_IO_WORK,      /* work_fn(work_arg) on a worker thread */
    BI_IO_POLL,      /* one-shot poll(fd, mode): ret = revents; ends only
                        when fd is ready or the request is cancelled */
};

struct bi_io;
typedef void bi_io_cb(struct bi_io *io);

struct bi_io {
    enum bi_io_op op;
    int fd;
    const struct iovec *iov;
    int iovcnt;
    uint64_t offset;
    uint64_t len;              /* FALLOCATE */
    int mode;                  /* FALLOCATE mode; POLL events */
    bool cached;               /* READ/WRITE: fd goes through the page cache */
    int (*work_fn)(void *arg); /* WORK; returns 0 or -errno */
    void *work_arg;
    /* Result: bytes transferred (READ/WRITE) or 0, or -errno. Short
     * transfers are returned as such; the caller resubmits the rest. */
    int64_t ret;
    bi_io_cb *cb;
    void *opaque;
    /* engine-private */
    struct bi_io *next;
};

struct bi_engine;
struct bi_engine_ops {
    const char *name;
    /* Returns 0 or -errno (e.g. -ENOSYS when the kernel refuses io_uring). */
    int (*init)(struct bi_engine *e, unsigned depth);
    void (*cleanup)(struct bi_engine *e);
    /* Queues io. May batch: the engine must make queued I/O progress by the
     * next poll at the latest. */
    void (*submit)(struct bi_engine *e, struct bi_io *io);
    /* Submits what is queued and runs completion callbacks. With
     * min_complete > 0 waits until at least that many completed (or none
     * is in flight). Returns the number of callbacks run, or -errno. */
    int (*poll)(struct bi_engine *e, unsigned min_complete);
    /* Optional. Registers [base, base + len) as a buffer many requests
     * will use: its pages are pinned once instead of per request. 0 or
     * -errno (then nothing changes). Unregister before the memory goes. */
    int (*buf_register)(struct bi_engine *e, void *base, size_t len);
    void (*buf_unregister)(struct bi_engine *e, void *base);
    /* Ends a BI_IO_POLL request early: it completes through its callback
     * at a later poll, with -ECANCELED (or its result, if it was already
     * done). Any other request is left alone. */
    void (*cancel)(struct bi_engine *e, struct bi_io *io);
};

struct bi_engine {
    const struct bi_engine_ops *ops;
    void *priv;
    unsigned in_flight; /* maintained by the engine */
};

/* Runs the callbacks of a list of finished requests (linked by ->next),
 * counting them out of e->in_flight; returns how many. For engines. */
static inline int bi_engine_complete_list(struct bi_engine *e, struct bi_io *io)
{
    int n = 0;

    while (io) {
        struct bi_io *next = io->next;

        e->in_flight--;
        n++;
        io->cb(io);
        io = next;
    }
    return n;
}

extern const struct bi_engine_ops bi_engine_uring_ops;
extern const struct bi_engine_ops bi_engine_threads_ops;

#endif
