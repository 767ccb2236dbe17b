/* SPDX-License-Identifier: MIT */
/*
 * qcow2 refcounts and host cluster allocation.
 *
 * Allocation finds the first run of free clusters from a hint and returns
 * it whole, so a write's clusters are one host-contiguous extent. Refcount
 * blocks that do not exist yet are placed at the first cluster they cover
 * (self-describing); a refcount table that is too small is replaced by a
 * bigger one placed, with the blocks that cover it, just past the area the
 * old table covers. All of this runs with s->lock held.
 */
#include "qcow2.h"
#include "util/util.h"
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rb_get(const qcow2_state *s, const void *block, uint64_t i)
{
    const uint8_t *p = block;
    switch (s->refcount_order) {
    case 0:
    case 1:
    case 2: {
        uint64_t bit = i << s->refcount_order;
        return (p[bit / 8] >> (bit % 8)) & ((1u << s->refcount_bits) - 1);
    }
    case 3:
        return p[i];
    case 4: {
        uint16_t v;
        memcpy(&v, p + i * 2, 2);
        return be16toh(v);
    }
    case 5: {
        uint32_t v;
        memcpy(&v, p + i * 4, 4);
        return be32toh(v);
    }
    default: {
        uint64_t v;
        memcpy(&v, p + i * 8, 8);
        return be64toh(v);
    }
    }
}

static void rb_set(const qcow2_state *s, void *block, uint64_t i, uint64_t v)
{
    uint8_t *p = block;
    switch (s->refcount_order) {
    case 0:
    case 1:
    case 2: {
        uint64_t bit = i << s->refcount_order;
        unsigned mask = ((1u << s->refcount_bits) - 1) << (bit % 8);
        p[bit / 8] =
            (uint8_t)((p[bit / 8] & ~mask) | ((unsigned)v << (bit % 8) & mask));
        break;
    }
    case 3:
        p[i] = (uint8_t)v;
        break;
    case 4: {
        uint16_t x = htobe16((uint16_t)v);
        memcpy(p + i * 2, &x, 2);
        break;
    }
    case 5: {
        uint32_t x = htobe32((uint32_t)v);
        memcpy(p + i * 4, &x, 4);
        break;
    }
    default: {
        uint64_t x = htobe64(v);
        memcpy(p + i * 8, &x, 8);
        break;
    }
    }
}

int qc_refcount_init(bi_node *n)
{
    qcow2_state *s = n->opaque;
    s->free_cluster_index = 0;
    s->free_byte_offset = 0;
    return 0;
}

static int get_refblock(bi_node *n, uint64_t rt_idx, void **block)
{
    qcow2_state *s = n->opaque;
    uint64_t off = s->refcount_table[rt_idx] & RTE_OFFSET_MASK;
    if (off & (s->cluster_size - 1))
        return qc_signal_corruption(n,
                                    "Refblock offset %#" PRIx64
                                    " unaligned (reftable index: %#" PRIx64 ")",
                                    off, rt_idx);
    if (off < s->cluster_size)
        return qc_signal_corruption(
            n, "Refblock at offset %#" PRIx64 " overlaps the header", off);
    return qc_cache_get(n, &s->rb_cache, off, false, block);
}

int qc_get_refcount(bi_node *n, uint64_t ci, uint64_t *rc)
{
    qcow2_state *s = n->opaque;
    uint64_t rt_idx = ci >> s->rb_bits;
    *rc = 0;
    if (rt_idx >= s->refcount_table_size ||
        !(s->refcount_table[rt_idx] & RTE_OFFSET_MASK))
        return 0;
    void *block;
    int ret = get_refblock(n, rt_idx, &block);
    if (ret < 0)
        return ret;
    *rc = rb_get(s, block, ci & ((1ULL << s->rb_bits) - 1));
    qc_cache_put(&s->rb_cache, block);
    return 0;
}

static int write_reftable_entry(bi_node *n, uint64_t idx)
{
    qcow2_state *s = n->opaque;
    uint64_t v = htobe64(s->refcount_table[idx]);
    uint64_t off = s->refcount_table_offset + idx * 8;
    int ret = qc_check_overlap(n, QC_OL_REFTABLE, off, 8);
    if (ret < 0)
        return ret;
    ret = bi_co_pwrite(n->file, off, &v, 8, 0);
    if (ret == 0)
        s->rb_written_unflushed = true;
    return ret;
}

