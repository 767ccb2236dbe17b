/* SPDX-License-Identifier: MIT */
/*
 * qcow2 preallocation when an image grows (resize --preallocation), laid
 * out as QEMU 7.2 does it:
 *
 *  metadata: the new range is mapped cluster by cluster through the
 *    ordinary allocator (an L2 table when a new one is needed, then the
 *    data clusters of that table as one run); the data clusters are not
 *    written, the file is only extended up to the end of the last one.
 *  falloc / full: the refcount structures are rebuilt at the end of the
 *    file so that they cover every new cluster (new refcount blocks, then
 *    a new refcount table, the old table freed), the data clusters follow
 *    as one run, the file grows over them with the protocol's
 *    preallocation and the L2 entries are linked last.
 *
 * The partial cluster holding the old end is remapped too (falloc/full
 * always, metadata when it is not allocated for the active table alone):
 * its bytes below the old end are written to the new host cluster before
 * the L2 entry points to it, so that a crash never shows other contents.
 * With an external data file the host offset is the guest offset and only
 * the data file is preallocated.
 */
#include "qcow2.h"
#include "util/util.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t qc_rc_get(uint32_t order, const void *block, uint64_t i)
{
    const uint8_t *p = block;
    if (order < 3) {
        uint64_t bit = i << order;
        return (p[bit / 8] >> (bit % 8)) & ((1u << (1u << order)) - 1);
    }
    uint64_t v = 0;
    unsigned bytes = 1u << (order - 3);
    for (unsigned k = 0; k < bytes; k++)
        v = (v << 8) | p[i * bytes + k];
    return v;
}

void qc_rc_set(uint32_t order, void *block, uint64_t i, uint64_t v)
{
    uint8_t *p = block;
    if (order < 3) {
        uint64_t bit = i << order;
        unsigned mask = ((1u << (1u << order)) - 1) << (bit % 8);
        p[bit / 8] = (uint8_t)((p[bit / 8] & ~mask) |
                               (((unsigned)v << (bit % 8)) & mask));
        return;
    }
    unsigned bytes = 1u << (order - 3);
    for (unsigned k = bytes; k-- > 0;) {
        p[i * bytes + k] = (uint8_t)v;
        v >>= 8;
    }
}

uint64_t qc_refblocks_needed(uint64_t clusters, uint64_t cs, uint32_t order,
                             bool generous)
{
    uint64_t per_table = cs / 8;
    uint64_t per_block = cs * 8 >> order;
    uint64_t table = 0, blocks = 0, n = 0, last;
    /* the fixed point where the refcount structures count themselves */
    do {
        last = n;
        blocks = (clusters + table + blocks + per_block - 1) / per_block;
        table = (blocks + per_table - 1) / per_table;
        n = clusters + blocks + table;
        if (n == last && generous) {
            clusters += (table + 1) / 2;
            n = 0;
            generous = false;
        }
    } while (n != last);
    return blocks;
}

int64_t qc_last_cluster(bi_node *n, uint64_t file_len)
{
    qcow2_state *s = n->opaque;
    for (uint64_t i = qc_size_to_clusters(s, file_len); i-- > 0;) {
        uint64_t rc;
        int ret = qc_get_refcount(n, i, &rc);
        if (ret < 0)
            return ret;
        if (rc)
            return (int64_t)i;
    }
    return qc_signal_corruption(
        n, "There are no references in the refcount table.");
}

