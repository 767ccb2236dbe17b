/* SPDX-License-Identifier: MIT */
/*
 * Pure decisions of the request path, kept apart so that unit tests can
 * check them: how a request is padded to the request alignment and whether
 * the caller's memory can go to the kernel as it is.
 */
#ifndef BI_IO_PLAN_H
#define BI_IO_PLAN_H

#include "blkimg/blkimg.h"
#include "util/util.h"

struct bi_rw_plan {
    uint64_t start, end; /* the request padded to the request alignment */
    bool rmw;            /* head or tail is partial: read-modify-write */
    bool mem_aligned;    /* every iov meets min_mem_alignment and every
                            length is a multiple of the request alignment */
    bool bounce;         /* must go through an aligned bounce buffer */
};

static inline void bi_plan_rw(const struct bi_limits *l, uint64_t off,
                              uint64_t len, const struct iovec *iov, int iovcnt,
                              struct bi_rw_plan *p)
{
    uint64_t align = l->request_alignment ? l->request_alignment : 1;
    uint64_t mem = l->min_mem_alignment ? l->min_mem_alignment : 1;
    p->start = bi_align_down(off, align);
    p->end = bi_align_up(off + len, align);
    p->rmw = p->start != off || p->end != off + len;
    p->mem_aligned = bi_iov_aligned(iov, iovcnt, mem, align);
    p->bounce = p->rmw || !p->mem_aligned;
}

/* The largest chunk one I/O may carry: the max transfer rounded down to
 * the request alignment (no limit: 1 GiB). */
static inline uint64_t bi_max_chunk(const struct bi_limits *l)
{
    uint64_t align = l->request_alignment ? l->request_alignment : 1;
    uint64_t max = l->max_transfer ? l->max_transfer : (1ULL << 30);
    max = bi_align_down(max, align);
    return max ? max : align;
}

#endif