/* Replaces the refcount table by one with at least need_idx + 1 entries. */
static int grow_refcount_table(bi_node *n, uint64_t need_idx)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t epb = 1ULL << s->rb_bits;
    uint64_t old_entries = s->refcount_table_size;
    uint64_t start = old_entries << s->rb_bits; /* first uncovered cluster */
    uint64_t new_entries =
        BI_MAX(need_idx + 1, old_entries + old_entries / 2 + 1);
    uint64_t t, k = 1;
    uint8_t *buf = NULL;
    int ret;

    for (;;) {
        t = (new_entries * 8 + cs - 1) / cs;
        uint64_t k2 = (k + t + epb - 1) / epb;
        if (k2 > k) {
            k = k2;
            continue;
        }
        if (old_entries + k > new_entries) {
            new_entries = old_entries + k;
            continue;
        }
        break;
    }
    if (t * cs > QCOW2_MAX_REFTABLE_BYTES)
        return -EFBIG;
    if (((start + k + t) << s->cluster_bits) >> s->cluster_bits !=
            start + k + t ||
        ((start + k + t) << s->cluster_bits) > (1ULL << 56))
        return -EFBIG;

    /* the file reaches the new structures before they are written */
    qc_file_ahead(n, (start + k + t) << s->cluster_bits);
    buf = bi_blockalign(n->file, cs);
    if (!buf)
        return -ENOMEM;
    /* refcount blocks describing [start, start + k + t) */
    for (uint64_t j = 0; j < k; j++) {
        memset(buf, 0, cs);
        uint64_t first = start + j * epb;
        for (uint64_t c = first; c < first + epb && c < start + k + t; c++)
            rb_set(s, buf, c - first, 1);
        uint64_t off = (start + j) << s->cluster_bits;
        ret = qc_check_overlap(n, 0, off, cs);
        if (ret < 0)
            goto out;
        ret = bi_co_pwrite(n->file, off, buf, cs, 0);
        if (ret < 0)
            goto out;
    }
    /* new table */
    uint64_t *nt = calloc(t * cs / 8, 8);
    if (!nt) {
        ret = -ENOMEM;
        goto out;
    }
    memcpy(nt, s->refcount_table, old_entries * 8);
    for (uint64_t j = 0; j < k; j++)
        nt[old_entries + j] = (start + j) << s->cluster_bits;
    uint64_t tbl_entries = t * cs / 8;
    uint64_t *be = calloc(tbl_entries, 8);
    if (!be) {
        free(nt);
        ret = -ENOMEM;
        goto out;
    }
    for (uint64_t i = 0; i < tbl_entries; i++)
        be[i] = htobe64(nt[i]);
    uint64_t tbl_off = (start + k) << s->cluster_bits;
    ret = qc_check_overlap(n, 0, tbl_off, t * cs);
    if (ret == 0)
        ret = bi_co_pwrite(n->file, tbl_off, be, t * cs, 0);
    free(be);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0) {
        free(nt);
        goto out;
    }
    /* switch the header over */
    uint8_t h[12];
    uint64_t o64 = htobe64(tbl_off);
    uint32_t c32 = htobe32((uint32_t)t);
    memcpy(h, &o64, 8);
    memcpy(h + 8, &c32, 4);
    ret = qc_write_header_field(n, QH_RT_OFFSET, h, 12);
    if (ret < 0) {
        free(nt);
        goto out;
    }
    uint64_t old_off = s->refcount_table_offset;
    uint64_t old_clusters = s->refcount_table_clusters;
    free(s->refcount_table);
    s->refcount_table = nt;
    s->refcount_table_size = tbl_entries;
    s->refcount_table_offset = tbl_off;
    s->refcount_table_clusters = (uint32_t)t;
    uint64_t end = (start + k + t) << s->cluster_bits;
    if (end > s->file_size)
        s->file_size = end;
    /* the old table is unreferenced now that the header is on disk */
    ret = qc_update_refcount(n, old_off, old_clusters * cs, -1);
out:
    bi_free_aligned(buf);
    return ret;
}

/* Makes sure the refcount block for reftable index rt_idx exists. Returns
 * 1 if metadata was created (callers searching free space restart). */
