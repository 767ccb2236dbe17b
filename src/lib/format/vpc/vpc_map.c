/* SPDX-License-Identifier: MIT */
/*
 * vpc mapping: guest ranges to extents, block status, allocating writes.
 *
 * A fixed disk is one data extent: guest offset X is file offset X. In a
 * dynamic disk an allocated block's data is one extent (QEMU 7.2 reads it
 * whole without consulting the sector bitmap); consecutive unallocated
 * blocks are one run of zeroes. Allocated blocks are never
 * host-contiguous (each has its bitmap in front), so a block is the
 * longest data extent there is.
 *
 * A new block goes where the footer was, as in QEMU: its sector bitmap
 * (all ones) and the guest data are written first, then the footer at the
 * new end of the file, then the BAT entry, so a crash before the BAT
 * update leaves the block unreferenced (space leaked, no data lost).
 */
#include "util/util.h"
#include "vpc.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A block reserved at the end of the file for a write that has not been
 * mapped yet (s->pending), then handed from co_map to co_write_done. */
struct vpc_alloc {
    uint32_t idx;   /* BAT index */
    uint64_t start; /* host offset of the block's bitmap */
    bool zero;      /* the file had bytes there: zero the data first */
    struct vpc_alloc *next;
};

static bool allocated(const vpc_state *s, uint64_t idx)
{
    return idx < s->max_table_entries && s->bat[idx] != VHD_BAT_UNUSED;
}

/* Host offset of guest offset off inside allocated block idx. */
static uint64_t host_of(const vpc_state *s, uint64_t idx, uint64_t off)
{
    return (uint64_t)s->bat[idx] * VHD_SECTOR + s->bitmap_size +
           off % s->block_size;
}

/* The extent at off (reads): one allocated block's data, or every
 * unallocated block from off on as zeroes. */
static void map_read(bi_node *n, uint64_t off, uint64_t len,
                     struct bi_extent *ext)
{
    vpc_state *s = n->opaque;
    uint64_t idx = off / s->block_size;
    uint64_t run = BI_MIN(len, s->block_size - off % s->block_size);
    if (allocated(s, idx)) {
        ext->kind = BI_EXT_DATA;
        ext->host = n->file;
        ext->host_offset = host_of(s, idx, off);
        ext->len = run;
        return;
    }
    while (run < len && !allocated(s, ++idx))
        run = BI_MIN(len, run + s->block_size);
    ext->kind = BI_EXT_ZERO;
    ext->len = run;
}

/* Before the first write to an allocated block since open, its sector
 * bitmap is set to all ones, as QEMU does (so a reader that honours the
 * bitmap sees what was written). */
static int set_bitmap(bi_node *n, uint64_t idx)
{
    vpc_state *s = n->opaque;
    if (s->bitmap_set[idx / 8] & (1u << (idx % 8)))
        return 0;
    s->bitmap_set[idx / 8] |= 1u << (idx % 8);
    uint64_t at = (uint64_t)s->bat[idx] * VHD_SECTOR;
    int ret = bi_co_pwrite(n->file, at, s->ones, s->bitmap_size, 0);
    if (ret < 0)
        s->bitmap_set[idx / 8] &= ~(1u << (idx % 8));
    return ret;
}

/* Takes back the reservation of the block at start if it is the last one
 * handed out (else its space stays unused) and puts the footer back at
 * the end. Called with s->lock held. */
static void unreserve(bi_node *n, uint64_t idx, uint64_t start)
{
    vpc_state *s = n->opaque;
    if (s->free_offset == start + s->bitmap_size + s->block_size)
        s->free_offset = start;
    s->bitmap_set[idx / 8] &= ~(1u << (idx % 8));
    bi_co_pwrite(n->file, s->free_offset, s->footer, VHD_FOOTER_SIZE, 0);
}

/* The reservation for block idx, unlinked from s->pending; NULL if none. */
static struct vpc_alloc *take_pending(vpc_state *s, uint64_t idx)
{
    for (struct vpc_alloc **p = &s->pending; *p; p = &(*p)->next) {
        if ((*p)->idx == idx) {
            struct vpc_alloc *a = *p;
            *p = a->next;
            return a;
        }
    }
    return NULL;
}

