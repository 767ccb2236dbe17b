/* SPDX-License-Identifier: MIT */
/*
 * Changing the refcount width of a qcow2 image (amend refcount_bits=N), in
 * QEMU's order so that a crash at any point leaves a usable image:
 *
 *  1. walks over the old refcount table: every new refcount block that
 *     will hold a non-zero refcount gets a cluster (allocated through the
 *     old structures), then the new refcount table gets clusters; repeated
 *     until a walk allocates nothing (the allocations change refcounts);
 *  2. a last walk fills the new blocks from the old refcounts and writes
 *     them, then the new table is written: nothing references them yet;
 *  3. one header write switches order, table offset and table size;
 *  4. the old blocks and table are freed through the new structures.
 *
 * Until 3 the image is the old one with a few leaked clusters; after it,
 * the new one with the old structures leaked.
 */
#include "qcow2.h"
#include "util/util.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct reorder {
    bi_node *n;
    uint32_t order;      /* new refcount order */
    uint64_t per_block;  /* new refcount entries per block */
    uint64_t *table;     /* new reftable (host endian) */
    uint64_t table_size; /* entries */
    uint64_t index;      /* new reftable index being filled */
    void *block;         /* write walk: the new block being filled */
    bool allocated;      /* the walk allocated something */
    qc_reorder_status_cb *cb;
    void *opaque;
    bi_error *err;
};

/* A new block is complete: allocate (alloc walk) or write (write walk). */
static int finish_block(struct reorder *r, bool empty, bool write)
{
    qcow2_state *s = r->n->opaque;
    uint64_t cs = s->cluster_size;
    if (!write) {
        if (!empty && r->index >= r->table_size) {
            uint64_t ns = bi_align_up(r->index + 1, cs / 8);
            if (ns * 8 > QCOW2_MAX_REFTABLE_BYTES) {
                bi_error_set(r->err, 0,
                             "This operation would make the refcount table "
                             "grow beyond the maximum size supported by "
                             "QEMU, aborting");
                return -ENOTSUP;
            }
            uint64_t *nt = realloc(r->table, ns * 8);
            if (!nt) {
                bi_error_set(r->err, ENOMEM,
                             "Failed to increase reftable buffer size");
                return -ENOMEM;
            }
            memset(nt + r->table_size, 0, (ns - r->table_size) * 8);
            r->table = nt;
            r->table_size = ns;
        }
        if (!empty && !r->table[r->index]) {
            int64_t off = qc_alloc_clusters(r->n, 1);
            if (off < 0) {
                bi_error_set(r->err, (int)-off, "Failed to allocate refblock");
                return (int)off;
            }
            r->table[r->index] = (uint64_t)off;
            r->allocated = true;
        }
        return 0;
    }
    if (r->index < r->table_size && r->table[r->index]) {
        uint64_t off = r->table[r->index];
        int ret = qc_check_overlap(r->n, 0, off, cs);
        if (ret < 0) {
            bi_error_set(r->err, -ret, "Overlap check failed");
            return ret;
        }
        ret = bi_co_pwrite(r->n->file, off, r->block, cs, 0);
        if (ret < 0) {
            bi_error_set(r->err, -ret, "Failed to write refblock");
            return ret;
        }
    } else if (!empty) {
        bi_error_set(r->err, EIO, "Refblock missing for the new width");
        return -EIO;
    }
    return 0;
}