static int ensure_refblock(bi_node *n, uint64_t rt_idx)
{
    qcow2_state *s = n->opaque;
    int ret;
    if (rt_idx >= s->refcount_table_size) {
        ret = grow_refcount_table(n, rt_idx);
        if (ret < 0)
            return ret;
        if (rt_idx < s->refcount_table_size &&
            (s->refcount_table[rt_idx] & RTE_OFFSET_MASK))
            return 1;
    }
    if (s->refcount_table[rt_idx] & RTE_OFFSET_MASK)
        return 0;
    /* Every cluster this block covers is free (refcount 0): the block
     * takes the first one and counts itself. */
    uint64_t off = (rt_idx << s->rb_bits) << s->cluster_bits;
    if (off >= (1ULL << 56))
        return -EFBIG;
    qc_file_ahead(n, off + s->cluster_size); /* before the write */
    void *block;
    ret = qc_cache_get(n, &s->rb_cache, off, true, &block);
    if (ret < 0)
        return ret;
    rb_set(s, block, 0, 1);
    ret = qc_check_overlap(n, 0, off, s->cluster_size);
    if (ret == 0)
        ret = bi_co_pwrite(n->file, off, block, s->cluster_size, 0);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0) {
        qc_cache_put(&s->rb_cache, block);
        qc_cache_discard(&s->rb_cache, off);
        return ret;
    }
    qc_cache_put(&s->rb_cache, block);
    s->refcount_table[rt_idx] = off;
    ret = write_reftable_entry(n, rt_idx);
    if (ret < 0) {
        s->refcount_table[rt_idx] = 0;
        qc_cache_discard(&s->rb_cache, off);
        return ret;
    }
    if (off + s->cluster_size > s->file_size)
        s->file_size = off + s->cluster_size;
    return 1;
}

int qc_update_refcount(bi_node *n, uint64_t offset, uint64_t len, int64_t delta)
{
    qcow2_state *s = n->opaque;
    if (len == 0)
        return 0;
    uint64_t first = offset >> s->cluster_bits;
    uint64_t last = (offset + len - 1) >> s->cluster_bits;
    uint64_t mask = (1ULL << s->rb_bits) - 1;
    int ret;

    for (uint64_t ci = first; ci <= last;) {
        uint64_t rt_idx = ci >> s->rb_bits;
        if (delta > 0) {
            ret = ensure_refblock(n, rt_idx);
            if (ret < 0)
                return ret;
        } else if (rt_idx >= s->refcount_table_size ||
                   !(s->refcount_table[rt_idx] & RTE_OFFSET_MASK)) {
            return qc_signal_corruption(
                n, "Freeing cluster %#" PRIx64 " without a refcount block",
                ci << s->cluster_bits);
        }
        void *block;
        ret = get_refblock(n, rt_idx, &block);
        if (ret < 0)
            return ret;
        uint64_t end = BI_MIN(last, ci | mask);
        for (; ci <= end; ci++) {
            uint64_t v = rb_get(s, block, ci & mask);
            if (delta > 0 && v + (uint64_t)delta > s->refcount_max) {
                qc_cache_put(&s->rb_cache, block);
                return -ERANGE;
            }
            if (delta < 0 && v < (uint64_t)-delta) {
                qc_cache_put(&s->rb_cache, block);
                return qc_signal_corruption(
                    n, "Refcount of cluster %#" PRIx64 " would drop below 0",
                    ci << s->cluster_bits);
            }
            v += (uint64_t)delta;
            rb_set(s, block, ci & mask, v);
            if (v == 0) {
                uint64_t coff = ci << s->cluster_bits;
                if (ci < s->free_cluster_index)
                    s->free_cluster_index = ci;
                if (s->free_byte_offset &&
                    qc_start_of_cluster(s, s->free_byte_offset) == coff)
                    s->free_byte_offset = 0;
                qc_cache_discard(&s->l2_cache, coff);
                if (coff != (s->refcount_table[rt_idx] & RTE_OFFSET_MASK))
                    qc_cache_discard(&s->rb_cache, coff);
            }
        }
        qc_cache_mark_dirty(&s->rb_cache, block);
        qc_cache_put(&s->rb_cache, block);
    }
    return 0;
}

