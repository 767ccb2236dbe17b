/* SPDX-License-Identifier: MIT */
/*
 * qcow2 consistency check (qemu-img check): rebuilds the reference counts
 * from the L1/L2 tables, snapshots and metadata in memory, compares them
 * with the refcount blocks, and checks the COPIED flags; with fix, leaks
 * and too-low refcounts are corrected. Messages are qemu-img's.
 *
 * A broken refcount structure (a referenced cluster with refcount 0, a
 * bad refcount block) is rebuilt with -r all: new refcount blocks and
 * table past the end of the image, written from the computed counts.
 * Not done: the bitmaps extension's clusters are not accounted for.
 */
#include "blkimg/qcow2.h"
#include "qcow2.h"
#include "util/util.h"
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ck {
    bi_node *n;
    qcow2_state *s;
    struct bi_check_result *res;
    uint32_t *ref; /* computed references per cluster (saturating) */
    uint64_t nb;   /* clusters in the array */
    uint64_t file_clusters;
    bool rebuild;
    uint8_t *l2buf;
};

static int ck_grow(struct ck *c, uint64_t need)
{
    if (need <= c->nb)
        return 0;
    /* never more than a bounded margin past the file end */
    if (need > c->file_clusters + (1u << 20))
        return -EFBIG;
    uint32_t *r = realloc(c->ref, need * sizeof(uint32_t));
    if (!r)
        return -ENOMEM;
    memset(r + c->nb, 0, (need - c->nb) * sizeof(uint32_t));
    c->ref = r;
    c->nb = need;
    return 0;
}

static int ck_inc(struct ck *c, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 0;
    qcow2_state *s = c->s;
    uint64_t first = off >> s->cluster_bits;
    uint64_t last = (off + len - 1) >> s->cluster_bits;
    if (last < first)
        return 0;
    if (ck_grow(c, last + 1) < 0) {
        fprintf(stderr,
                "ERROR: reference to offset %#" PRIx64
                " far beyond the end of the image\n",
                off);
        c->res->corruptions++;
        c->rebuild = true;
        return 0;
    }
    for (uint64_t i = first; i <= last; i++)
        if (c->ref[i] != UINT32_MAX)
            c->ref[i]++;
    return 0;
}

static int ck_l2(struct ck *c, uint64_t l2_off, bool active)
{
    qcow2_state *s = c->s;
    int ret = bi_co_pread(c->n->file, l2_off, c->l2buf, s->cluster_size);
    if (ret < 0) {
        fprintf(stderr, "ERROR: I/O error in check_refcounts_l2\n");
        c->res->check_errors++;
        return ret;
    }
    uint64_t next_contig = 0;
    for (uint64_t i = 0; i < s->l2_entries; i++) {
        uint64_t e, b;
        qc_get_l2(s, c->l2buf, i, &e, &b);
        if (e & QCOW_OFLAG_COMPRESSED) {
            if (e & QCOW_OFLAG_COPIED) {
                fprintf(stderr,
                        "ERROR: cluster %" PRIu64 ": copied flag must never "
                        "be set for compressed clusters\n",
                        e >> s->cluster_bits);
                e &= ~QCOW_OFLAG_COPIED;
                c->res->corruptions++;
            }
            if (s->ext_l2 && b) {
                fprintf(stderr,
                        "ERROR compressed cluster %" PRIu64 " with non-zero "
                        "subcluster allocation bitmap, entry=0x%" PRIx64 "\n",
                        i, e);
                c->res->corruptions++;
            }
            if (qc_has_data_file(s)) {
                fprintf(stderr,
                        "ERROR compressed cluster %" PRIu64
                        " with data file, entry=0x%" PRIx64 "\n",
                        i, e);
                c->res->corruptions++;
                continue;
            }
            uint64_t coff = e & s->cluster_offset_mask;
            uint64_t nsec = ((e >> s->csize_shift) & s->csize_mask) + 1;
            ck_inc(c, coff & ~511ULL, nsec * 512);
            if (active) {
                c->res->allocated_clusters++;
                c->res->compressed_clusters++;
                c->res->fragmented_clusters++;
            }
            continue;
        }
        uint64_t host = e & L2E_OFFSET_MASK;
        bool has_host =
            host || (qc_has_data_file(s) && (e & QCOW_OFLAG_COPIED));
        if (s->ext_l2) {
            uint32_t alloc = (uint32_t)b, zero = (uint32_t)(b >> 32);
            if ((alloc & zero) || (!has_host && alloc)) {
                fprintf(stderr,
                        "ERROR invalid cluster entry: l2_entry=%" PRIx64
                        " l2_bitmap=%" PRIx64 "\n",
                        e, b);
                c->res->corruptions++;
                continue;
            }
        }
        if (!has_host)
            continue;
        if (active) {
            c->res->allocated_clusters++;
            if (next_contig && host != next_contig)
                c->res->fragmented_clusters++;
            next_contig = host + s->cluster_size;
        }
        if (!qc_has_data_file(s))
            ck_inc(c, host, s->cluster_size);
        if (host & (s->cluster_size - 1)) {
            fprintf(stderr,
                    "ERROR offset=%" PRIx64 ": Cluster is not properly "
                    "aligned; L2 entry corrupted.\n",
                    host);
            c->res->corruptions++;
        }
    }
    return 0;
}

