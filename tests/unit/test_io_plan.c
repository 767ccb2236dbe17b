/* SPDX-License-Identifier: MIT */
/* The request path's pure decisions: padding to the request alignment and
 * when a caller's buffer must be bounced. */
#include "block/io_plan.h"
#include "tap.h"

static struct bi_limits limits(uint32_t req, uint32_t min_mem)
{
    struct bi_limits l = {0};
    l.request_alignment = req;
    l.min_mem_alignment = min_mem;
    l.opt_mem_alignment = 4096;
    return l;
}

int main(void)
{
    static char buf[65536] __attribute__((aligned(4096)));
    struct bi_rw_plan p;

    /* Buffered: nothing to pad, nothing to bounce. */
    struct bi_limits b = limits(1, 1);
    struct iovec odd = {buf + 3, 7};
    bi_plan_rw(&b, 5, 7, &odd, 1, &p);
    ok(!p.rmw && !p.bounce, "buffered: byte request goes straight through");

    /* 512-byte sectors, 512-byte memory alignment. */
    struct bi_limits l = limits(512, 512);
    struct iovec a = {buf, 4096};
    bi_plan_rw(&l, 4096, 4096, &a, 1, &p);
    ok(!p.rmw && !p.bounce && p.mem_aligned, "aligned request: no copy");
    is_uint(p.start, 4096, "aligned start");
    is_uint(p.end, 8192, "aligned end");

    struct iovec m512 = {buf + 512, 4096};
    bi_plan_rw(&l, 0, 4096, &m512, 1, &p);
    ok(!p.bounce, "512-aligned buffer meets a 512 minimum: no bounce");

    struct bi_limits l4k = limits(4096, 4096);
    bi_plan_rw(&l4k, 0, 4096, &m512, 1, &p);
    ok(p.bounce && !p.rmw, "512-aligned buffer below a 4096 minimum: bounce");

    struct iovec small = {buf, 512};
    bi_plan_rw(&l, 100, 512, &small, 1, &p);
    ok(p.rmw && p.bounce, "unaligned offset: read-modify-write");
    is_uint(p.start, 0, "padded start");
    is_uint(p.end, 1024, "padded end spans two sectors");

    bi_plan_rw(&l4k, 4096 + 512, 512, &small, 1, &p);
    is_uint(p.start, 4096, "4K: padded start");
    is_uint(p.end, 8192, "4K: padded end");
    ok(p.rmw, "512 write on 4K storage needs RMW");

    bi_plan_rw(&l, 512, 512, &small, 1, &p);
    ok(!p.rmw && !p.bounce, "512 write on 512 storage needs no RMW");

    /* Segment lengths must be multiples of the request alignment. */
    struct iovec two[2] = {{buf, 256}, {buf + 4096, 256}};
    bi_plan_rw(&l, 0, 512, two, 2, &p);
    ok(!p.mem_aligned && p.bounce, "segments of 256 bytes: bounce");
    struct iovec two_ok[2] = {{buf, 512}, {buf + 8192, 1024}};
    bi_plan_rw(&l, 0, 1536, two_ok, 2, &p);
    ok(p.mem_aligned && !p.bounce, "aligned segments: no bounce");

    /* Max transfer chunking. */
    struct bi_limits mt = limits(4096, 512);
    mt.max_transfer = 1000000;
    is_uint(bi_max_chunk(&mt), 999424, "max transfer rounded to alignment");
    mt.max_transfer = 0;
    is_uint(bi_max_chunk(&mt), 1u << 30, "no max transfer: 1 GiB chunks");
    mt.max_transfer = 100;
    is_uint(bi_max_chunk(&mt), 4096, "tiny max transfer: one block");
    return tap_done();
}