/* The first run of len free clusters from the hint. */
static int find_free(bi_node *n, uint64_t len, uint64_t *start,
                     uint64_t *first_free_out)
{
    qcow2_state *s = n->opaque;
    uint64_t i = s->free_cluster_index, run = 0;
    uint64_t first_free = UINT64_MAX;
    uint64_t mask = (1ULL << s->rb_bits) - 1;
    int ret;
    while (run < len) {
        uint64_t ci = i + run;
        if ((ci << s->cluster_bits) >= (1ULL << 56) - s->cluster_size)
            return -EFBIG;
        uint64_t rt_idx = ci >> s->rb_bits;
        uint64_t blk_end = (ci | mask) + 1;
        if (rt_idx >= s->refcount_table_size ||
            !(s->refcount_table[rt_idx] & RTE_OFFSET_MASK)) {
            /* a whole missing block: all free */
            if (first_free == UINT64_MAX)
                first_free = ci;
            run += blk_end - ci;
            continue;
        }
        void *block;
        ret = get_refblock(n, rt_idx, &block);
        if (ret < 0)
            return ret;
        for (; ci < blk_end && run < len; ci++) {
            if (rb_get(s, block, ci & mask)) {
                i = ci + 1;
                run = 0;
                continue;
            }
            if (first_free == UINT64_MAX)
                first_free = ci;
            run++;
        }
        qc_cache_put(&s->rb_cache, block);
    }
    *start = i;
    *first_free_out = first_free;
    return 0;
}

/* Refcount blocks missing for clusters [a, a+len); *beyond: the highest
 * block index past the refcount table, or UINT64_MAX. */
static uint64_t count_missing(const qcow2_state *s, uint64_t a, uint64_t len,
                              uint64_t *beyond)
{
    uint64_t m = 0;
    *beyond = UINT64_MAX;
    for (uint64_t b = a >> s->rb_bits; b <= (a + len - 1) >> s->rb_bits; b++) {
        if (b >= s->refcount_table_size)
            *beyond = b;
        else if (!(s->refcount_table[b] & RTE_OFFSET_MASK))
            m++;
    }
    return m;
}

/*
 * Writes the table entries of k new refcount blocks (on disk already) in
 * an order where each block's own refcount is in a block the table on disk
 * already points to, or in the block itself: a crash between two entries
 * then leaves leaked clusters only, never a block in use whose refcount is
 * 0. (The blocks sit after the run they describe: the last of them usually
 * describe the others.)
 */
static int hook_up_blocks(bi_node *n, const uint64_t *made, uint64_t k)
{
    qcow2_state *s = n->opaque;
    bool *done = calloc(k, sizeof(bool));
    if (!done)
        return -ENOMEM;
    int ret = 0;
    for (uint64_t left = k; left && ret == 0;) {
        uint64_t before = left;
        for (uint64_t x = 0; x < k && ret == 0; x++) {
            if (done[x])
                continue;
            uint64_t d = (s->refcount_table[made[x]] >> s->cluster_bits) >>
                         s->rb_bits; /* the block describing block x */
            bool ready = d == made[x];
            if (!ready) {
                ready = true; /* a block from before, or one hooked up */
                for (uint64_t y = 0; y < k; y++)
                    if (made[y] == d && !done[y])
                        ready = false;
            }
            if (!ready)
                continue;
            ret = write_reftable_entry(n, made[x]);
            done[x] = true;
            left--;
        }
        if (left == before) /* cannot happen: blocks lie in index order */
            for (uint64_t x = 0; x < k && ret == 0; x++)
                if (!done[x]) {
                    ret = write_reftable_entry(n, made[x]);
                    done[x] = true;
                    left--;
                }
    }
    free(done);
    return ret;
}