int64_t qc_refcount_area(bi_node *n, uint64_t start, uint64_t additional)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t per_block = 1ULL << s->rb_bits;
    int ret;

    uint64_t total_blocks = qc_refblocks_needed(
        (start >> s->cluster_bits) + additional, cs, s->refcount_order, false);
    uint64_t table_size = bi_align_up(total_blocks, cs / 8);
    uint64_t table_clusters = table_size * 8 / cs;
    if (table_size * 8 > QCOW2_MAX_REFTABLE_BYTES)
        return -EFBIG;
    uint64_t area_idx = (start >> s->cluster_bits) / per_block;
    uint64_t *nt = calloc(table_size, 8);
    if (!nt)
        return -ENOMEM;
    memcpy(nt, s->refcount_table,
           BI_MIN(table_size, s->refcount_table_size) * 8);

    uint64_t add_blocks = 0;
    for (uint64_t i = area_idx; i < total_blocks; i++)
        add_blocks += !(nt[i] & RTE_OFFSET_MASK);
    uint64_t table_off = start + add_blocks * cs;
    uint64_t end = table_off + table_clusters * cs;

    /* the refcount blocks: new ones in front, every structure counted */
    uint64_t block_off = start;
    for (uint64_t i = area_idx; i < total_blocks; i++) {
        void *blk;
        if (nt[i] & RTE_OFFSET_MASK) {
            ret = qc_cache_get(n, &s->rb_cache, nt[i] & RTE_OFFSET_MASK, false,
                               &blk);
        } else {
            qc_cache_discard(&s->rb_cache, block_off);
            ret = qc_cache_get(n, &s->rb_cache, block_off, true, &blk);
            if (ret == 0) {
                memset(blk, 0, cs);
                nt[i] = block_off;
                block_off += cs;
            }
        }
        if (ret < 0)
            goto fail;
        uint64_t first = (i * per_block) << s->cluster_bits;
        if (first < end) {
            uint64_t j = first < start ? (start - first) >> s->cluster_bits : 0;
            uint64_t j_end =
                BI_MIN((end - first) >> s->cluster_bits, per_block);
            for (; j < j_end; j++)
                qc_rc_set(s->refcount_order, blk, j, 1);
        }
        qc_cache_mark_dirty(&s->rb_cache, blk);
        qc_cache_put(&s->rb_cache, blk);
    }
    if (end > s->file_size)
        s->file_size = end;
    ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        goto fail;

    /* the new table, then the header points to it */
    uint64_t *be = calloc(table_size, 8);
    if (!be) {
        ret = -ENOMEM;
        goto fail;
    }
    for (uint64_t i = 0; i < table_size; i++)
        be[i] = htobe64(nt[i]);
    ret = qc_check_overlap(n, 0, table_off, table_size * 8);
    if (ret == 0)
        ret = bi_co_pwrite(n->file, table_off, be, table_size * 8, 0);
    free(be);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        goto fail;
    uint8_t h[12];
    uint64_t o64 = htobe64(table_off);
    uint32_t c32 = htobe32((uint32_t)table_clusters);
    memcpy(h, &o64, 8);
    memcpy(h + 8, &c32, 4);
    ret = qc_write_header_field(n, QH_RT_OFFSET, h, 12);
    if (ret < 0)
        goto fail;
    uint64_t old_off = s->refcount_table_offset;
    uint64_t old_clusters = s->refcount_table_clusters;
    free(s->refcount_table);
    s->refcount_table = nt;
    s->refcount_table_size = table_size;
    s->refcount_table_offset = table_off;
    s->refcount_table_clusters = (uint32_t)table_clusters;
    ret = qc_update_refcount(n, old_off, old_clusters * cs, -1);
    if (ret < 0)
        return ret;
    return (int64_t)end;
fail:
    /* blocks not yet in the table on disk are only leaked */
    free(nt);
    return ret;
}

/* Points guest cluster gc (in table at idx) to host (cluster aligned). */
static void link_entry(bi_node *n, void *table, uint64_t idx, uint64_t host,
                       bool all_sc)
{
    qcow2_state *s = n->opaque;
    uint64_t e, b;
    qc_get_l2(s, table, idx, &e, &b);
    if ((e & QCOW_OFLAG_COMPRESSED) || (e & L2E_OFFSET_MASK))
        qc_free_l2_entry_clusters(n, e);
    /* falloc/full: every subcluster is data; metadata: none yet */
    b = all_sc ? 0xffffffffULL : 0;
    qc_set_l2(s, table, idx, host | QCOW_OFLAG_COPIED, b);
    qc_cache_mark_dirty(&s->l2_cache, table);
}

/* Does the entry need a new host cluster (QEMU: not normal + copied)? */
static bool needs_alloc(const qcow2_state *s, uint64_t e)
{
    if (e & QCOW_OFLAG_COMPRESSED)
        return true;
    if (!(e & L2E_OFFSET_MASK))
        return true;
    if (!s->ext_l2 && (e & QCOW_OFLAG_ZERO))
        return true;
    return !(e & QCOW_OFLAG_COPIED) && !qc_has_data_file(s);
}

/* Head bytes of the old partial cluster to carry over (len 0: none). */
struct prealloc_head {
    const void *buf;
    uint64_t len;
};