static int ck_l1(struct ck *c, uint64_t l1_off, uint32_t l1_size, bool active)
{
    qcow2_state *s = c->s;
    uint64_t bytes = (uint64_t)l1_size * 8;
    ck_inc(c, l1_off, bytes);
    if (!l1_size)
        return 0;
    uint64_t *l1 = malloc(bytes);
    if (!l1) {
        c->res->check_errors++;
        return -ENOMEM;
    }
    int ret;
    if (active) {
        memcpy(l1, s->l1_table, bytes);
    } else {
        ret = bi_co_pread(c->n->file, l1_off, l1, bytes);
        if (ret < 0) {
            fprintf(stderr, "ERROR: I/O error in check_refcounts_l1\n");
            c->res->check_errors++;
            free(l1);
            return ret;
        }
        for (uint32_t i = 0; i < l1_size; i++)
            l1[i] = be64toh(l1[i]);
    }
    for (uint32_t i = 0; i < l1_size; i++) {
        uint64_t l2 = l1[i] & L1E_OFFSET_MASK;
        if (!l2)
            continue;
        ck_inc(c, l2, s->cluster_size);
        if (l2 & (s->cluster_size - 1)) {
            fprintf(stderr,
                    "ERROR l2_offset=%" PRIx64 ": Table is not cluster "
                    "aligned; L1 entry corrupted\n",
                    l2);
            c->res->corruptions++;
            continue;
        }
        ret = ck_l2(c, l2, active);
        if (ret < 0) {
            free(l1);
            return ret;
        }
    }
    free(l1);
    return 0;
}

