/* SPDX-License-Identifier: MIT */
/*
 * The decisions of the qcow2 allocating write that take no I/O
 * (src/lib/format/qcow2/qcow2_map.c, split from map_write_locked): which
 * clusters are written in place, which hold data a copy must keep, which
 * need only a subcluster bitmap update, which preallocated zero clusters
 * are reused, and the copy-on-write bounds of a write. Each is checked on
 * a made-up image state: 4 KiB clusters, then 64 KiB with extended L2.
 */
#include "format/qcow2/qcow2.h"
#include "tap.h"

#include <string.h>

static qcow2_state st;

static void plain(void)
{
    memset(&st, 0, sizeof(st));
    st.cluster_bits = 12;
    st.cluster_size = 4096;
    st.subcluster_bits = 12;
    st.subcluster_size = 4096;
    st.sc_per_cluster = 1;
}

static void extl2(void)
{
    memset(&st, 0, sizeof(st));
    st.cluster_bits = 16;
    st.cluster_size = 65536;
    st.subcluster_bits = 11;
    st.subcluster_size = 2048;
    st.sc_per_cluster = 32;
    st.ext_l2 = true;
}

#define HOST 0x50000ULL

static void predicates(void)
{
    plain();
    uint64_t own = HOST | QCOW_OFLAG_COPIED;
    ok(qc_mw_in_place(&st, own, 0, 0, 4096), "own cluster: in place");
    ok(!qc_mw_in_place(&st, HOST, 0, 0, 4096), "shared cluster: copied");
    ok(!qc_mw_in_place(&st, own | QCOW_OFLAG_COMPRESSED, 0, 0, 4096),
       "compressed: never in place");
    ok(!qc_mw_in_place(&st, own | QCOW_OFLAG_ZERO, 0, 0, 4096),
       "zero flag: not in place");
    ok(!qc_mw_in_place(&st, 0, 0, 0, 4096), "unallocated: not in place");
    ok(qc_mw_has_old_data(&st, HOST, 0), "shared data is kept");
    ok(!qc_mw_has_old_data(&st, 0, 0), "unallocated holds nothing");
    ok(!qc_mw_has_old_data(&st, HOST | QCOW_OFLAG_ZERO, 0),
       "zero cluster holds nothing");
    ok(qc_mw_has_old_data(&st, QCOW_OFLAG_COMPRESSED | 5, 0),
       "compressed data is kept");
    ok(qc_mw_is_own_zero(&st, own | QCOW_OFLAG_ZERO),
       "own preallocated zero cluster is reused");
    ok(!qc_mw_is_own_zero(&st, HOST | QCOW_OFLAG_ZERO),
       "shared zero cluster is not");
    ok(!qc_mw_needs_bitmap_update(&st, own), "no bitmaps without ext L2");

    extl2();
    own = HOST | QCOW_OFLAG_COPIED;
    ok(qc_mw_in_place(&st, own, 0x3, 0, 4096),
       "ext L2: allocated subclusters 0-1 written in place");
    ok(!qc_mw_in_place(&st, own, 0x1, 0, 4096),
       "ext L2: subcluster 1 unallocated, not in place");
    ok(qc_mw_needs_bitmap_update(&st, own), "ext L2 own cluster: bitmap");
    ok(!qc_mw_needs_bitmap_update(&st, HOST), "ext L2 shared: copied");
    ok(!qc_mw_has_old_data(&st, HOST, 0), "ext L2: empty bitmap, no data");
    ok(qc_mw_has_old_data(&st, HOST, 0x10), "ext L2: one subcluster kept");
    ok(!qc_mw_is_own_zero(&st, own | QCOW_OFLAG_ZERO),
       "ext L2: the zero flag is not a preallocated zero cluster");
}

static void bounds(void)
{
    uint64_t oe[2] = {0, 0}, ob[2] = {0, 0}, head, tail;
    struct qc_alloc a = {
        .guest = 0x10000, .nb = 2, .old_entry = oe, .old_bitmap = ob};
    plain();
    qc_mw_cow_bounds(&st, &a, 0x10100, 0x11f00, false, false, &head, &tail);
    is_uint(head, 0x10000, "empty clusters: head to the cluster start");
    is_uint(tail, 0x12000, "empty clusters: tail to the cluster end");
    qc_mw_cow_bounds(&st, &a, 0x10100, 0x11f00, false, true, &head, &tail);
    is_uint(tail, 0x11f00, "request goes on: no tail");
    oe[0] = HOST;
    oe[1] = HOST + 4096;
    qc_mw_cow_bounds(&st, &a, 0x10100, 0x10200, false, false, &head, &tail);
    is_uint(head, 0x10000, "old data: whole first cluster copied");
    is_uint(tail, 0x12000, "old data: whole last cluster copied");
    st.data_file_raw = true;
    qc_mw_cow_bounds(&st, &a, 0x10100, 0x10200, false, false, &head, &tail);
    ok(head == 0x10100 && tail == 0x10200, "raw data file: no COW");

    extl2();
    a.nb = 1;
    /* write [0x900, 0x1200) of the cluster: subclusters 1 and 2 */
    ob[0] = 1ULL << 1; /* subcluster 1 allocated, 2 not */
    qc_mw_cow_bounds(&st, &a, 0x10900, 0x11200, true, false, &head, &tail);
    is_uint(head, 0x10900, "ext L2: allocated subcluster 1 not filled");
    is_uint(tail, 0x11800, "ext L2: tail fills unallocated subcluster 2");
    ob[0] = 1ULL << 2; /* subcluster 2 allocated, 1 not */
    qc_mw_cow_bounds(&st, &a, 0x10900, 0x11200, true, false, &head, &tail);
    is_uint(head, 0x10800, "ext L2: head fills unallocated subcluster 1");
    is_uint(tail, 0x11200, "ext L2: allocated subcluster 2 not filled");
}

int main(void)
{
    predicates();
    bounds();
    return tap_done();
}