static int put_head(bi_node *n, const struct prealloc_head *h, uint64_t host)
{
    if (!h->len)
        return 0;
    bi_node *f = qc_data_node(n);
    int ret =
        qc_has_data_file(n->opaque) ? 0 : qc_check_overlap(n, 0, host, h->len);
    if (ret == 0)
        ret = bi_co_pwrite(f, host, h->buf, h->len, 0);
    return ret;
}

/* Extended L2: the subclusters holding a carried-over head are data. */
static void head_allocated(const qcow2_state *s, void *table, uint64_t idx,
                           const struct prealloc_head *h)
{
    if (!h->len || !s->ext_l2)
        return;
    uint64_t e, b;
    uint64_t nsc = (h->len + s->subcluster_size - 1) / s->subcluster_size;
    uint64_t m = nsc >= 32 ? 0xffffffffULL : (1ULL << nsc) - 1;
    qc_get_l2(s, table, idx, &e, &b);
    b = (b | m) & ~(m << 32);
    qc_set_l2(s, table, idx, e, b);
}

/* QEMU copies on write the rest of a new partial last cluster: zeroes
 * (with extended L2 entries the rest of the last subcluster only). */
static int put_tail(bi_node *n, uint64_t new_len, uint64_t host)
{
    qcow2_state *s = n->opaque;
    uint64_t in = qc_offset_into_cluster(s, new_len);
    uint64_t unit = s->ext_l2 ? s->subcluster_size : s->cluster_size;
    uint64_t len = bi_align_up(in, unit) - in;
    if (!in || !len)
        return 0;
    void *z = bi_blockalign(n->file, bi_align_up(len, 4096));
    if (!z)
        return -ENOMEM;
    memset(z, 0, len);
    int ret = qc_has_data_file(s) ? 0 : qc_check_overlap(n, 0, host + in, len);
    if (ret == 0)
        ret = bi_co_pwrite(qc_data_node(n), host + in, z, len, 0);
    bi_free_aligned(z);
    return ret;
}

static int prealloc_metadata(bi_node *n, uint64_t old_len, uint64_t new_len,
                             enum bi_prealloc mode,
                             const struct prealloc_head *head, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t first = old_len >> s->cluster_bits;
    uint64_t end_c = qc_size_to_clusters(s, new_len);
    uint64_t last_host = 0;
    bool ext = qc_has_data_file(s);
    int ret = 0;

    for (uint64_t c = first; c < end_c && ret == 0;) {
        void *t;
        uint64_t idx;
        ret = qc_get_l2_table(n, c << s->cluster_bits, true, &t, &idx);
        if (ret < 0) {
            bi_error_set(err, -ret, "Allocating clusters failed");
            return ret;
        }
        uint64_t cnt = BI_MIN(s->l2_entries - idx, end_c - c);
        for (uint64_t j = 0; j < cnt && ret == 0;) {
            uint64_t e, b;
            qc_get_l2(s, t, idx + j, &e, &b);
            if (!needs_alloc(s, e)) {
                last_host = e & L2E_OFFSET_MASK;
                j++;
                continue;
            }
            uint64_t k = j + 1;
            while (k < cnt) {
                qc_get_l2(s, t, idx + k, &e, &b);
                if (!needs_alloc(s, e))
                    break;
                k++;
            }
            int64_t host;
            if (ext) {
                host = (int64_t)((c + j) << s->cluster_bits);
            } else {
                host = qc_alloc_clusters(n, k - j);
                if (host < 0) {
                    ret = (int)host;
                    break;
                }
                /* as QEMU's allocator: the search goes on after the run,
                 * holes too small for it stay behind */
                s->free_cluster_index =
                    ((uint64_t)host >> s->cluster_bits) + (k - j);
            }
            if (c + j == first)
                ret = put_head(n, head, (uint64_t)host);
            if (ret == 0 && c + k == end_c)
                ret =
                    put_tail(n, new_len,
                             (uint64_t)host + ((k - j - 1) << s->cluster_bits));
            for (uint64_t x = j; x < k && ret == 0; x++)
                link_entry(n, t, idx + x,
                           (uint64_t)host + ((x - j) << s->cluster_bits),
                           false);
            if (ret == 0 && c + j == first)
                head_allocated(s, t, idx + j, head);
            last_host = (uint64_t)host + ((k - j - 1) << s->cluster_bits);
            j = k;
        }
        qc_cache_put(&s->l2_cache, t);
        c += cnt;
    }
    if (ret < 0) {
        bi_error_set(err, -ret, "Mapping clusters failed");
        return ret;
    }
    ret = qc_flush_metadata(n);
    if (ret < 0) {
        bi_error_set(err, -ret, "Mapping clusters failed");
        return ret;
    }
    /* the file holds every mapped cluster up to the new end */
    bi_node *f = qc_data_node(n);
    uint64_t want = last_host + ((new_len - 1) & (cs - 1)) + 1;
    int64_t flen = bi_getlength(f);
    if (flen < 0) {
        bi_error_set(err, (int)-flen, "Could not get file size");
        return (int)flen;
    }
    if (want > (uint64_t)flen) {
        enum bi_prealloc pm =
            mode == BI_PREALLOC_METADATA ? BI_PREALLOC_OFF : mode;
        ret = bi_truncate(f, want, false, pm, err);
        if (ret < 0)
            return ret;
        if (!ext && want > s->file_size)
            s->file_size = want;
    }
    return 0;
}

