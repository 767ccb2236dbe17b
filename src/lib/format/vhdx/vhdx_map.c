/* SPDX-License-Identifier: MIT */
/*
 * vhdx mapping: guest ranges to runs of host-contiguous payload blocks or
 * zeroes, allocating writes (a new block appended at the end of the file
 * at a MiB boundary) and the header updates around them.
 *
 * Ordering of an allocating write: the file is grown to hold the block
 * (zeroes), the guest data is written and flushed, and only then does
 * the BAT entry point at it (written in place; QEMU journals that write
 * through the log). A crash before the BAT write leaves the block
 * unreferenced: the guest sees the old contents, never garbage.
 */
#include "format/vhdx/vhdx.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Whether entry e maps its block to data in the file. */
static bool is_data(uint64_t e)
{
    return (e & VHDX_BAT_STATE_MASK) == VHDX_BAT_FULLY_PRESENT;
}

/* Whether entry e reads as zeroes (QEMU's list: not present, undefined,
 * zero, unmapped, the v0.95 unmapped). */
static bool is_zero(uint64_t e)
{
    switch (e & VHDX_BAT_STATE_MASK) {
    case VHDX_BAT_NOT_PRESENT:
    case VHDX_BAT_UNDEFINED:
    case VHDX_BAT_ZERO:
    case VHDX_BAT_UNMAPPED:
    case VHDX_BAT_UNMAPPED_V095:
        return true;
    default:
        return false;
    }
}

static uint64_t entry_of(const vhdx_state *s, uint64_t block)
{
    return vhdx_bat_get(s, vhdx_bat_index(s, block));
}

/* The run from guest offset off (below the size) of at most len bytes:
 * blocks that are data and follow one another in the file (*host: the
 * offset of off), or blocks that read as zeroes. Returns the run's
 * length, sets *data; -EIO for a block state QEMU cannot read (partially
 * present, reserved states). */
static int64_t run_at(const vhdx_state *s, uint64_t off, uint64_t len,
                      bool *data, uint64_t *host)
{
    uint64_t bs = s->block_size;
    uint64_t b = off / bs, in = off % bs;
    uint64_t e = entry_of(s, b);
    if (!is_data(e) && !is_zero(e))
        return -EIO;
    *data = is_data(e);
    uint64_t base = e & VHDX_BAT_OFFSET_MASK;
    *host = *data ? base + in : 0;
    uint64_t end = off + len, reach = (b + 1) * bs;
    for (uint64_t i = 1; reach < end; i++) {
        uint64_t next = entry_of(s, b + i);
        bool same = *data ? is_data(next) &&
                                (next & VHDX_BAT_OFFSET_MASK) == base + i * bs
                          : is_zero(next);
        if (!same)
            break;
        reach += bs;
    }
    return (int64_t)(BI_MIN(reach, end) - off);
}

static int map_read(bi_node *n, uint64_t off, uint64_t len,
                    struct bi_extent *ext)
{
    vhdx_state *s = n->opaque;
    bool data;
    uint64_t host;
    int64_t l = run_at(s, off, len, &data, &host);
    if (l < 0)
        return (int)l;
    ext->len = (uint64_t)l;
    ext->kind = data ? BI_EXT_DATA : BI_EXT_ZERO;
    if (data) {
        ext->host = n->file;
        ext->host_offset = host;
    }
    return 0;
}

/* New blocks for the guest blocks from `block` on (`count` of them),
 * one host run from offset `at`, committed to the BAT by
 * vhdx_co_write_done once the data is on disk. */
struct vhdx_alloc {
    uint64_t block;
    uint64_t count;
    uint64_t at;
};

/* Reserves count blocks at the end of the file, rounded up to a MiB, and
 * grows the file over them (zeroes: the parts the write does not cover
 * read as zeroes, whatever the old state). Under s->lock. */
static int grow_for_blocks(bi_node *n, vhdx_state *s, uint64_t count,
                           uint64_t *at)
{
    *at = bi_align_up(s->file_end, VHDX_MIB);
    uint64_t end = *at + count * s->block_size;
    if (end > (VHDX_BAT_OFFSET_MASK & ~(1ull << 63)))
        return -EFBIG;
    if (!n->file->drv->co_truncate)
        return -ENOTSUP;
    bi_error e;
    bi_error_init(&e);
    int ret =
        n->file->drv->co_truncate(n->file, end, false, BI_PREALLOC_OFF, &e);
    if (ret < 0)
        return ret;
    s->file_end = end;
    return 0;
}

/* The first guest-visible write gives the image a new data write GUID
 * (MS-VHDX, as QEMU does). Under s->lock. */
static int first_write(bi_node *n, vhdx_state *s)
{
    if (s->data_guid_changed)
        return 0;
    int ret = vhdx_co_update_headers(n, true, NULL);
    if (ret == 0)
        s->data_guid_changed = true;
    return ret;
}

/* Maps [off, off + len) for writing: data blocks in place; blocks that
 * read as zeroes get new blocks, every one the write reaches in one host
 * run (one data write, one flush, one BAT write for all of them). */