/* One walk over every old refcount (QEMU's walk_over_reftable). */
static int walk(struct reorder *r, bool write, int walk_index, int walks)
{
    qcow2_state *s = r->n->opaque;
    uint64_t old_per_block = 1ULL << s->rb_bits;
    uint64_t new_bits = 1ULL << r->order;
    uint64_t bi = 0; /* index in the new block */
    bool empty = true;
    int ret;

    r->index = 0;
    if (write)
        memset(r->block, 0, s->cluster_size);
    for (uint64_t ti = 0; ti < s->refcount_table_size; ti++) {
        uint64_t off = s->refcount_table[ti] & RTE_OFFSET_MASK;
        if (r->cb)
            r->cb(r->opaque,
                  (int64_t)((uint64_t)walk_index * s->refcount_table_size + ti),
                  (int64_t)((uint64_t)walks * s->refcount_table_size));
        void *old = NULL;
        if (off) {
            if (qc_offset_into_cluster(s, off)) {
                qc_signal_corruption(r->n,
                                     "Refblock offset %#" PRIx64
                                     " unaligned (reftable index: %#" PRIx64
                                     ")",
                                     off, ti);
                bi_error_set(r->err, 0,
                             "Image is corrupt (unaligned refblock offset)");
                return -EIO;
            }
            ret = qc_cache_get(r->n, &s->rb_cache, off, false, &old);
            if (ret < 0) {
                bi_error_set(r->err, -ret, "Failed to retrieve refblock");
                return ret;
            }
        }
        for (uint64_t j = 0; j < old_per_block; j++) {
            if (bi >= r->per_block) {
                ret = finish_block(r, empty, write);
                if (ret < 0) {
                    if (old)
                        qc_cache_put(&s->rb_cache, old);
                    return ret;
                }
                r->index++;
                bi = 0;
                empty = true;
                if (write)
                    memset(r->block, 0, s->cluster_size);
            }
            uint64_t rc = old ? qc_rc_get(s->refcount_order, old, j) : 0;
            if (new_bits < 64 && (rc >> new_bits)) {
                if (old)
                    qc_cache_put(&s->rb_cache, old);
                uint64_t coff = ((ti << s->rb_bits) + j) << s->cluster_bits;
                bi_error_set(r->err, 0,
                             "Cannot decrease refcount entry width to %u "
                             "bits: Cluster at offset %#" PRIx64
                             " has a refcount of %" PRIu64,
                             (unsigned)new_bits, coff, rc);
                return -EINVAL;
            }
            if (write && rc)
                qc_rc_set(r->order, r->block, bi, rc);
            bi++;
            empty = empty && rc == 0;
        }
        if (old)
            qc_cache_put(&s->rb_cache, old);
    }
    if (bi > 0) {
        ret = finish_block(r, empty, write);
        if (ret < 0)
            return ret;
        r->index++;
    }
    if (r->cb)
        r->cb(r->opaque,
              (int64_t)((uint64_t)(walk_index + 1) * s->refcount_table_size),
              (int64_t)((uint64_t)walks * s->refcount_table_size));
    return 0;
}

/* Frees the clusters of a (new or old) set of structures. */
static void free_structures(bi_node *n, const uint64_t *table, uint64_t size,
                            uint64_t table_off, uint64_t table_bytes)
{
    qcow2_state *s = n->opaque;
    for (uint64_t i = 0; table && i < size; i++) {
        uint64_t off = table[i] & RTE_OFFSET_MASK;
        if (off)
            qc_update_refcount(n, off, s->cluster_size, -1);
    }
    if (table_off && table_bytes)
        qc_update_refcount(n, table_off, table_bytes, -1);
}