static int ck_calculate(struct ck *c)
{
    qcow2_state *s = c->s;
    int ret;
    ck_inc(c, 0, s->cluster_size);
    ret = ck_l1(c, s->l1_table_offset, s->l1_size, true);
    if (ret < 0)
        return ret;
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        const struct qcow2_snapshot *sn = &s->snapshots[i];
        if (sn->l1_table_offset & (s->cluster_size - 1)) {
            fprintf(stderr,
                    "ERROR snapshot %s (%s) l1_offset=%#" PRIx64
                    ": L1 table is not cluster aligned; snapshot "
                    "table entry corrupted\n",
                    sn->id_str, sn->name, sn->l1_table_offset);
            c->res->corruptions++;
            continue;
        }
        ret = ck_l1(c, sn->l1_table_offset, sn->l1_size, false);
        if (ret < 0)
            return ret;
    }
    ck_inc(c, s->snapshots_offset, s->snapshots_size);
    /* persistent bitmaps: directory, tables and data clusters */
    if (s->bitmaps) {
        ck_inc(c, s->bitmap_dir_offset, s->bitmap_dir_size);
        for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
            const struct qcow2_bitmap *bm = &s->bitmaps[i];
            uint64_t bytes = (uint64_t)bm->table_size * 8;
            if (!bytes)
                continue;
            ck_inc(c, bm->table_offset, bytes);
            uint64_t *t = malloc(bytes);
            if (!t) {
                c->res->check_errors++;
                return -ENOMEM;
            }
            ret = bi_co_pread(c->n->file, bm->table_offset, t, bytes);
            if (ret < 0) {
                free(t);
                c->res->check_errors++;
                return ret;
            }
            for (uint32_t j = 0; j < bm->table_size; j++) {
                uint64_t off = be64toh(t[j]) & 0x00fffffffffffe00ULL;
                if (off)
                    ck_inc(c, off, s->cluster_size);
            }
            free(t);
        }
    }
    ck_inc(c, s->refcount_table_offset, s->refcount_table_size * 8);
    for (uint64_t i = 0; i < s->refcount_table_size; i++) {
        uint64_t off = s->refcount_table[i];
        uint64_t cl = off >> s->cluster_bits;
        if (off & (s->cluster_size - 1)) {
            fprintf(stderr,
                    "ERROR refcount block %" PRIu64 " is not "
                    "cluster aligned; refcount table entry "
                    "corrupted\n",
                    i);
            c->res->corruptions++;
            c->rebuild = true;
            continue;
        }
        if (!off)
            continue;
        if (cl >= c->file_clusters) {
            fprintf(stderr,
                    "ERROR refcount block %" PRIu64 " is outside image\n", i);
            c->res->corruptions++;
            c->rebuild = true;
            continue;
        }
        ck_inc(c, off, s->cluster_size);
        if (c->ref[cl] != 1) {
            fprintf(stderr,
                    "ERROR refcount block %" PRIu64 " refcount=%" PRIu32 "\n",
                    i, c->ref[cl]);
            c->res->corruptions++;
            c->rebuild = true;
        }
    }
    return 0;
}

static void ck_put64(uint8_t *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}

