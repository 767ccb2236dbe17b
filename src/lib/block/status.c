/* SPDX-License-Identifier: MIT */
/*
 * Block status: what a range of a node reads as, with QEMU 7.2's semantics
 * (so that `map` output matches qemu-img's): a format's data run is refined
 * by what the file says about the host range (holes read as zeroes), an
 * unallocated range reads as zeroes when there is no backing file or it
 * lies past the backing file's end, and "above" walks down the chain while
 * the range is unallocated.
 */
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <string.h>

static unsigned ext_flags(const struct bi_extent *e)
{
    switch (e->kind) {
    case BI_EXT_DATA:
        return BI_BS_DATA | BI_BS_OFFSET_VALID;
    case BI_EXT_ZERO:
        return BI_BS_ZERO;
    case BI_EXT_COMPRESSED:
        return BI_BS_DATA | BI_BS_COMPRESSED;
    default:
        return 0;
    }
}

int bi_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                       struct bi_status *st)
{
    memset(st, 0, sizeof(*st));
    if (off >= n->size && !n->drv->is_protocol) {
        st->flags = BI_BS_EOF;
        return 0;
    }
    if (!n->drv->is_protocol)
        len = BI_MIN(len, n->size - off);
    if (len == 0) {
        st->flags = BI_BS_EOF;
        return 0;
    }
    int ret;
    if (n->drv->co_block_status) {
        ret = n->drv->co_block_status(n, off, len, st);
    } else if (n->drv->co_map) {
        struct bi_extent e;
        memset(&e, 0, sizeof(e));
        ret = n->drv->co_map(n, off, len, BI_MAP_READ, &e);
        st->len = e.len;
        st->flags = ext_flags(&e);
        st->offset = e.host_offset;
        st->file = e.host;
    } else {
        st->len = len;
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
        st->offset = off;
        st->file = n;
        ret = 0;
    }
    if (ret < 0)
        return ret;
    if (st->len == 0 || st->len > len)
        st->len = len;
    if ((st->flags & (BI_BS_DATA | BI_BS_ZERO)) &&
        !(st->flags & BI_BS_NOT_ALLOCATED))
        st->flags |= BI_BS_ALLOCATED;
    st->flags &= ~BI_BS_NOT_ALLOCATED;

    if (n->drv->is_protocol)
        return 0;

    /* A data run on a file: holes of the file read as zeroes. */
    bool recurse = (st->flags & BI_BS_RECURSE) != 0 || !n->drv->co_block_status;
    st->flags &= ~BI_BS_RECURSE;
    if (recurse && (st->flags & BI_BS_DATA) &&
        (st->flags & BI_BS_OFFSET_VALID) && st->file && st->file != n &&
        st->file->drv->is_protocol && !n->drv->identity_map) {
        struct bi_status fs;
        if (bi_co_block_status(st->file, st->offset, st->len, &fs) == 0) {
            if ((fs.flags & BI_BS_EOF) &&
                (fs.len == 0 || (fs.flags & BI_BS_ZERO))) {
                st->flags |= BI_BS_ZERO;
            } else if (fs.len) {
                st->len = BI_MIN(st->len, fs.len);
                st->flags |= fs.flags & BI_BS_ZERO;
            }
        }
    }
    if (!(st->flags & BI_BS_ALLOCATED)) {
        if (!n->backing)
            st->flags |= BI_BS_ZERO;
        else if (off >= n->backing->size)
            st->flags |= BI_BS_ZERO;
    }
    if (off + st->len >= n->size)
        st->flags |= BI_BS_EOF;
    return 0;
}

static int block_status_above(bi_node *n, bi_node *base, uint64_t off,
                              uint64_t len, struct bi_status *st)
{
    int depth = 0;
    for (bi_node *cur = n;;) {
        int ret = bi_co_block_status(cur, off, len, st);
        if (ret < 0)
            return ret;
        if (st->flags & BI_BS_EOF && st->len == 0)
            break;
        if (st->flags & (BI_BS_DATA | BI_BS_ZERO))
            break;
        if (!cur->backing || cur->backing == base)
            break;
        len = st->len;
        cur = cur->backing;
        depth++;
    }
    st->depth = depth;
    return 0;
}

struct status_args {
    bi_node *n, *base;
    uint64_t off, len;
    struct bi_status *st;
    bool above;
};

static int status_fn(void *opaque)
{
    struct status_args *a = opaque;
    if (a->above)
        return block_status_above(a->n, a->base, a->off, a->len, a->st);
    return bi_co_block_status(a->n, a->off, a->len, a->st);
}

bool bi_status_protocol_start(bi_node *n, uint64_t size, uint64_t off,
                              uint64_t *len, struct bi_status *st)
{
    memset(st, 0, sizeof(*st));
    st->offset = off;
    st->file = n;
    if (off >= size) {
        st->len = *len;
        st->flags = BI_BS_ZERO | BI_BS_OFFSET_VALID | BI_BS_EOF;
        return true;
    }
    *len = BI_MIN(*len, size - off);
    return false;
}

/* Runs a status query into st as the program knows it (size bytes). */
static int status_sized(struct status_args *a, struct bi_status *st,
                        size_t size)
{
    struct bi_status full;
    int ret;

    if (size == sizeof(full)) {
        a->st = st;
        return bi_run_co(status_fn, a);
    }
    memset(&full, 0, sizeof(full));
    a->st = &full;
    ret = bi_run_co(status_fn, a);
    bi_struct_out(st, size, &full, sizeof(full));
    return ret;
}

int bi_block_status_sized(bi_node *n, uint64_t off, uint64_t len,
                          struct bi_status *st, size_t size)
{
    struct status_args a = {n, NULL, off, len, NULL, false};
    return status_sized(&a, st, size);
}

int bi_block_status_above_sized(bi_node *n, bi_node *base, uint64_t off,
                                uint64_t len, struct bi_status *st, size_t size)
{
    struct status_args a = {n, base, off, len, NULL, true};
    return status_sized(&a, st, size);
}