int64_t qc_alloc_clusters(bi_node *n, uint64_t nb)
{
    qcow2_state *s = n->opaque;
    int ret;
    uint64_t i, first_free, m, mm, beyond;
    if (nb == 0)
        return -EINVAL;
restart:
    m = 0;
    for (;;) {
        ret = find_free(n, nb + m, &i, &first_free);
        if (ret < 0)
            return ret;
        mm = count_missing(s, i, nb + m, &beyond);
        if (beyond != UINT64_MAX) {
            ret = grow_refcount_table(n, beyond);
            if (ret < 0)
                return ret;
            goto restart;
        }
        if (mm <= m)
            break;
        m = mm;
    }
    if (mm) {
        /* as QEMU's allocator: the run first, the missing refcount
         * blocks right after it (QEMU finds the run, then places each
         * block it lacks at the next free cluster); they describe each
         * other and the run */
        uint64_t j = 0;
        /* the file reaches the new blocks before they are written */
        qc_file_ahead(n, (i + nb + mm) << s->cluster_bits);
        uint64_t *made = calloc(mm, sizeof(uint64_t));
        if (!made)
            return -ENOMEM;
        for (uint64_t b = i >> s->rb_bits;
             b <= (i + nb + mm - 1) >> s->rb_bits && j < mm; b++) {
            if (s->refcount_table[b] & RTE_OFFSET_MASK)
                continue;
            uint64_t off = (i + nb + j) << s->cluster_bits;
            void *block;
            ret = qc_check_overlap(n, 0, off, s->cluster_size);
            if (ret == 0)
                ret = qc_cache_get(n, &s->rb_cache, off, true, &block);
            if (ret < 0) {
                for (uint64_t k = 0; k < j; k++)
                    s->refcount_table[made[k]] = 0;
                free(made);
                return ret;
            }
            qc_cache_mark_dirty(&s->rb_cache, block);
            qc_cache_put(&s->rb_cache, block);
            s->refcount_table[b] = off;
            made[j++] = b;
        }
        ret = qc_update_refcount(n, i << s->cluster_bits,
                                 (mm + nb) << s->cluster_bits, 1);
        /* blocks on disk before the table points to them */
        if (ret == 0)
            ret = qc_cache_writeback(n, &s->rb_cache);
        if (ret == 0)
            ret = bi_co_flush(n->file);
        if (ret == 0)
            ret = hook_up_blocks(n, made, j);
        free(made);
        if (ret < 0)
            return ret;
        uint64_t end = (i + mm + nb) << s->cluster_bits;
        if (end > s->file_size)
            s->file_size = end;
        s->free_cluster_index = i + mm + nb;
        return (int64_t)(i << s->cluster_bits);
    }
    ret = qc_update_refcount(n, i << s->cluster_bits, nb << s->cluster_bits, 1);
    if (ret < 0)
        return ret;
    /* as QEMU's allocator: the search goes on after the run; free
     * clusters skipped below it wait until something is freed */
    s->free_cluster_index = i + nb;
    qc_file_ahead(n, (i + nb) << s->cluster_bits);
    return (int64_t)(i << s->cluster_bits);
}

/*
 * With O_DIRECT, a write past the end of the file or into a hole changes
 * the file's block map, and filesystems serialise such writes (ext4 takes
 * the inode lock exclusively for them): allocating writes in flight then
 * run one at a time. Writes into allocated (unwritten) extents inside the
 * file run in parallel. So, as QEMU's preallocate filter does, the file is
 * grown ahead of the clusters handed out, in steps (an eighth of the file,
 * 4 to 64 MiB), with a zero-range fallocate that reads as zeroes; close
 * cuts it back to the last byte in use. Where the filesystem cannot
 * allocate fast (or the node is a block device), nothing is done.
 * Callers come here BEFORE they write past the end: the new range is
 * zeroed, so it must not hold anything yet.
 */
void qc_file_ahead(bi_node *n, uint64_t end)
{
    qcow2_state *s = n->opaque;
    const uint64_t MiB = 1024 * 1024;
    if (!s->ahead_on || end <= s->ahead_end)
        return;
    uint64_t step = BI_MIN(BI_MAX(end / 8, 4 * MiB), 64 * MiB);
    /* never over anything written: callers come here before they write
     * past the end, and the file may have grown by other means */
    uint64_t from = bi_align_up(BI_MAX(s->ahead_end, n->file->size), MiB);
    uint64_t to = bi_align_up(end + step, MiB);
    int ret = bi_co_pwrite_zeroes(n->file, from, to - from, BI_REQ_NO_FALLBACK);
    if (ret < 0) {
        s->ahead_on = false; /* the writes extend the file themselves */
        return;
    }
    s->ahead_end = to;
}