static bool is_pending(const vpc_state *s, uint64_t idx)
{
    for (const struct vpc_alloc *a = s->pending; a; a = a->next)
        if (a->idx == idx)
            return true;
    return false;
}

/* Reserves, in guest order and without yielding, a block at the end of
 * the file for every unallocated block of the write [off, off+len), as
 * QEMU lays out the blocks of one request before the next request (so
 * qemu-img convert's in-order writes give QEMU's layout here too). */
static int reserve_blocks(bi_node *n, uint64_t off, uint64_t len)
{
    vpc_state *s = n->opaque;
    uint64_t last = BI_MIN((off + len - 1) / s->block_size,
                           (uint64_t)s->max_table_entries - 1);
    for (uint64_t idx = off / s->block_size; idx <= last; idx++) {
        if (allocated(s, idx) || is_pending(s, idx))
            continue;
        if (s->free_offset / VHD_SECTOR >= VHD_BAT_UNUSED)
            return -EFBIG; /* a BAT entry cannot point there */
        struct vpc_alloc *a = malloc(sizeof(*a));
        if (!a)
            return -ENOMEM;
        *a = (struct vpc_alloc){(uint32_t)idx, s->free_offset,
                                s->file_len > s->free_offset + VHD_FOOTER_SIZE,
                                s->pending};
        s->pending = a;
        s->free_offset += s->bitmap_size + s->block_size;
    }
    return 0;
}

/* Maps the write at off into its reserved block. First, under s->lock
 * (so that no footer write at the old end of the file is still in flight
 * over the new bitmap), the data area is zeroed if the file had bytes
 * there, so the block never shows stale data, and the bitmap is written,
 * unless the write starts the block: then it goes in front of the data in
 * the same write. */
static int map_new_block(bi_node *n, struct vpc_alloc *a, uint64_t off,
                         uint64_t len, struct bi_extent *ext)
{
    vpc_state *s = n->opaque;
    uint64_t inb = off % s->block_size;
    s->bitmap_set[a->idx / 8] |= 1u << (a->idx % 8);
    bi_co_mutex_lock(&s->lock);
    int ret = 0;
    if (a->zero)
        ret = bi_co_pwrite_zeroes(n->file, a->start + s->bitmap_size,
                                  s->block_size, 0);
    if (ret == 0 && inb)
        ret = bi_co_pwrite(n->file, a->start, s->ones, s->bitmap_size, 0);
    if (ret < 0)
        unreserve(n, a->idx, a->start);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0) {
        free(a);
        return ret;
    }
    if (!inb) {
        ext->cow_head = s->ones;
        ext->cow_head_len = s->bitmap_size;
    }
    ext->kind = BI_EXT_DATA;
    ext->host = n->file;
    ext->host_offset = a->start + s->bitmap_size + inb;
    ext->len = BI_MIN(len, s->block_size - inb);
    ext->cookie = a;
    ext->flush_before_done =
        n->cache == BI_CACHE_WRITETHROUGH || n->cache == BI_CACHE_DIRECTSYNC;
    return 0;
}