int qc_change_refcount_order(bi_node *n, uint32_t order,
                             qc_reorder_status_cb *cb, void *opaque,
                             bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    struct reorder r = {
        .n = n,
        .order = order,
        .per_block = (cs * 8) >> order,
        .cb = cb,
        .opaque = opaque,
        .err = err,
    };
    uint64_t table_off = 0, table_alloc = 0; /* entries allocated on disk */
    int walk_index = 0;
    int ret;

    /* 1: allocate until a walk finds everything in place */
    do {
        int walks = BI_MAX(walk_index + 2, 3);
        r.allocated = false;
        ret = walk(&r, false, walk_index++, walks);
        if (ret < 0)
            goto fail;
        if (r.allocated) {
            if (table_off)
                qc_update_refcount(n, table_off, table_alloc * 8, -1);
            table_off = 0;
            int64_t off =
                qc_alloc_clusters(n, (r.table_size * 8 + cs - 1) / cs);
            if (off < 0) {
                ret = (int)off;
                bi_error_set(err, -ret, "Failed to allocate the new reftable");
                goto fail;
            }
            table_off = (uint64_t)off;
            table_alloc = r.table_size;
        }
    } while (r.allocated);

    /* 2: the new blocks and the new table */
    r.block = bi_blockalign(n->file, cs);
    if (!r.block) {
        ret = -ENOMEM;
        bi_error_set(err, ENOMEM, "Failed to allocate a refblock buffer");
        goto fail;
    }
    ret = walk(&r, true, walk_index, walk_index + 1);
    if (ret < 0)
        goto fail;
    uint64_t *be = calloc(r.table_size ? r.table_size : 1, 8);
    if (!be) {
        ret = -ENOMEM;
        goto fail;
    }
    for (uint64_t i = 0; i < r.table_size; i++)
        be[i] = htobe64(r.table[i]);
    ret = qc_check_overlap(n, 0, table_off, r.table_size * 8);
    if (ret < 0) {
        free(be);
        bi_error_set(err, -ret, "Overlap check failed");
        goto fail;
    }
    ret = bi_co_pwrite(n->file, table_off, be, r.table_size * 8, 0);
    free(be);
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to write the new reftable");
        goto fail;
    }
    ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to flush the refblock cache");
        goto fail;
    }

    /* 3: one header write (first sector) switches everything */
    uint8_t h[QH_V3_MIN_LENGTH];
    ret = bi_co_pread(n->file, 0, h, sizeof(h));
    if (ret == 0) {
        uint64_t o64 = htobe64(table_off);
        uint32_t c32 = htobe32((uint32_t)(r.table_size * 8 / cs));
        uint32_t ord = htobe32(order);
        memcpy(h + QH_RT_OFFSET, &o64, 8);
        memcpy(h + QH_RT_CLUSTERS, &c32, 4);
        memcpy(h + QH_REFCOUNT_ORDER, &ord, 4);
        ret = bi_co_pwrite(n->file, QH_RT_OFFSET, h + QH_RT_OFFSET,
                           QH_HEADER_LENGTH - QH_RT_OFFSET, 0);
        if (ret == 0)
            ret = bi_co_flush(n->file);
    }
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to update the qcow2 header");
        goto fail;
    }

    /* 4: the new structures in memory, the old ones freed through them */
    uint64_t *old_table = s->refcount_table;
    uint64_t old_size = s->refcount_table_size;
    uint64_t old_off = s->refcount_table_offset;
    uint64_t old_bytes = (uint64_t)s->refcount_table_clusters * cs;
    qc_cache_drop_all(&s->rb_cache);
    s->refcount_table = r.table;
    s->refcount_table_size = r.table_size;
    s->refcount_table_offset = table_off;
    s->refcount_table_clusters = (uint32_t)(r.table_size * 8 / cs);
    s->refcount_order = order;
    s->refcount_bits = 1u << order;
    s->refcount_max =
        s->refcount_bits == 64 ? UINT64_MAX : (1ULL << s->refcount_bits) - 1;
    s->rb_bits = s->cluster_bits + 3 - order;
    s->free_cluster_index = 0;
    r.table = NULL;
    free_structures(n, old_table, old_size, old_off, old_bytes);
    free(old_table);
    bi_free_aligned(r.block);
    ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        bi_error_set(err, -ret, "Failed to free the old refcount structures");
    return ret;

fail:
    /* the new structures were never referenced: give them back */
    free_structures(n, r.table, r.table_size, table_off, table_alloc * 8);
    free(r.table);
    bi_free_aligned(r.block);
    qc_flush_metadata(n);
    return ret;
}
