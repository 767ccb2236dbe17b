/* SPDX-License-Identifier: MIT */
/*
 * vdi mapping: guest ranges to runs of host-contiguous blocks or zeroes,
 * block status with QEMU 7.2's flags, and allocating writes.
 */
#include "format/vdi/vdi.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
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

/* A reservation of new host blocks for the guest blocks from first on,
 * committed to the map by vdi_co_write_done once the data is written. */
struct vdi_alloc {
    uint64_t first; /* guest block */
    uint32_t index; /* host block of the first */
    uint32_t count;
};

/* The zeroes that fill the parts of new blocks a write does not cover
 * (QEMU writes whole blocks); one block, shared by every write. */
static void *zero_block(bi_node *n, vdi_state *s)
{
    if (!s->zeroes) {
        s->zeroes = bi_blockalign(n->file, VDI_BLOCK);
        if (s->zeroes)
            memset(s->zeroes, 0, VDI_BLOCK);
    }
    return s->zeroes;
}

/* Maps [off, off + len) for writing: blocks already allocated in place;
 * unallocated ones get the next host blocks, appended to the data area
 * in guest order (one host run), with zeroes before and after the guest
 * data up to the block boundaries. */
static int map_write(bi_node *n, uint64_t off, uint64_t len,
                     struct bi_extent *ext)
{
    vdi_state *s = n->opaque;
    bool data;
    uint64_t host;
    uint64_t l = run_at(s, off, len, &data, &host);
    ext->kind = BI_EXT_DATA;
    ext->host = n->file;
    ext->len = l;
    if (data) {
        ext->host_offset = host;
        return 0;
    }
    uint64_t in = off % VDI_BLOCK;
    uint64_t count = (in + l + VDI_BLOCK - 1) / VDI_BLOCK;
    if (count > s->h.blocks - s->next_index)
        return -ENOSPC; /* cannot happen in a consistent map */
    struct vdi_alloc *a = malloc(sizeof(*a));
    void *z = zero_block(n, s);
    if (!a || !z) {
        free(a);
        return -ENOMEM;
    }
    *a = (struct vdi_alloc){off / VDI_BLOCK, s->next_index, (uint32_t)count};
    s->next_index += (uint32_t)count;
    ext->host_offset = host_of(s, a->index) + in;
    ext->cow_head = z;
    ext->cow_head_len = in;
    ext->cow_tail = z;
    ext->cow_tail_len = count * VDI_BLOCK - in - l;
    ext->cookie = a;
    return 0;
}

int vdi_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
               struct bi_extent *ext)
{
    vdi_state *s = n->opaque;
    memset(ext, 0, sizeof(*ext));
    if (len == 0 || off >= n->size)
        return -EINVAL;
    len = BI_MIN(len, n->size - off);
    if (!(flags & BI_MAP_WRITE))
        return map_read(n, off, len, ext);
    if (n->read_only)
        return -EROFS;
    if (s->inconsistent)
        return -EIO; /* appending could share or overwrite blocks */
    return map_write(n, off, len, ext);
}

/* Writes the header sector with blocks_allocated = next_index (every
 * host block handed out so far, so that no later allocation, after a
 * crash too, can reuse one), then the map sectors of the new entries:
 * QEMU's order. A crash in between leaves a count that check reports,
 * never a block used twice. Under meta_lock. */
static int commit(bi_node *n, vdi_state *s, const struct vdi_alloc *a)
{
    for (uint32_t i = 0; i < a->count; i++)
        s->bmap[a->first + i] = htole32(a->index + i);
    uint32_t v = htole32(s->next_index);
    memcpy(s->raw + VH_ALLOCATED, &v, sizeof(v));
    /* QEMU writes its header back with the disk size it rounded */
    uint64_t size = htole64(vdi_guest_size(&s->h));
    memcpy(s->raw + VH_DISK_SIZE, &size, sizeof(size));
    s->h.allocated = s->next_index;
    int ret = bi_co_pwrite(n->file, 0, s->raw, VDI_HEADER_SIZE, 0);
    if (ret < 0)
        return ret;
    uint64_t per = VDI_SECTOR / 4;
    uint64_t lo = a->first / per, hi = (a->first + a->count - 1) / per;
    return bi_co_pwrite(n->file, s->h.offset_bmap + lo * VDI_SECTOR,
                        (uint8_t *)s->bmap + lo * VDI_SECTOR,
                        (hi - lo + 1) * VDI_SECTOR, 0);
}

int vdi_co_write_done(bi_node *n, struct bi_extent *ext, int ret)
{
    vdi_state *s = n->opaque;
    struct vdi_alloc *a = ext->cookie;
    ext->cookie = NULL;
    ext->cow_head = ext->cow_tail = NULL; /* the shared zero block */
    if (!a)
        return ret;
    if (ret < 0) {
        /* the blocks were never pointed to: give them back if last */
        if (s->next_index == a->index + a->count)
            s->next_index = a->index;
    } else {
        bi_co_mutex_lock(&s->meta_lock);
        ret = commit(n, s, a);
        bi_co_mutex_unlock(&s->meta_lock);
    }
    free(a);
    return ret;
}
