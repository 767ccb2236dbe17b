/* SPDX-License-Identifier: MIT */
/*
 * vdi mapping: guest ranges to runs of host-contiguous blocks or zeroes,
 * and block status with QEMU 7.2's flags.
 */
#include "format/vdi/vdi.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

static uint32_t entry_at(const vdi_state *s, uint64_t block)
{
    assert(block < s->h.blocks);
    return le32toh(s->bmap[block]);
}

static uint64_t host_of(const vdi_state *s, uint32_t entry)
{
    return s->h.offset_data + (uint64_t)entry * VDI_BLOCK;
}

/* The run from guest offset off (below the size) of at most len bytes:
 * blocks whose entries follow one another (one host run, *host its
 * offset) or blocks that are not allocated (*host = 0). Returns the
 * run's length and sets *data. */
static uint64_t run_at(const vdi_state *s, uint64_t off, uint64_t len,
                       bool *data, uint64_t *host)
{
    uint64_t b = off / VDI_BLOCK, in = off % VDI_BLOCK;
    uint32_t e = entry_at(s, b);
    uint64_t end = off + len, reach = (b + 1) * VDI_BLOCK;
    *data = vdi_is_allocated(e);
    *host = *data ? host_of(s, e) + in : 0;
    for (uint64_t i = 1; reach < end; i++) {
        uint32_t next = entry_at(s, b + i);
        bool same = *data ? vdi_is_allocated(next) && next == e + i
                          : !vdi_is_allocated(next);
        if (!same)
            break;
        reach += VDI_BLOCK;
    }
    return BI_MIN(reach, end) - off;
}

int vdi_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                        struct bi_status *st)
{
    vdi_state *s = n->opaque;
    memset(st, 0, sizeof(*st));
    if (off >= n->size) {
        st->flags = BI_BS_EOF;
        return 0;
    }
    bool data;
    uint64_t host;
    st->len = run_at(s, off, BI_MIN(len, n->size - off), &data, &host);
    if (data) {
        /* a static image's blocks may be holes of the file: QEMU asks it */
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
        if (s->h.image_type == VDI_TYPE_STATIC)
            st->flags |= BI_BS_RECURSE;
        st->offset = host;
        st->file = n->file;
    } else {
        st->flags = BI_BS_ZERO; /* no backing file: unallocated is zero */
    }
    if (off + st->len >= n->size)
        st->flags |= BI_BS_EOF;
    return 0;
}

static int map_read(bi_node *n, uint64_t off, uint64_t len,
                    struct bi_extent *ext)
{
    vdi_state *s = n->opaque;
    bool data;
    uint64_t host;
    ext->len = run_at(s, off, len, &data, &host);
    ext->kind = data ? BI_EXT_DATA : BI_EXT_ZERO;
    if (data) {
        ext->host = n->file;
        ext->host_offset = host;
    }
    return 0;
}

int vdi_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
               struct bi_extent *ext)
{
    memset(ext, 0, sizeof(*ext));
    if (len == 0 || off >= n->size)
        return -EINVAL;
    len = BI_MIN(len, n->size - off);
    if (flags & BI_MAP_WRITE)
        return -ENOTSUP;
    return map_read(n, off, len, ext);
}

int vdi_co_write_done(bi_node *n, struct bi_extent *ext, int ret)
{
    (void)n;
    (void)ext;
    return ret;
}