void qc_file_ahead_trim(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (s->ahead_end <= s->ahead_open_len)
        return;
    int64_t last = qc_last_cluster(n, s->ahead_end);
    if (last < 0)
        return;
    uint64_t end = ((uint64_t)last + 1) << s->cluster_bits;
    /* compressed data ends inside its cluster (written up to the file's
     * request alignment) */
    if (s->free_byte_offset &&
        qc_start_of_cluster(s, s->free_byte_offset) == end - s->cluster_size)
        end = BI_MIN(end, bi_align_up(s->free_byte_offset,
                                      n->file->limits.request_alignment));
    end = BI_MAX(end, s->ahead_open_len);
    bi_error e;
    bi_error_init(&e);
    /* a failure leaves the file longer than needed, nothing else */
    if (end < s->ahead_end &&
        bi_truncate(n->file, end, false, BI_PREALLOC_OFF, &e) == 0) {
        s->ahead_end = end;
        s->ahead_open_len = end;
    }
}

int64_t qc_alloc_bytes(bi_node *n, uint64_t size)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    int ret;
    if (s->free_byte_offset) {
        uint64_t in = qc_offset_into_cluster(s, s->free_byte_offset);
        if (in && size <= cs - in) {
            uint64_t off = s->free_byte_offset;
            ret = qc_update_refcount(n, off, 1, 1);
            if (ret < 0)
                return ret;
            s->free_byte_offset = (in + size == cs) ? 0 : off + size;
            return (int64_t)off;
        }
        if (in) {
            /* spill over into the clusters right after, if they are free,
             * so that compressed data stays packed */
            uint64_t off = s->free_byte_offset;
            uint64_t next = qc_start_of_cluster(s, off) + cs;
            uint64_t k = (in + size + cs - 1) / cs - 1;
            bool ok = true;
            for (uint64_t j = 0; j < k && ok; j++) {
                uint64_t ci = (next >> s->cluster_bits) + j;
                uint64_t rt = ci >> s->rb_bits, rc;
                if (rt >= s->refcount_table_size ||
                    !(s->refcount_table[rt] & RTE_OFFSET_MASK) ||
                    qc_get_refcount(n, ci, &rc) < 0 || rc)
                    ok = false;
            }
            if (ok && qc_check_overlap(n, 0, next, k * cs) == 0) {
                ret = qc_update_refcount(n, off, 1, 1);
                if (ret == 0)
                    ret = qc_update_refcount(n, next, k * cs, 1);
                if (ret < 0)
                    return ret;
                if (s->free_cluster_index >= (next >> s->cluster_bits) &&
                    s->free_cluster_index < (next >> s->cluster_bits) + k)
                    s->free_cluster_index = (next >> s->cluster_bits) + k;
                uint64_t end = off + size;
                s->free_byte_offset = (end & (cs - 1)) ? end : 0;
                return (int64_t)off;
            }
        }
    }
    int64_t off = qc_alloc_clusters(n, (size + cs - 1) / cs);
    if (off < 0)
        return off;
    uint64_t end = (uint64_t)off + size;
    s->free_byte_offset = (end & (cs - 1)) ? end : 0;
    return off;
}

void qc_defer_free(bi_node *n, uint64_t offset, uint64_t len)
{
    qcow2_state *s = n->opaque;
    if (s->n_pending_free == s->pending_free_alloc) {
        int na = s->pending_free_alloc ? s->pending_free_alloc * 2 : 64;
        struct qcow2_free_range *p =
            realloc(s->pending_free, sizeof(*p) * (size_t)na);
        if (!p)
            return; /* leak rather than fail: allowed */
        s->pending_free = p;
        s->pending_free_alloc = na;
    }
    struct qcow2_free_range *last =
        s->n_pending_free ? &s->pending_free[s->n_pending_free - 1] : NULL;
    s->pending_free_bytes += len;
    if (last && last->offset + last->len == offset &&
        !(offset & (s->cluster_size - 1)) && !(len & (s->cluster_size - 1))) {
        last->len += len;
        return;
    }
    s->pending_free[s->n_pending_free].offset = offset;
    s->pending_free[s->n_pending_free].len = len;
    s->n_pending_free++;
}

int qc_reclaim_freed(bi_node *n, uint64_t nb)
{
    qcow2_state *s = n->opaque;
    if (!s->n_pending_free || s->pending_free_bytes < QC_RECLAIM_MIN ||
        s->pending_free_bytes < (nb << s->cluster_bits))
        return 0;
    return qc_flush_metadata(n);
}

