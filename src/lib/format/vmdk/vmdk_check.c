/* SPDX-License-Identifier: MIT */
/*
 * vmdk check as qemu-img check -f vmdk does it: every grain's entry must
 * be readable and, where allocated, start inside its file. The first
 * problem ends the check, reported (bi_message) in QEMU's words; repairs are
 * not offered (-ENOTSUP, QEMU's "does not support checks").
 */
#include "util/util.h"
#include "vmdk.h"

#include <errno.h>
#include <inttypes.h>

/* Where the grain of extent-relative offset rel lives (0: nowhere), or
 * -1 as QEMU's VMDK_ERROR. */
static int grain_host(struct vmdk_extent *e, uint64_t rel, uint64_t *host)
{
    *host = 0;
    if (e->flat) {
        *host = e->file ? e->flat_offset : 0;
        return 0;
    }
    uint32_t gte;
    bool no_gt;
    if (vmdk_gte(e, rel, &gte, &no_gt) < 0)
        return -1;
    if (!(e->zero_grain && gte == VMDK_GTE_ZEROED))
        *host = (uint64_t)gte * VMDK_SECTOR;
    return 0;
}

/* One step: the grain (a flat extent: the extent) at guest offset off. */
static int check_at(vmdk_state *s, uint64_t off, uint64_t *next)
{
    struct vmdk_extent *e = vmdk_find_extent(s, off);
    uint64_t sector = off / VMDK_SECTOR, host;
    if (!e) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: could not find extent for sector %" PRIu64, sector);
        return -EINVAL;
    }
    if (grain_host(e, off - e->start, &host) < 0) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: could not get cluster_offset for sector %" PRIu64,
                   sector);
        return -1; /* QEMU returns VMDK_ERROR itself */
    }
    if (host && host >= e->file_size) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: cluster offset for sector %" PRIu64
                   " points after EOF",
                   sector);
        return -EINVAL;
    }
    *next = off + (e->flat ? e->len : e->grain);
    return 0;
}

int vmdk_check(bi_node *n, struct bi_check_result *res, int fix, bi_error *err)
{
    (void)err;
    vmdk_state *s = n->opaque;
    if (fix)
        return -ENOTSUP;
    int ret = 0;
    bi_co_mutex_lock(&s->lock);
    for (uint64_t off = 0; off < n->size && ret == 0;)
        ret = check_at(s, off, &off);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        res->corruptions++;
    return ret;
}