static void ck_rb_set(const qcow2_state *s, uint8_t *p, uint64_t i, uint64_t v)
{
    switch (s->refcount_order) {
    case 0:
    case 1:
    case 2: {
        uint64_t bit = i << s->refcount_order;
        unsigned mask = ((1u << s->refcount_bits) - 1) << (bit % 8);
        p[bit / 8] = (uint8_t)((p[bit / 8] & ~mask) |
                               (((unsigned)v << (bit % 8)) & mask));
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
    default:
        ck_put64(p + i * 8, v);
        break;
    }
}

/* Writes a new refcount structure from the computed counts, past the end
 * of everything, and switches the header to it. */
static int ck_rebuild(struct ck *c)
{
    qcow2_state *s = c->s;
    bi_node *n = c->n;
    uint64_t cs = s->cluster_size;
    int ret;

    /* the old structure is not referenced any more */
    uint64_t rt_first = s->refcount_table_offset >> s->cluster_bits;
    uint64_t rt_n = qc_size_to_clusters(s, s->refcount_table_size * 8);
    for (uint64_t i = rt_first; i < rt_first + rt_n && i < c->nb; i++)
        if (c->ref[i])
            c->ref[i]--;
    for (uint64_t i = 0; i < s->refcount_table_size; i++) {
        uint64_t off = s->refcount_table[i];
        uint64_t cl = off >> s->cluster_bits;
        if (!off || (off & (cs - 1)) || cl >= c->file_clusters)
            continue;
        if (c->ref[cl])
            c->ref[cl]--;
    }
    uint64_t e = BI_MAX(c->nb, c->file_clusters);
    uint64_t epb = 1ULL << s->rb_bits;
    uint64_t r = 1, t = 1;
    for (;;) {
        uint64_t total = e + t + r;
        uint64_t r2 = (total + epb - 1) / epb;
        uint64_t t2 = (r2 * 8 + cs - 1) / cs;
        if (r2 <= r && t2 <= t)
            break;
        r = BI_MAX(r, r2);
        t = BI_MAX(t, t2);
    }
    if (t * cs > QCOW2_MAX_REFTABLE_BYTES)
        return -EFBIG;
    ret = ck_grow(c, e + t + r);
    if (ret < 0)
        return ret;
    for (uint64_t i = e; i < e + t + r; i++)
        c->ref[i] = 1;
    uint8_t *buf = bi_blockalign(n->file, cs);
    uint64_t *tbl = calloc(t * cs / 8, 8);
    if (!buf || !tbl) {
        bi_free_aligned(buf);
        free(tbl);
        return -ENOMEM;
    }
    ret = 0;
    for (uint64_t b = 0; b < r && ret == 0; b++) {
        memset(buf, 0, cs);
        for (uint64_t k = 0; k < epb; k++) {
            uint64_t cl = b * epb + k;
            if (cl >= c->nb)
                break;
            uint64_t v = c->ref[cl];
            if (v > s->refcount_max)
                v = s->refcount_max;
            ck_rb_set(s, buf, k, v);
        }
        uint64_t off = (e + t + b) << s->cluster_bits;
        ck_put64((uint8_t *)&tbl[b], off);
        ret = bi_co_pwrite(n->file, off, buf, cs, 0);
    }
    if (ret == 0)
        ret = bi_co_pwrite(n->file, e << s->cluster_bits, tbl, t * cs, 0);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    bi_free_aligned(buf);
    if (ret < 0) {
        free(tbl);
        return ret;
    }
    uint8_t h[12];
    ck_put64(h, e << s->cluster_bits);
    uint32_t tc = htobe32((uint32_t)t);
    memcpy(h + 8, &tc, 4);
    ret = qc_write_header_field(n, QH_RT_OFFSET, h, 12);
    if (ret < 0) {
        free(tbl);
        return ret;
    }
    for (uint64_t i = 0; i < t * cs / 8; i++)
        tbl[i] = be64toh(tbl[i]);
    free(s->refcount_table);
    s->refcount_table = tbl;
    s->refcount_table_size = t * cs / 8;
    s->refcount_table_offset = e << s->cluster_bits;
    s->refcount_table_clusters = (uint32_t)t;
    s->free_cluster_index = 0;
    s->free_byte_offset = 0;
    if (((e + t + r) << s->cluster_bits) > s->file_size)
        s->file_size = (e + t + r) << s->cluster_bits;
    qc_cache_drop_all(&s->rb_cache);
    c->file_clusters = BI_MAX(c->file_clusters, e + t + r);
    return 0;
}

static void ck_compare(struct ck *c, int fix, uint64_t *highest)
{
    qcow2_state *s = c->s;
    *highest = 0;
    for (uint64_t i = 0; i < c->nb; i++) {
        uint64_t r1;
        int ret = qc_get_refcount(c->n, i, &r1);
        if (ret < 0) {
            fprintf(stderr, "Can't get refcount for cluster %" PRIu64 ": %s\n",
                    i, strerror(-ret));
            c->res->check_errors++;
            continue;
        }
        uint64_t r2 = c->ref[i];
        if (r1 || r2)
            *highest = i;
        if (r1 == r2)
            continue;
        int *fixed = NULL;
        if (r1 == 0)
            c->rebuild = true;
        else if (r1 > r2 && (fix & BI_CHECK_FIX_LEAKS))
            fixed = &c->res->leaks_fixed;
        else if (r1 < r2 && (fix & BI_CHECK_FIX_ERRORS))
            fixed = &c->res->corruptions_fixed;
        fprintf(stderr,
                "%s cluster %" PRIu64 " refcount=%" PRIu64 " reference=%" PRIu64
                "\n",
                fixed     ? "Repairing"
                : r1 < r2 ? "ERROR"
                          : "Leaked",
                i, r1, r2);
        if (fixed) {
            int64_t delta = r1 > r2 ? -(int64_t)(r1 - r2) : (int64_t)(r2 - r1);
            if (qc_update_refcount(c->n, i << s->cluster_bits, s->cluster_size,
                                   delta) == 0) {
                (*fixed)++;
                continue;
            }
        }
        if (r1 < r2)
            c->res->corruptions++;
        else
            c->res->leaks++;
    }
}

static int ck_oflag_copied(struct ck *c, int fix)
{
    qcow2_state *s = c->s;
    int ret;
    for (uint32_t i = 0; i < s->l1_size; i++) {
        uint64_t l1e = s->l1_table[i];
        uint64_t l2 = l1e & L1E_OFFSET_MASK;
        uint64_t rc;
        if (!l2 || (l2 & (s->cluster_size - 1)))
            continue;
        if (qc_get_refcount(c->n, l2 >> s->cluster_bits, &rc) < 0)
            continue;
        if ((rc == 1) != ((l1e & QCOW_OFLAG_COPIED) != 0)) {
            fprintf(stderr,
                    "%s OFLAG_COPIED L2 cluster: l1_index=%" PRIu32
                    " l1_entry=%" PRIx64 " refcount=%" PRIu64 "\n",
                    (fix & BI_CHECK_FIX_ERRORS) ? "Repairing" : "ERROR", i, l1e,
                    rc);
            if (fix & BI_CHECK_FIX_ERRORS) {
                s->l1_table[i] = rc == 1 ? l1e | QCOW_OFLAG_COPIED
                                         : l1e & ~QCOW_OFLAG_COPIED;
                ret = qc_write_l1_entry(c->n, i);
                if (ret < 0) {
                    c->res->check_errors++;
                    return ret;
                }
                c->res->corruptions_fixed++;
            } else {
                c->res->corruptions++;
            }
        }
        void *t;
        ret = qc_cache_get(c->n, &s->l2_cache, l2, false, &t);
        if (ret < 0) {
            fprintf(stderr, "ERROR: Could not read L2 table: %s\n",
                    strerror(-ret));
            c->res->check_errors++;
            return ret;
        }
        bool dirty = false;
        for (uint64_t j = 0; j < s->l2_entries; j++) {
            uint64_t e, b;
            qc_get_l2(s, t, j, &e, &b);
            if (e & QCOW_OFLAG_COMPRESSED)
                continue;
            uint64_t host = e & L2E_OFFSET_MASK;
            if (!host && !(qc_has_data_file(s) && (e & QCOW_OFLAG_COPIED)))
                continue;
            if (qc_has_data_file(s)) {
                rc = 1;
            } else if (qc_get_refcount(c->n, host >> s->cluster_bits, &rc) <
                       0) {
                continue;
            }
            if ((rc == 1) != ((e & QCOW_OFLAG_COPIED) != 0)) {
                fprintf(stderr,
                        "%s OFLAG_COPIED data cluster: l2_entry=%" PRIx64
                        " refcount=%" PRIu64 "\n",
                        (fix & BI_CHECK_FIX_ERRORS) ? "Repairing" : "ERROR", e,
                        rc);
                if (fix & BI_CHECK_FIX_ERRORS) {
                    qc_set_l2(s, t, j,
                              rc == 1 ? e | QCOW_OFLAG_COPIED
                                      : e & ~QCOW_OFLAG_COPIED,
                              b);
                    dirty = true;
                    c->res->corruptions_fixed++;
                } else {
                    c->res->corruptions++;
                }
            }
        }
        if (dirty)
            qc_cache_mark_dirty(&s->l2_cache, t);
        qc_cache_put(&s->l2_cache, t);
    }
    return 0;
}

int qcow2_check_image(bi_node *n, struct bi_check_result *res_out, int fix,
                      bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct bi_check_result local;
    struct bi_check_result *res = res_out ? res_out : &local;
    struct ck c;
    int ret;
    memset(res, 0, sizeof(*res));
    memset(&c, 0, sizeof(c));
    if (fix && s->read_only) {
        bi_error_set(err, EROFS, "Cannot repair a read-only image");
        return -EROFS;
    }
    bi_co_mutex_lock(&s->lock);
    if (fix) {
        ret = qc_before_meta_write(n);
        if (ret < 0) {
            res->check_errors++;
            goto out;
        }
    }
    if (!s->read_only) {
        ret = qc_flush_metadata(n);
        if (ret < 0) {
            res->check_errors++;
            goto out;
        }
    }
    int64_t fsz = bi_getlength(n->file);
    if (fsz < 0) {
        res->check_errors++;
        ret = (int)fsz;
        goto out;
    }
    c.n = n;
    c.s = s;
    c.res = res;
    c.file_clusters = qc_size_to_clusters(s, (uint64_t)fsz);
    if (c.file_clusters > (1ULL << 31)) {
        res->check_errors++;
        ret = -EFBIG;
        goto out;
    }
    c.l2buf = bi_blockalign(n->file, s->cluster_size);
    if (!c.l2buf || ck_grow(&c, c.file_clusters ? c.file_clusters : 1) < 0) {
        res->check_errors++;
        ret = -ENOMEM;
        goto out;
    }
    res->total_clusters = qc_size_to_clusters(s, n->size);
    res->has_frag_info = true;

    ret = ck_calculate(&c);
    if (ret < 0)
        goto out;
    struct bi_check_result pre = *res;
    uint64_t highest = 0;
    ck_compare(&c, 0, &highest);
    if (fix && c.rebuild && (fix & BI_CHECK_FIX_ERRORS)) {
        struct bi_check_result old = *res;
        fprintf(stderr, "Rebuilding refcount structure\n");
        ret = qc_flush_metadata(n);
        if (ret == 0)
            ret = ck_rebuild(&c);
        if (ret < 0) {
            fprintf(stderr, "ERROR rebuilding refcount structure: %s\n",
                    strerror(-ret));
            res->check_errors++;
            goto out;
        }
        res->corruptions = 0;
        res->leaks = 0;
        c.rebuild = false;
        ck_compare(&c, 0, &highest);
        if (c.rebuild)
            fprintf(stderr, "ERROR rebuilt refcount structure is still "
                            "broken\n");
        if (res->corruptions < old.corruptions)
            res->corruptions_fixed += old.corruptions - res->corruptions;
        if (res->leaks < old.leaks)
            res->leaks_fixed += old.leaks - res->leaks;
    } else if (fix) {
        if (c.rebuild) {
            fprintf(stderr, "ERROR need to rebuild refcount structures\n");
            res->check_errors++;
            ret = -EIO;
            goto out;
        }
        if (res->leaks || res->corruptions) {
            *res = pre;
            ck_compare(&c, fix, &highest);
        }
    }
    ret = ck_oflag_copied(&c, fix);
    if (ret < 0)
        goto out;
    res->image_end_offset = (int64_t)((highest + 1) << s->cluster_bits);
    if (fix && !s->read_only && !res->check_errors && !res->corruptions &&
        (s->incompat & (QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT))) {
        /* consistent again: mark clean and not corrupt, as QEMU does */
        ret = qc_flush_metadata(n);
        if (ret == 0)
            ret = bi_co_flush(n->file);
        if (ret == 0)
            ret =
                qc_update_incompat(n, s->incompat & ~(QCOW2_INCOMPAT_DIRTY |
                                                      QCOW2_INCOMPAT_CORRUPT));
        if (ret < 0) {
            res->check_errors++;
            goto out;
        }
        s->corrupt = false;
    }
    if (fix && !s->read_only) {
        ret = qc_flush_metadata(n);
        if (ret == 0)
            ret = bi_co_flush(n->file);
        if (ret < 0) {
            res->check_errors++;
            goto out;
        }
    }
    ret = 0;
out:
    bi_co_mutex_unlock(&s->lock);
    free(c.ref);
    bi_free_aligned(c.l2buf);
    if (ret < 0 && err && !err->msg[0])
        bi_error_set(err, -ret, "Check failed");
    return ret;
}

struct check_args {
    bi_node *n;
    int fix;
    struct bi_check_result *res;
    bi_error *err;
};

static int check_co(void *opaque)
{
    struct check_args *a = opaque;
    return a->n->drv->check(a->n, a->res, a->fix, a->err);
}

int bi_check(bi_node *node, int fix, struct bi_check_result *result,
             bi_error *err)
{
    memset(result, 0, sizeof(*result));
    if (!node->drv->check)
        return -ENOTSUP;
    struct check_args a = {node, fix, result, err};
    return bi_run_co(check_co, &a);
}