static bool ranges_meet(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

/* Whether allocated block idx (bitmap and data) lies over the footer copy,
 * the dynamic disk header or the BAT (a crafted BAT entry): QEMU would
 * write the guest's data into its metadata; blkimg refuses the write. */
static bool over_metadata(const vpc_state *s, uint64_t idx)
{
    uint64_t at = (uint64_t)s->bat[idx] * VHD_SECTOR;
    uint64_t len = (uint64_t)s->bitmap_size + s->block_size;
    uint64_t bat_len = (uint64_t)s->max_table_entries * 4;
    return ranges_meet(at, len, 0, VHD_FOOTER_SIZE) ||
           ranges_meet(at, len, s->header_offset, VHD_DYN_HEADER_SIZE) ||
           ranges_meet(at, len, s->bat_offset, bat_len);
}

static int map_write(bi_node *n, uint64_t off, uint64_t len,
                     struct bi_extent *ext)
{
    vpc_state *s = n->opaque;
    uint64_t idx = off / s->block_size;
    if (idx >= s->max_table_entries)
        return -EIO; /* open checked that the BAT covers the guest */
    if (allocated(s, idx) && over_metadata(s, idx))
        return -EIO;
    if (allocated(s, idx)) {
        ext->kind = BI_EXT_DATA;
        ext->host = n->file;
        ext->host_offset = host_of(s, idx, off);
        ext->len = BI_MIN(len, s->block_size - off % s->block_size);
        return set_bitmap(n, idx);
    }
    struct vpc_alloc *a = take_pending(s, idx);
    if (!a) {
        int ret = reserve_blocks(n, off, len);
        if (ret < 0)
            return ret;
        a = take_pending(s, idx);
        assert(a);
    }
    return map_new_block(n, a, off, len, ext);
}

int vpc_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
               struct bi_extent *ext)
{
    vpc_state *s = n->opaque;
    if (s->fixed) {
        /* never over the footer (a geometry larger than the file) */
        if ((flags & BI_MAP_WRITE) && off + len > s->fixed_end)
            return -EIO;
        ext->kind = BI_EXT_DATA;
        ext->host = n->file;
        ext->host_offset = off;
        ext->len = len;
        return 0;
    }
    if (flags & BI_MAP_WRITE)
        return map_write(n, off, len, ext);
    map_read(n, off, len, ext);
    return 0;
}

/* The footer at the current end of the file (past every block handed
 * out), then the BAT entry of a. Called with s->lock held. */
static int commit_block(bi_node *n, const struct vpc_alloc *a)
{
    vpc_state *s = n->opaque;
    uint64_t need = s->bitmap_size + s->block_size;
    s->file_len = BI_MAX(s->file_len, a->start + need);
    int ret =
        bi_co_pwrite(n->file, s->free_offset, s->footer, VHD_FOOTER_SIZE, 0);
    if (ret < 0)
        return ret;
    s->file_len = BI_MAX(s->file_len, s->free_offset + VHD_FOOTER_SIZE);
    uint32_t entry = (uint32_t)(a->start / VHD_SECTOR);
    uint32_t be = htobe32(entry);
    ret = bi_co_pwrite(n->file, s->bat_offset + (uint64_t)a->idx * 4, &be,
                       sizeof(be), 0);
    if (ret == 0)
        s->bat[a->idx] = entry;
    return ret;
}

int vpc_co_write_done(bi_node *n, struct bi_extent *ext, int ret)
{
    vpc_state *s = n->opaque;
    struct vpc_alloc *a = ext->cookie;
    ext->cow_head = NULL; /* s->ones, the driver's */
    ext->cookie = NULL;
    if (!a)
        return ret;
    bi_co_mutex_lock(&s->lock);
    if (ret == 0) {
        ret = commit_block(n, a);
    } else {
        unreserve(n, a->idx, a->start); /* the block stays unreferenced */
    }
    bi_co_mutex_unlock(&s->lock);
    free(a);
    return ret;
}

/* QEMU's answers: a fixed disk is data at the same offset of the file,
 * refined by the file's holes; an allocated block is data up to the
 * block's end; unallocated blocks read as zeroes. */
int vpc_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                        struct bi_status *st)
{
    vpc_state *s = n->opaque;
    struct bi_extent e;
    memset(&e, 0, sizeof(e));
    if (s->fixed) {
        st->len = len;
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID | BI_BS_RECURSE;
        st->offset = off;
        st->file = n->file;
        return 0;
    }
    map_read(n, off, len, &e);
    st->len = e.len;
    if (e.kind == BI_EXT_DATA) {
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
        st->offset = e.host_offset;
        st->file = n->file;
    } else {
        st->flags = BI_BS_ZERO;
    }
    return 0;
}

void vpc_free_pending(vpc_state *s)
{
    while (s->pending) {
        struct vpc_alloc *a = s->pending;
        s->pending = a->next;
        free(a);
    }
}