static int prealloc_data(bi_node *n, uint64_t old_len, uint64_t new_len,
                         enum bi_prealloc mode,
                         const struct prealloc_head *head, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    int ret;

    int64_t flen = bi_getlength(n->file);
    if (flen < 0) {
        bi_error_set(err, (int)-flen, "Failed to inquire current file length");
        return (int)flen;
    }
    int64_t last = qc_last_cluster(n, (uint64_t)flen);
    if (last < 0) {
        bi_error_set(err, (int)-last, "Failed to inquire current file length");
        return (int)last;
    }
    uint64_t old_file = ((uint64_t)last + 1) << s->cluster_bits;
    uint64_t first = old_len >> s->cluster_bits;
    uint64_t nb_data = qc_size_to_clusters(s, new_len) - first;
    uint64_t nb_l2 = (nb_data + s->l2_entries - 1) / s->l2_entries + 1;
    if (!nb_data)
        return 0;

    int64_t start = qc_refcount_area(n, old_file, nb_data + nb_l2);
    if (start < 0) {
        bi_error_set(err, (int)-start, "Failed to resize refcount structures");
        return (int)start;
    }
    ret = qc_update_refcount(n, (uint64_t)start, nb_data * cs, 1);
    if (ret == 0)
        ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to allocate data clusters");
        return ret;
    }
    uint64_t new_file = (uint64_t)start + nb_data * cs;
    ret = bi_truncate(n->file, new_file, false, mode, err);
    if (ret < 0) {
        bi_error_prefix(err, "Failed to resize underlying file");
        qc_update_refcount(n, (uint64_t)start, nb_data * cs, -1);
        return ret;
    }
    if (new_file > s->file_size)
        s->file_size = new_file;
    ret = put_head(n, head, (uint64_t)start);
    if (ret == 0 && head->len)
        ret = bi_co_flush(n->file);

    /* extended L2: the subclusters are marked allocated only when a
     * backing file would show through them (QEMU's zero-write request);
     * otherwise they stay unallocated and read as zeroes anyway */
    bool all_sc = n->backing && bi_getlength(n->backing) > (int64_t)old_len;
    uint64_t host = (uint64_t)start;
    for (uint64_t c = first; ret == 0 && c < first + nb_data;) {
        void *t;
        uint64_t idx;
        ret = qc_get_l2_table(n, c << s->cluster_bits, true, &t, &idx);
        if (ret < 0)
            break;
        uint64_t cnt = BI_MIN(s->l2_entries - idx, first + nb_data - c);
        for (uint64_t j = 0; j < cnt; j++)
            link_entry(n, t, idx + j, host + (j << s->cluster_bits), all_sc);
        if (c == first)
            head_allocated(s, t, idx, head);
        qc_cache_put(&s->l2_cache, t);
        c += cnt;
        host += cnt << s->cluster_bits;
    }
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to update L2 tables");
        return ret;
    }
    return 0;
}

int qc_preallocate_locked(bi_node *n, uint64_t old_len, uint64_t new_len,
                          enum bi_prealloc mode, const void *head,
                          uint64_t head_len, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct prealloc_head h = {head, head_len};
    if (new_len <= old_len)
        return 0;
    if (mode == BI_PREALLOC_METADATA || qc_has_data_file(s))
        return prealloc_metadata(n, old_len, new_len, mode, &h, err);
    return prealloc_data(n, old_len, new_len, mode, &h, err);
}