void qc_free_l2_entry_clusters(bi_node *n, uint64_t entry)
{
    qcow2_state *s = n->opaque;
    if (entry & QCOW_OFLAG_COMPRESSED) {
        uint64_t coff = entry & s->cluster_offset_mask;
        uint64_t nsec = ((entry >> s->csize_shift) & s->csize_mask) + 1;
        qc_defer_free(n, coff & ~511ULL, nsec * 512);
        return;
    }
    if (qc_has_data_file(s))
        return; /* data file clusters are not refcounted */
    uint64_t host = entry & L2E_OFFSET_MASK;
    if (host)
        qc_defer_free(n, host, s->cluster_size);
}

int qc_apply_pending_frees(bi_node *n)
{
    qcow2_state *s = n->opaque;
    int result = 0;
    for (int i = 0; i < s->n_pending_free; i++) {
        int ret = qc_update_refcount(n, s->pending_free[i].offset,
                                     s->pending_free[i].len, -1);
        if (ret < 0 && result == 0)
            result = ret;
    }
    s->n_pending_free = 0;
    s->pending_free_bytes = 0;
    return result;
}

int qc_flush_metadata(bi_node *n)
{
    qcow2_state *s = n->opaque;
    int ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret < 0)
        return ret;
    ret = qc_cache_writeback(n, &s->l2_cache);
    if (ret < 0)
        return ret;
    if (s->n_pending_free) {
        /* the L2 tables without the old references are on disk first */
        ret = bi_co_flush(n->file);
        if (ret < 0)
            return ret;
        ret = qc_apply_pending_frees(n);
        if (ret < 0)
            return ret;
        ret = qc_cache_writeback(n, &s->rb_cache);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return alen && blen && a < b + blen && b < a + alen;
}

int qc_check_overlap(bi_node *n, int ign, uint64_t offset, uint64_t len)
{
    qcow2_state *s = n->opaque;
    const char *what = NULL;
    uint64_t cs = s->cluster_size;
    /* metadata is cluster granular: compare whole clusters */
    uint64_t a = qc_start_of_cluster(s, offset);
    uint64_t alen = bi_align_up(offset + len, cs) - a;

    if (!(ign & QC_OL_HEADER) && overlaps(a, alen, 0, cs))
        what = "qcow2_header";
    else if (!(ign & QC_OL_L1) &&
             overlaps(a, alen, s->l1_table_offset, (uint64_t)s->l1_size * 8))
        what = "active L1 table";
    else if (!(ign & QC_OL_REFTABLE) &&
             overlaps(a, alen, s->refcount_table_offset,
                      (uint64_t)s->refcount_table_clusters * cs))
        what = "refcount table";
    else if (!(ign & QC_OL_SNAPTABLE) &&
             overlaps(a, alen, s->snapshots_offset, s->snapshots_size))
        what = "snapshot table";
    if (!what && !(ign & QC_OL_SNAP_L1)) {
        for (uint32_t i = 0; i < s->nb_snapshots && s->snapshots; i++)
            if (overlaps(a, alen, s->snapshots[i].l1_table_offset,
                         (uint64_t)s->snapshots[i].l1_size * 8))
                what = "inactive L1 table";
    }
    if (!what && !(ign & QC_OL_L2) && s->l1_size <= (1u << 18)) {
        for (uint32_t i = 0; i < s->l1_size; i++) {
            uint64_t l2 = s->l1_table[i] & L1E_OFFSET_MASK;
            if (l2 && overlaps(a, alen, l2, cs)) {
                what = "active L2 table";
                break;
            }
        }
    }
    if (!what && !(ign & QC_OL_REFBLOCK) &&
        s->refcount_table_size <= (1u << 18)) {
        for (uint64_t i = 0; i < s->refcount_table_size; i++) {
            uint64_t rb = s->refcount_table[i] & RTE_OFFSET_MASK;
            if (rb && overlaps(a, alen, rb, cs)) {
                what = "refcount block";
                break;
            }
        }
    }
    if (!what)
        return 0;
    return qc_signal_corruption(
        n, "Preventing invalid write on metadata (overlaps with %s)", what);
}