static int map_write(bi_node *n, uint64_t off, uint64_t len,
                     struct bi_extent *ext)
{
    vhdx_state *s = n->opaque;
    bi_co_mutex_lock(&s->lock);
    int ret = first_write(n, s);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        return ret;
    bool data;
    uint64_t host;
    int64_t l = run_at(s, off, len, &data, &host);
    if (l < 0)
        return (int)l;
    ext->kind = BI_EXT_DATA;
    ext->host = n->file;
    if (data) {
        ext->len = (uint64_t)l;
        ext->host_offset = host;
        return 0;
    }
    uint64_t in = off % s->block_size;
    struct vhdx_alloc *a = malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->block = off / s->block_size;
    a->count = (in + (uint64_t)l + s->block_size - 1) / s->block_size;
    bi_co_mutex_lock(&s->lock);
    ret = grow_for_blocks(n, s, a->count, &a->at);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0) {
        free(a);
        return ret;
    }
    ext->len = (uint64_t)l;
    ext->host_offset = a->at + in;
    ext->cookie = a;
    ext->flush_before_done = true; /* data on disk before the BAT names it */
    return 0;
}

int vhdx_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                struct bi_extent *ext)
{
    memset(ext, 0, sizeof(*ext));
    if (len == 0 || off >= n->size)
        return -EINVAL;
    len = BI_MIN(len, n->size - off);
    if (!(flags & BI_MAP_WRITE))
        return map_read(n, off, len, ext);
    if (n->read_only)
        return -EROFS;
    return map_write(n, off, len, ext);
}

/* Points the BAT entries of a's blocks at the new blocks and writes the
 * BAT sectors that hold them, in one write. Under s->lock. */
static int commit(bi_node *n, vhdx_state *s, const struct vhdx_alloc *a)
{
    uint64_t first = vhdx_bat_index(s, a->block);
    uint64_t last = vhdx_bat_index(s, a->block + a->count - 1);
    uint64_t *old = malloc((last - first + 1) * sizeof(*old));
    if (!old)
        return -ENOMEM;
    memcpy(old, s->bat + first, (last - first + 1) * sizeof(*old));
    for (uint64_t b = 0; b < a->count; b++)
        s->bat[vhdx_bat_index(s, a->block + b)] =
            htole64((a->at + b * s->block_size) | VHDX_BAT_FULLY_PRESENT);
    uint64_t sec = first * 8 / 512 * 512;
    uint64_t end = bi_align_up((last + 1) * 8, 512);
    /* the BAT region may end inside the sector: never write past it */
    uint64_t len = BI_MIN(end, (uint64_t)s->bat_length) - sec;
    int ret = bi_co_pwrite(n->file, s->bat_offset + sec,
                           (uint8_t *)s->bat + sec, len, 0);
    if (ret < 0)
        memcpy(s->bat + first, old, (last - first + 1) * sizeof(*old));
    free(old);
    return ret;
}

int vhdx_co_write_done(bi_node *n, struct bi_extent *ext, int ret)
{
    vhdx_state *s = n->opaque;
    struct vhdx_alloc *a = ext->cookie;
    ext->cookie = NULL;
    if (!a)
        return ret;
    if (ret == 0) {
        bi_co_mutex_lock(&s->lock);
        ret = commit(n, s, a);
        bi_co_mutex_unlock(&s->lock);
    }
    /* on failure the block stays unreferenced: check counts no error */
    free(a);
    return ret;
}

/* Writes one new header into the slot that is not current. */
static int write_one_header(bi_node *n, vhdx_state *s, bool data_guid,
                            const vhdx_guid *log_guid)
{
    static const uint64_t at[2] = {VHDX_HEADER1_OFFSET, VHDX_HEADER2_OFFSET};
    int slot = !s->cur;
    uint8_t *h = s->hdr[slot];
    memcpy(h, s->hdr[s->cur], VHDX_HEADER_SIZE);
    vhdx_st64(h + VHH_SEQUENCE, vhdx_ld64(h + VHH_SEQUENCE) + 1);
    memcpy(h + VHH_FILE_WRITE_GUID, s->session_guid.b, 16);
    if (data_guid) {
        vhdx_guid g;
        vhdx_guid_generate(&g);
        memcpy(h + VHH_DATA_WRITE_GUID, g.b, 16);
    }
    if (log_guid)
        memcpy(h + VHH_LOG_GUID, log_guid->b, 16);
    vhdx_set_checksum(h, VHDX_HEADER_SIZE, VHH_CHECKSUM);
    int ret = bi_co_pwrite(n->file, at[slot], h, VHDX_HEADER_SIZE, 0);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0) {
        memcpy(h, s->hdr[s->cur], VHDX_HEADER_SIZE); /* slot unchanged */
        return ret;
    }
    s->cur = slot;
    return 0;
}

int vhdx_co_update_headers(bi_node *n, bool data_guid,
                           const vhdx_guid *log_guid)
{
    vhdx_state *s = n->opaque;
    int ret = write_one_header(n, s, data_guid, log_guid);
    if (ret == 0)
        ret = write_one_header(n, s, data_guid, log_guid);
    return ret;
}
