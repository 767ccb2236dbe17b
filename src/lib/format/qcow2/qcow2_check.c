/* SPDX-License-Identifier: MIT */
/*
 * qcow2 consistency check (qemu-img check), in QEMU 7.2's phases and with
 * its findings, counts and messages:
 *
 *  1. calculate: walk the header, the active L1/L2 tables, every
 *     snapshot's tables, the snapshot table, the refcount table, the
 *     crypto header and the bitmaps, counting the references to every
 *     host cluster in memory and judging every entry on the way (reserved
 *     bits, alignment, subcluster bitmaps, references past the end of the
 *     file, refcount overflow); then the refcount blocks themselves.
 *  2. compare: the computed counts against the refcount blocks; leaks and
 *     too-low counts are repaired one by one with -r, a referenced cluster
 *     with refcount 0 (or a bad refcount block) asks for a rebuild.
 *  3. rebuild (-r all): a new refcount structure written from the computed
 *     counts into free clusters, as QEMU lays it out, then the counts are
 *     calculated again and the old structure's leaks freed.
 *  4. the COPIED flags of L1 and L2 entries.
 *
 * Repairs write metadata before the header that points at it, so a crash
 * during a repair leaves the old structure in force.
 */
#include "blkimg/qcow2.h"
#include "qcow2.h"
#include "util/util.h"
#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L2E_STD_RESERVED_MASK 0x3f000000000001feULL
#define RTE_RESERVED_MASK 0x1ffULL
#define BME_RESERVED_MASK 0xff000000000001feULL
#define BME_ALL_ONES 1ULL
#define L2_BITMAP_ALL_ALLOC 0xffffffffULL
#define L2_BITMAP_ALL_ZEROES 0xffffffff00000000ULL
#define CK_MAX_CLUSTERS 0x7fffffffULL /* QEMU's INT_MAX */
#define CK_MAX_SNAPSHOT_L1 (QCOW2_MAX_L1_BYTES / 8)

struct ck {
    bi_node *n;
    qcow2_state *s;
    struct bi_check_result *res;
    int fix;
    void *ref;         /* computed references per host cluster (ck_ref) */
    size_t ref_size;   /* bytes a count: 2 up to 16-bit refcounts, else 4 */
    uint64_t nb;       /* clusters the array covers (QEMU's nb_clusters) */
    uint64_t ref_max;  /* the image's refcount_max, as stored in ref */
    uint64_t file_len; /* bytes of the image file */
    bool rebuild;
    uint8_t *l2buf;
};

/* Sets err to a finding that ends the check (printf-style), with code
 * as its errno. */
static void snap_fail(bi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void snap_fail(bi_error *err, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    bi_error_setc(err, code, "%s", msg);
}

/* The kinds of L2 entry, classified as QEMU's qcow2_get_cluster_type. */
enum ck_type { CK_UNALLOC, CK_ZERO_PLAIN, CK_ZERO_ALLOC, CK_NORMAL, CK_COMP };

static enum ck_type ck_type_of(const qcow2_state *s, uint64_t e)
{
    if (e & QCOW_OFLAG_COMPRESSED)
        return CK_COMP;
    if ((e & QCOW_OFLAG_ZERO) && !s->ext_l2)
        return (e & L2E_OFFSET_MASK) ? CK_ZERO_ALLOC : CK_ZERO_PLAIN;
    if (!(e & L2E_OFFSET_MASK))
        return qc_has_data_file(s) && (e & QCOW_OFLAG_COPIED) ? CK_NORMAL
                                                              : CK_UNALLOC;
    return CK_NORMAL;
}

/* The computed count of cluster k (k < c->nb). Counts are kept no wider
 * than the image's refcounts need, as QEMU keeps them: a repair that
 * reaches far past the end of the file counts every cluster up to there. */
static uint64_t ck_ref(const struct ck *c, uint64_t k)
{
    assert(k < c->nb);
    return c->ref_size == 2 ? ((const uint16_t *)c->ref)[k]
                            : ((const uint32_t *)c->ref)[k];
}

/* Sets the count of cluster k (k < c->nb) to v (at most c->ref_max). */
static void ck_ref_set(struct ck *c, uint64_t k, uint64_t v)
{
    assert(k < c->nb && v <= c->ref_max);
    if (c->ref_size == 2)
        ((uint16_t *)c->ref)[k] = (uint16_t)v;
    else
        ((uint32_t *)c->ref)[k] = (uint32_t)v;
}

/* Makes the array cover need clusters (new ones zero). 0 or -errno. */
static int ck_resize(struct ck *c, uint64_t need)
{
    if (need <= c->nb)
        return 0;
    if (need > CK_MAX_CLUSTERS)
        return -EFBIG;
    uint8_t *r = realloc(c->ref, need * c->ref_size);
    if (!r)
        return -ENOMEM;
    memset(r + c->nb * c->ref_size, 0, (need - c->nb) * c->ref_size);
    c->ref = r;
    c->nb = need;
    return 0;
}

/* Counts one reference to every cluster of [off, off + size) (QEMU's
 * qcow2_inc_refcounts_imrt): a range reaching a cluster or more past the
 * end of the file is a corruption and is not counted; a count already at
 * the image's maximum overflows. 0, or -errno (check_errors counted). */
static int ck_inc(struct ck *c, uint64_t off, uint64_t size)
{
    qcow2_state *s = c->s;
    if (size == 0)
        return 0;
    if (off + size >= c->file_len + s->cluster_size || off + size < off) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: counting reference for region exceeding the end of "
                   "the file by one cluster or more: offset 0x%" PRIx64
                   " size 0x%" PRIx64 "",
                   off, size);
        c->res->corruptions++;
        return 0;
    }
    uint64_t first = off >> s->cluster_bits;
    uint64_t last = (off + size - 1) >> s->cluster_bits;
    int ret = ck_resize(c, last + 1);
    if (ret < 0) {
        c->res->check_errors++;
        return ret;
    }
    for (uint64_t k = first; k <= last; k++) {
        uint64_t count = ck_ref(c, k);
        if (count >= c->ref_max) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR: overflow cluster offset=0x%" PRIx64 "",
                       k << s->cluster_bits);
            bi_message(BI_MESSAGE_CHECK,
                       "Use qemu-img amend to increase the refcount "
                       "entry width or qemu-img convert to create a "
                       "clean copy if the image cannot be opened for "
                       "writing");
            c->res->corruptions++;
            continue;
        }
        ck_ref_set(c, k, count + 1);
    }
    return 0;
}

/* -r all on a preallocated zero cluster whose offset is unaligned: the
 * entry becomes a plain zero cluster (its subclusters zero), written
 * through to the file. Counts it fixed. */
static int ck_fix_l2_by_zero(struct ck *c, uint64_t l2_off, uint64_t idx)
{
    qcow2_state *s = c->s;
    uint8_t *p = c->l2buf + idx * s->l2_entry_size;
    uint64_t e, b;
    qc_get_l2(s, c->l2buf, idx, &e, &b);
    if (s->ext_l2) {
        b |= b << 32;
        qc_set_l2(s, c->l2buf, idx, 0, b & L2_BITMAP_ALL_ZEROES);
    } else {
        qc_set_l2(s, c->l2buf, idx, QCOW_OFLAG_ZERO, 0);
    }
    uint64_t at = l2_off + idx * s->l2_entry_size;
    int ret = bi_co_pwrite(c->n->file, at, p, s->l2_entry_size, 0);
    if (ret == 0)
        ret = bi_co_flush(c->n->file);
    if (ret < 0) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: Failed to overwrite L2 table entry: %s",
                   strerror(-ret));
        c->res->check_errors++;
        return ret;
    }
    qc_cache_discard(&s->l2_cache, qc_start_of_cluster(s, l2_off));
    c->res->corruptions--;
    c->res->corruptions_fixed++;
    return 0;
}

/* A compressed entry: its flags, then its bytes counted. */
static int ck_l2_compressed(struct ck *c, uint64_t i, uint64_t e, uint64_t b,
                            bool frag)
{
    qcow2_state *s = c->s;
    if (e & QCOW_OFLAG_COPIED) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: coffset=0x%" PRIx64
                   ": copied flag must never be set "
                   "for compressed clusters",
                   e & s->cluster_offset_mask);
        e &= ~QCOW_OFLAG_COPIED;
        c->res->corruptions++;
    }
    if (qc_has_data_file(s)) {
        bi_message(
            BI_MESSAGE_CHECK,
            "ERROR compressed cluster %d with data file, entry=0x%" PRIx64 "",
            (int)i, e);
        c->res->corruptions++;
        return 0;
    }
    if (b) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR compressed cluster %d with non-zero subcluster "
                   "allocation bitmap, entry=0x%" PRIx64 "",
                   (int)i, e);
        c->res->corruptions++;
        return 0;
    }
    uint64_t coff = e & s->cluster_offset_mask;
    uint64_t nsec = ((e >> s->csize_shift) & s->csize_mask) + 1;
    int ret = ck_inc(c, coff, nsec * 512 - (coff & 511));
    if (ret < 0)
        return ret;
    if (frag) {
        c->res->allocated_clusters++;
        c->res->compressed_clusters++;
        c->res->fragmented_clusters++;
    }
    return 0;
}

/* An entry with a host cluster (data or preallocated zeroes). Returns 1
 * when a repair made it a plain zero cluster (nothing to count). */
static int ck_l2_host(struct ck *c, uint64_t l2_off, uint64_t i, uint64_t e,
                      uint64_t b, bool frag, uint64_t *next_contig)
{
    qcow2_state *s = c->s;
    uint64_t off = e & L2E_OFFSET_MASK;
    if ((b >> 32) & b) {
        c->res->corruptions++;
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR offset=%" PRIx64 ": Allocated cluster has corrupted "
                   "subcluster allocation bitmap",
                   off);
    }
    if (qc_offset_into_cluster(s, off)) {
        c->res->corruptions++;
        bool has_data =
            s->ext_l2 ? (b & L2_BITMAP_ALL_ALLOC) != 0 : !(e & QCOW_OFLAG_ZERO);
        if (!has_data) {
            bool fix = c->fix & BI_CHECK_FIX_ERRORS;
            bi_message(BI_MESSAGE_CHECK,
                       "%s offset=%" PRIx64 ": Preallocated cluster is not "
                       "properly aligned; L2 entry corrupted.",
                       fix ? "Repairing" : "ERROR", off);
            if (fix && ck_fix_l2_by_zero(c, l2_off, i) == 0)
                return 1;
        } else {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR offset=%" PRIx64 ": Data cluster is not properly "
                       "aligned; L2 entry corrupted.",
                       off);
        }
    }
    if (frag) {
        c->res->allocated_clusters++;
        if (*next_contig && off != *next_contig)
            c->res->fragmented_clusters++;
        *next_contig = off + s->cluster_size;
    }
    if (qc_has_data_file(s))
        return 0;
    return ck_inc(c, off, s->cluster_size);
}

/* Counts and judges every entry of the L2 table at l2_off (QEMU's
 * check_refcounts_l2). frag: the active table (fragmentation counters). */
static int ck_l2(struct ck *c, uint64_t l2_off, bool frag)
{
    qcow2_state *s = c->s;
    int ret = bi_co_pread(c->n->file, l2_off, c->l2buf, s->cluster_size);
    if (ret < 0) {
        bi_message(BI_MESSAGE_CHECK, "ERROR: I/O error in check_refcounts_l2");
        c->res->check_errors++;
        return ret;
    }
    uint64_t next_contig = 0;
    for (uint64_t i = 0; i < s->l2_entries; i++) {
        uint64_t e, b;
        qc_get_l2(s, c->l2buf, i, &e, &b);
        enum ck_type t = ck_type_of(s, e);
        if (t != CK_COMP && (e & L2E_STD_RESERVED_MASK)) {
            bi_message(
                BI_MESSAGE_CHECK,
                "ERROR found l2 entry with reserved bits set: %" PRIx64 "", e);
            c->res->corruptions++;
        }
        ret = 0;
        switch (t) {
        case CK_COMP:
            ret = ck_l2_compressed(c, i, e, b, frag);
            break;
        case CK_ZERO_ALLOC:
        case CK_NORMAL:
            ret = ck_l2_host(c, l2_off, i, e, b, frag, &next_contig);
            break;
        case CK_ZERO_PLAIN:
            break;
        case CK_UNALLOC:
            if (b & L2_BITMAP_ALL_ALLOC) {
                c->res->corruptions++;
                bi_message(BI_MESSAGE_CHECK,
                           "ERROR: Unallocated cluster has non-zero "
                           "subcluster allocation map");
            }
            break;
        }
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* The L1 table at l1_off (l1_size entries, read from the file) and every
 * L2 table it names (QEMU's check_refcounts_l1). */
static int ck_l1(struct ck *c, uint64_t l1_off, uint32_t l1_size, bool frag)
{
    qcow2_state *s = c->s;
    uint64_t bytes = (uint64_t)l1_size * 8;
    if (!l1_size)
        return 0;
    int ret = ck_inc(c, l1_off, bytes);
    if (ret < 0)
        return ret;
    uint64_t *l1 = malloc(bytes);
    if (!l1) {
        c->res->check_errors++;
        return -ENOMEM;
    }
    ret = bi_co_pread(c->n->file, l1_off, l1, bytes);
    if (ret < 0) {
        bi_message(BI_MESSAGE_CHECK, "ERROR: I/O error in check_refcounts_l1");
        c->res->check_errors++;
        free(l1);
        return ret;
    }
    for (uint32_t i = 0; i < l1_size && ret == 0; i++) {
        uint64_t e = be64toh(l1[i]);
        if (!e)
            continue;
        if (e & L1E_RESERVED_MASK) {
            bi_message(
                BI_MESSAGE_CHECK,
                "ERROR found L1 entry with reserved bits set: %" PRIx64 "", e);
            c->res->corruptions++;
        }
        uint64_t l2 = e & L1E_OFFSET_MASK;
        ret = ck_inc(c, l2, s->cluster_size);
        if (ret < 0)
            break;
        if (qc_offset_into_cluster(s, l2)) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR l2_offset=%" PRIx64 ": Table is not cluster "
                       "aligned; L1 entry corrupted",
                       l2);
            c->res->corruptions++;
        }
        ret = ck_l2(c, l2, frag);
    }
    free(l1);
    return ret;
}

/* Every snapshot's tables, then the snapshot table itself. */
static int ck_snapshots(struct ck *c)
{
    qcow2_state *s = c->s;
    if (qc_has_data_file(s) && s->nb_snapshots) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR %d snapshots in image with data file",
                   (int)s->nb_snapshots);
        c->res->corruptions++;
    }
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        const struct qcow2_snapshot *sn = &s->snapshots[i];
        if (qc_offset_into_cluster(s, sn->l1_table_offset)) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR snapshot %s (%s) l1_offset=%#" PRIx64
                       ": L1 table is not cluster aligned; snapshot table "
                       "entry corrupted",
                       sn->id_str, sn->name, sn->l1_table_offset);
            c->res->corruptions++;
            continue;
        }
        if (sn->l1_size > CK_MAX_SNAPSHOT_L1) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR snapshot %s (%s) l1_size=%#" PRIx32
                       ": L1 table is too large; snapshot table entry "
                       "corrupted",
                       sn->id_str, sn->name, sn->l1_size);
            c->res->corruptions++;
            continue;
        }
        int ret = ck_l1(c, sn->l1_table_offset, sn->l1_size, false);
        if (ret < 0)
            return ret;
    }
    return ck_inc(c, s->snapshots_offset, s->snapshots_size);
}

/* A bitmap table entry as QEMU accepts it: no reserved bits, an aligned
 * offset, and "all ones" only without an offset. */
static bool ck_bitmap_entry_ok(const qcow2_state *s, uint64_t e)
{
    uint64_t off = e & L2E_OFFSET_MASK;
    if (e & BME_RESERVED_MASK)
        return false;
    if (qc_offset_into_cluster(s, off))
        return false;
    return !(off && (e & BME_ALL_ONES));
}

/* The bitmap directory, each bitmap's table and its data clusters. */
static int ck_bitmaps(struct ck *c)
{
    qcow2_state *s = c->s;
    if (!s->bitmaps || !s->nb_bitmaps)
        return 0;
    int ret = ck_inc(c, s->bitmap_dir_offset, s->bitmap_dir_size);
    for (uint32_t i = 0; i < s->nb_bitmaps && ret == 0; i++) {
        const struct qcow2_bitmap *bm = &s->bitmaps[i];
        uint64_t bytes = (uint64_t)bm->table_size * 8;
        ret = ck_inc(c, bm->table_offset, bytes);
        if (ret < 0 || !bytes)
            break;
        uint64_t *t = malloc(bytes);
        if (!t) {
            c->res->check_errors++;
            return -ENOMEM;
        }
        if (bi_co_pread(c->n->file, bm->table_offset, t, bytes) < 0) {
            free(t);
            c->res->corruptions++;
            break;
        }
        bool bad = false;
        for (uint32_t j = 0; j < bm->table_size; j++)
            bad |= !ck_bitmap_entry_ok(s, be64toh(t[j]));
        for (uint32_t j = 0; j < bm->table_size && !bad && ret == 0; j++) {
            uint64_t off = be64toh(t[j]) & L2E_OFFSET_MASK;
            if (off)
                ret = ck_inc(c, off, s->cluster_size);
        }
        free(t);
        if (bad) {
            c->res->corruptions++;
            break;
        }
    }
    return ret;
}

/* -r all on a refcount block beyond the end of the file: the file grows
 * to hold it (QEMU's repair). 0 when it now lies inside. */
static int ck_grow_file_to(struct ck *c, uint64_t off)
{
    qcow2_state *s = c->s;
    bi_error e = {0};
    int ret;
    if (((off + s->cluster_size) >> s->cluster_bits) > CK_MAX_CLUSTERS)
        ret = -EFBIG;
    else
        ret = c->n->file->drv->co_truncate(c->n->file, off + s->cluster_size,
                                           false, BI_PREALLOC_OFF, &e);
    if (ret == 0) {
        int64_t len = bi_getlength(c->n->file);
        ret = len < 0 ? (int)len : 0;
        if (ret == 0) {
            c->file_len = (uint64_t)len;
            if (c->file_len > s->file_size)
                s->file_size = c->file_len;
            ret = ck_resize(c, qc_size_to_clusters(s, c->file_len));
        }
    }
    if (ret < 0)
        bi_message(BI_MESSAGE_CHECK, "ERROR could not resize image: %s",
                   strerror(-ret));
    return ret;
}

/* The refcount blocks: reserved bits, alignment, inside the file, and
 * referenced exactly once (QEMU's check_refblocks). */
static int ck_refblocks(struct ck *c)
{
    qcow2_state *s = c->s;
    for (uint64_t i = 0; i < s->refcount_table_size; i++) {
        uint64_t off = s->refcount_table[i] & RTE_OFFSET_MASK;
        uint64_t cl = off >> s->cluster_bits;
        if (s->refcount_table[i] & RTE_RESERVED_MASK) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR refcount table entry %" PRIu64 " has reserved "
                       "bits set",
                       i);
            c->res->corruptions++;
            c->rebuild = true;
            continue;
        }
        if (qc_offset_into_cluster(s, off)) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR refcount block %" PRIu64
                       " is not cluster aligned; "
                       "refcount table entry corrupted",
                       i);
            c->res->corruptions++;
            c->rebuild = true;
            continue;
        }
        if (cl >= c->nb) {
            bool fix = c->fix & BI_CHECK_FIX_ERRORS;
            c->res->corruptions++;
            bi_message(BI_MESSAGE_CHECK,
                       "%s refcount block %" PRIu64 " is outside image",
                       fix ? "Repairing" : "ERROR", i);
            if (!fix)
                continue;
            if (ck_grow_file_to(c, off) < 0 || cl >= c->nb) {
                c->rebuild = true;
                continue;
            }
            c->res->corruptions--;
            c->res->corruptions_fixed++;
            int ret = ck_inc(c, off, s->cluster_size);
            if (ret < 0)
                return ret;
            continue;
        }
        if (!off)
            continue;
        int ret = ck_inc(c, off, s->cluster_size);
        if (ret < 0)
            return ret;
        if (ck_ref(c, cl) != 1) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR refcount block %" PRIu64 " refcount=%" PRIu64 "",
                       i, ck_ref(c, cl));
            c->res->corruptions++;
            c->rebuild = true;
        }
    }
    return 0;
}

/* Phase 1: every reference the image makes, counted in c->ref. */
static int ck_calculate(struct ck *c)
{
    qcow2_state *s = c->s;
    int ret = ck_inc(c, 0, s->cluster_size);
    if (ret == 0)
        ret = ck_l1(c, s->l1_table_offset, s->l1_size, true);
    if (ret == 0)
        ret = ck_snapshots(c);
    if (ret == 0)
        ret = ck_inc(c, s->refcount_table_offset, s->refcount_table_size * 8);
    if (ret == 0 && s->has_crypto_hdr)
        ret = ck_inc(c, s->crypto_hdr_offset, s->crypto_hdr_length);
    if (ret == 0)
        ret = ck_bitmaps(c);
    if (ret == 0)
        ret = ck_refblocks(c);
    return ret;
}

/* Phase 2: the stored refcounts against the computed ones (QEMU's
 * compare_refcounts); fix repairs leaks and too-low counts in place. */
static void ck_compare(struct ck *c, int fix, uint64_t *highest)
{
    qcow2_state *s = c->s;
    *highest = 0;
    for (uint64_t i = 0; i < c->nb; i++) {
        uint64_t r1;
        int ret = qc_get_refcount(c->n, i, &r1);
        if (ret < 0) {
            bi_message(BI_MESSAGE_CHECK,
                       "Can't get refcount for cluster %" PRIu64 ": %s", i,
                       strerror(-ret));
            c->res->check_errors++;
            continue;
        }
        uint64_t r2 = ck_ref(c, i);
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
        bi_message(BI_MESSAGE_CHECK,
                   "%s cluster %" PRIu64 " refcount=%" PRIu64
                   " reference=%" PRIu64 "",
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

static void ck_put64(uint8_t *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}

/* Stores refcount v as entry i of a refcount block in the image's width. */
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

/* Takes count free clusters in a row in the computed counts, from
 * *first_free on, growing past the end where there are none (QEMU's
 * alloc_clusters_imrt); *first_free moves to the first gap seen. Returns
 * the first cluster's index or -errno. */
static int64_t ck_alloc_imrt(struct ck *c, uint64_t count, uint64_t *first_free)
{
    uint64_t cl = *first_free, run = 0;
    bool first_gap = true;
    for (; cl < c->nb && run < count; cl++) {
        if (ck_ref(c, cl)) {
            run = 0;
            continue;
        }
        run++;
        if (first_gap) {
            *first_free = cl;
            first_gap = false;
        }
    }
    if (run < count) {
        int ret = ck_resize(c, cl + count - run);
        if (ret < 0)
            return ret;
    }
    cl -= run;
    for (uint64_t i = 0; i < count; i++)
        ck_ref_set(c, cl + i, 1);
    return (int64_t)cl;
}

/* The new refcount table being built: entries host endian. */
struct ck_rt {
    uint64_t *t;
    uint64_t entries;
};

/* Makes the new table hold entry idx (whole clusters of entries). */
static int ck_rt_reserve(struct ck *c, struct ck_rt *rt, uint64_t idx)
{
    uint64_t per = c->s->cluster_size / 8;
    uint64_t want = (idx / per + 1) * per;
    if (want * 8 > QCOW2_MAX_REFTABLE_BYTES)
        return -EFBIG;
    uint64_t *t = realloc(rt->t, want * 8);
    if (!t)
        return -ENOMEM;
    memset(t + rt->entries, 0, (want - rt->entries) * 8);
    rt->t = t;
    rt->entries = want;
    return 0;
}

/* Writes refcount block idx at off from the computed counts. */
static int ck_write_refblock(struct ck *c, uint64_t idx, uint64_t off,
                             uint8_t *buf)
{
    qcow2_state *s = c->s;
    uint64_t epb = 1ULL << s->rb_bits;
    memset(buf, 0, s->cluster_size);
    for (uint64_t k = 0; k < epb; k++) {
        uint64_t cl = idx * epb + k;
        if (cl >= c->nb)
            break;
        ck_rb_set(s, buf, k, BI_MIN(ck_ref(c, cl), s->refcount_max));
    }
    return bi_co_pwrite(c->n->file, off, buf, s->cluster_size, 0);
}

/* Writes a refcount block for every block of clusters in [first, end)
 * that holds a counted cluster, each into a free cluster taken from the
 * counts (QEMU's rebuild_refcounts_write_refblocks). Returns 1 when the
 * new table had to grow, 0 when not, or -errno. */
static int ck_write_refblocks(struct ck *c, uint64_t first, uint64_t end,
                              struct ck_rt *rt, uint8_t *buf)
{
    qcow2_state *s = c->s;
    uint64_t epb = 1ULL << s->rb_bits, first_free = 0;
    int grown = 0;
    for (uint64_t cl = first; cl < end && cl < c->nb; cl++) {
        if (!ck_ref(c, cl))
            continue;
        uint64_t idx = cl >> s->rb_bits, start = idx << s->rb_bits;
        if (idx >= rt->entries || !rt->t[idx]) {
            first_free = BI_MAX(first_free, start);
            int64_t k = ck_alloc_imrt(c, 1, &first_free);
            if (k < 0)
                return (int)k;
            if ((uint64_t)k >= end)
                end = (uint64_t)k + 1;
            if (idx >= rt->entries) {
                int ret = ck_rt_reserve(c, rt, idx);
                if (ret < 0)
                    return ret;
                grown = 1;
            }
            rt->t[idx] = (uint64_t)k << s->cluster_bits;
        }
        int ret = ck_write_refblock(c, idx, rt->t[idx], buf);
        if (ret < 0)
            return ret;
        cl = start + epb - 1;
    }
    return grown;
}

/* Writes the new table and points the header at it; the state follows. */
static int ck_install_reftable(struct ck *c, struct ck_rt *rt, uint64_t off)
{
    qcow2_state *s = c->s;
    uint64_t bytes = rt->entries * 8;
    uint64_t *be = malloc(bytes);
    if (!be)
        return -ENOMEM;
    for (uint64_t i = 0; i < rt->entries; i++)
        be[i] = htobe64(rt->t[i]);
    int ret = bi_co_pwrite(c->n->file, off, be, bytes, 0);
    free(be);
    if (ret == 0)
        ret = bi_co_flush(c->n->file);
    if (ret < 0)
        return ret;
    uint8_t h[12];
    ck_put64(h, off);
    uint32_t tc = htobe32((uint32_t)(bytes >> s->cluster_bits));
    memcpy(h + 8, &tc, 4);
    ret = qc_write_header_field(c->n, QH_RT_OFFSET, h, 12);
    if (ret == 0)
        ret = bi_co_flush(c->n->file);
    if (ret < 0)
        return ret;
    free(s->refcount_table);
    s->refcount_table = rt->t;
    rt->t = NULL;
    s->refcount_table_size = rt->entries;
    s->refcount_table_offset = off;
    s->refcount_table_clusters = (uint32_t)(bytes >> s->cluster_bits);
    s->free_cluster_index = 0;
    s->free_byte_offset = 0;
    qc_cache_drop_all(&s->rb_cache);
    int64_t len = bi_getlength(c->n->file);
    if (len < 0)
        return (int)len;
    c->file_len = (uint64_t)len;
    if (c->file_len > s->file_size)
        s->file_size = c->file_len;
    return 0;
}

/* Phase 3: a whole new refcount structure from the computed counts (QEMU's
 * rebuild_refcount_structure): refcount blocks first, then a table placed
 * where it fits, the blocks covering it written again, until the table
 * stops growing; the header switches last. The old structure is left to
 * leak (the next calculation frees it). */
static int ck_rebuild(struct ck *c)
{
    qcow2_state *s = c->s;
    struct ck_rt rt = {NULL, 0};
    uint8_t *buf = bi_blockalign(c->n->file, s->cluster_size);
    int ret = buf ? 0 : -ENOMEM;
    qc_cache_drop_all(&s->rb_cache);
    if (ret == 0)
        ret = ck_write_refblocks(c, 0, c->nb, &rt, buf);
    assert(ret != 0); /* the header alone makes the table grow */
    int64_t off = -1;
    while (ret > 0) {
        uint64_t first_free = 0;
        uint64_t n = qc_size_to_clusters(s, rt.entries * 8);
        off = ck_alloc_imrt(c, n, &first_free);
        if (off < 0) {
            ret = (int)off;
            break;
        }
        ret = ck_write_refblocks(c, (uint64_t)off, (uint64_t)off + n, &rt, buf);
    }
    if (ret == 0)
        ret = bi_co_flush(c->n->file);
    if (ret == 0)
        ret = ck_install_reftable(c, &rt, (uint64_t)off << s->cluster_bits);
    bi_free_aligned(buf);
    free(rt.t);
    return ret;
}

/* Phase 4 for one L2 table: each data entry's COPIED flag against its
 * cluster's refcount. Returns the entries repaired in c->l2buf. */
static int ck_copied_l2(struct ck *c, bool repair)
{
    qcow2_state *s = c->s;
    int dirty = 0;
    for (uint64_t j = 0; j < s->l2_entries; j++) {
        uint64_t e, b, rc = 1;
        qc_get_l2(s, c->l2buf, j, &e, &b);
        enum ck_type t = ck_type_of(s, e);
        if (t != CK_NORMAL && t != CK_ZERO_ALLOC)
            continue;
        if (!qc_has_data_file(s) &&
            qc_get_refcount(c->n, (e & L2E_OFFSET_MASK) >> s->cluster_bits,
                            &rc) < 0)
            continue;
        if ((rc == 1) == ((e & QCOW_OFLAG_COPIED) != 0))
            continue;
        c->res->corruptions++;
        bi_message(BI_MESSAGE_CHECK,
                   "%s OFLAG_COPIED data cluster: l2_entry=%" PRIx64
                   " refcount=%" PRIu64 "",
                   repair ? "Repairing" : "ERROR", e, rc);
        if (repair) {
            e = rc == 1 ? e | QCOW_OFLAG_COPIED : e & ~QCOW_OFLAG_COPIED;
            qc_set_l2(s, c->l2buf, j, e, b);
            dirty++;
        }
    }
    return dirty;
}

/* Phase 4: COPIED flags of the active L1 and L2 entries (QEMU's
 * check_oflag_copied); repaired with -r all, or with -r leaks when the
 * counts are known good by now. */
static int ck_oflag_copied(struct ck *c)
{
    qcow2_state *s = c->s;
    struct bi_check_result *res = c->res;
    bool repair = (c->fix & BI_CHECK_FIX_ERRORS) ||
                  ((c->fix & BI_CHECK_FIX_LEAKS) && !res->check_errors &&
                   !res->corruptions && !res->leaks);
    for (uint32_t i = 0; i < s->l1_size; i++) {
        uint64_t l1e = s->l1_table[i], rc;
        uint64_t l2 = l1e & L1E_OFFSET_MASK;
        if (!l2 || qc_get_refcount(c->n, l2 >> s->cluster_bits, &rc) < 0)
            continue;
        if ((rc == 1) != ((l1e & QCOW_OFLAG_COPIED) != 0)) {
            res->corruptions++;
            bi_message(BI_MESSAGE_CHECK,
                       "%s OFLAG_COPIED L2 cluster: l1_index=%" PRIu32
                       " l1_entry=%" PRIx64 " refcount=%" PRIu64 "",
                       repair ? "Repairing" : "ERROR", i, l1e, rc);
            if (repair) {
                s->l1_table[i] = rc == 1 ? l1e | QCOW_OFLAG_COPIED
                                         : l1e & ~QCOW_OFLAG_COPIED;
                int ret = qc_write_l1_entry(c->n, i);
                if (ret < 0) {
                    res->check_errors++;
                    return ret;
                }
                res->corruptions--;
                res->corruptions_fixed++;
            }
        }
        int ret = bi_co_pread(c->n->file, l2, c->l2buf, s->cluster_size);
        if (ret < 0) {
            bi_message(BI_MESSAGE_CHECK, "ERROR: Could not read L2 table: %s",
                       strerror(-ret));
            res->check_errors++;
            return ret;
        }
        int dirty = ck_copied_l2(c, repair);
        if (!dirty)
            continue;
        /* the table may lie on other metadata (a snapshot's L1 table) */
        ret = qc_check_overlap(c->n, QC_OL_L2, l2, s->cluster_size);
        if (ret < 0) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR: Could not write L2 table; metadata overlap "
                       "check failed: %s",
                       strerror(-ret));
            res->check_errors++;
            return ret;
        }
        ret = bi_co_pwrite(c->n->file, l2, c->l2buf, s->cluster_size, 0);
        if (ret < 0) {
            bi_message(BI_MESSAGE_CHECK, "ERROR: Could not write L2 table: %s",
                       strerror(-ret));
            res->check_errors++;
            return ret;
        }
        qc_cache_discard(&s->l2_cache, qc_start_of_cluster(s, l2));
        res->corruptions -= dirty;
        res->corruptions_fixed += dirty;
    }
    return 0;
}

/* Phase 3 and the counts after it: rebuild, count again (fix off), free
 * the old structure's clusters with -r leaks, and account for what the
 * rebuild fixed (QEMU's bookkeeping, fresh leaks included). */
static int ck_rebuild_and_recount(struct ck *c, uint64_t *highest)
{
    struct bi_check_result old = *c->res;
    int fix = c->fix;
    bi_message(BI_MESSAGE_CHECK, "Rebuilding refcount structure");
    int ret = qc_flush_metadata(c->n);
    if (ret == 0)
        ret = ck_rebuild(c);
    if (ret < 0) {
        bi_message(BI_MESSAGE_CHECK, "ERROR rebuilding refcount structure: %s",
                   strerror(-ret));
        c->res->check_errors++;
        return ret;
    }
    c->res->corruptions = 0;
    c->res->leaks = 0;
    c->rebuild = false;
    memset(c->ref, 0, c->nb * c->ref_size);
    c->fix = 0;
    ret = ck_calculate(c);
    c->fix = fix;
    if (ret < 0)
        return ret;
    int fresh_leaks = 0;
    if (fix & BI_CHECK_FIX_LEAKS) {
        struct bi_check_result saved = *c->res;
        memset(c->res, 0, sizeof(*c->res));
        ck_compare(c, BI_CHECK_FIX_LEAKS, highest);
        if (c->rebuild)
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR rebuilt refcount structure is still "
                       "broken");
        fresh_leaks = c->res->leaks;
        *c->res = saved;
    }
    if (c->res->corruptions < old.corruptions)
        c->res->corruptions_fixed += old.corruptions - c->res->corruptions;
    if (c->res->leaks < old.leaks)
        c->res->leaks_fixed += old.leaks - c->res->leaks;
    c->res->leaks += fresh_leaks;
    return 0;
}

/* Phase 0a: the snapshot table pointer in the header (the open left it
 * to the check). An image that claims too many snapshots loses the ones
 * over the limit with -r all (*reduced); a pointer QEMU would refuse
 * fails the check (err set). 0 or -errno; s->nb_snapshots and
 * s->snapshots_offset are set on success, cleared on failure. */
static int ck_snapshot_pointer(struct ck *c, struct bi_check_result *res,
                               uint32_t *reduced, bi_error *err)
{
    qcow2_state *s = c->s;
    uint8_t p[12];
    int ret = bi_co_pread(c->n->file, QH_NB_SNAPSHOTS, p, sizeof(p));
    if (ret < 0) {
        res->check_errors++;
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR failed to read the snapshot table pointer from the "
                   "image header: %s",
                   strerror(-ret));
        return ret;
    }
    uint32_t nb = qc_get32(p);
    uint64_t off = qc_get64(p + 4);
    if (nb > QCOW2_MAX_SNAPSHOTS && (c->fix & BI_CHECK_FIX_ERRORS)) {
        bi_message(BI_MESSAGE_CHECK,
                   "Discarding %" PRIu32 " overhanging snapshots",
                   nb - QCOW2_MAX_SNAPSHOTS);
        *reduced += nb - QCOW2_MAX_SNAPSHOTS;
        nb = QCOW2_MAX_SNAPSHOTS;
    }
    if (nb > QCOW2_MAX_SNAPSHOTS) {
        res->check_errors++;
        snap_fail(err, -EFBIG,
                  "ERROR snapshot table too large\nYou can force-remove all "
                  "%" PRIu32 " overhanging snapshots with qemu-img check -r "
                  "all",
                  nb - QCOW2_MAX_SNAPSHOTS);
        return -EFBIG;
    }
    if (off > (uint64_t)INT64_MAX - (uint64_t)nb * 40 ||
        qc_offset_into_cluster(s, off)) {
        res->check_errors++;
        snap_fail(err, -EINVAL, "ERROR snapshot table offset invalid");
        return -EINVAL;
    }
    s->nb_snapshots = nb;
    s->snapshots_offset = off;
    return 0;
}

/* Phase 0b: the snapshot table read as QEMU's check reads it
 * (qcow2_check_read_snapshot_table): entries whose extra data is too
 * much or too little are corruptions (res), mended in memory with -r all
 * and written by ck_fix_snapshot_table once the refcounts are sound;
 * entries dropped off the end are written to the header's count at
 * once (that only leaks, which the refcount phases repair). A table that
 * cannot be read fails the check. 0 or -errno. */
static int ck_snapshot_table(struct ck *c, struct bi_check_result *res,
                             bi_error *err)
{
    qcow2_state *s = c->s;
    struct qc_snap_read how = {.repair = c->fix & BI_CHECK_FIX_ERRORS};
    qc_free_snapshots(s);
    s->nb_snapshots = 0;
    s->snapshots_offset = 0;
    s->snapshots_size = 0;
    int ret = ck_snapshot_pointer(c, res, &how.reduced, err);
    if (ret == 0) {
        bi_error e;
        bi_error_init(&e);
        ret = qc_read_snapshot_table(c->n, &how, &e);
        if (ret < 0) {
            res->check_errors++;
            snap_fail(err, ret, "ERROR failed to read the snapshot table: %s",
                      e.msg);
        }
    }
    if (ret < 0) {
        s->nb_snapshots = 0;
        s->snapshots_offset = 0;
        return ret;
    }
    res->corruptions += how.reduced + how.extra_dropped;
    if (how.reduced) {
        assert(c->fix & BI_CHECK_FIX_ERRORS);
        uint8_t nb[4];
        qc_put32(nb, s->nb_snapshots);
        ret = qc_write_header_field(c->n, QH_NB_SNAPSHOTS, nb, sizeof(nb));
        if (ret < 0) {
            res->check_errors++;
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR failed to update the snapshot count in the "
                       "image header: %s",
                       strerror(-ret));
            return ret;
        }
        res->corruptions_fixed += how.reduced;
        res->corruptions -= how.reduced;
    }
    for (uint32_t i = 0; s->version >= 3 && i < s->nb_snapshots; i++) {
        if (s->snapshots[i].extra_data_size < 16) {
            res->corruptions++;
            bi_message(BI_MESSAGE_CHECK,
                       "%s snapshot table entry %" PRIu32 " is incomplete",
                       c->fix & BI_CHECK_FIX_ERRORS ? "Repairing" : "ERROR", i);
        }
    }
    return 0;
}

/* After the refcount phases (-r all): a snapshot table whose entries were
 * mended in memory is written anew, in new clusters, before the header
 * points at it (QEMU's qcow2_check_fix_snapshot_table). 0 or -errno. */
static int ck_fix_snapshot_table(struct ck *c, struct bi_check_result *res)
{
    if (!res->corruptions || !(c->fix & BI_CHECK_FIX_ERRORS))
        return 0;
    int ret = qc_rewrite_snapshot_table(c->n);
    if (ret < 0) {
        res->check_errors++;
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR failed to update snapshot table: %s", strerror(-ret));
        return ret;
    }
    res->corruptions_fixed += res->corruptions;
    res->corruptions = 0;
    return 0;
}

/* Adds the counts of src to out (QEMU's qcow2_add_check_result, without
 * the allocation figures). */
static void ck_add_result(struct bi_check_result *out,
                          const struct bi_check_result *src)
{
    out->corruptions += src->corruptions;
    out->leaks += src->leaks;
    out->check_errors += src->check_errors;
    out->corruptions_fixed += src->corruptions_fixed;
    out->leaks_fixed += src->leaks_fixed;
}

/* Phases 1 to 4 (QEMU's qcow2_check_refcounts). */
static int ck_refcounts(struct ck *c)
{
    qcow2_state *s = c->s;
    int ret = ck_calculate(c);
    if (ret < 0)
        return ret;
    struct bi_check_result pre = *c->res;
    uint64_t highest = 0;
    ck_compare(c, 0, &highest);
    if (c->rebuild && (c->fix & BI_CHECK_FIX_ERRORS)) {
        ret = ck_rebuild_and_recount(c, &highest);
        if (ret < 0)
            return ret;
    } else if (c->fix) {
        if (c->rebuild) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR need to rebuild refcount structures");
            c->res->check_errors++;
            return -EIO;
        }
        if (c->res->leaks || c->res->corruptions) {
            *c->res = pre;
            ck_compare(c, c->fix, &highest);
        }
    }
    ret = ck_oflag_copied(c);
    if (ret < 0)
        return ret;
    c->res->image_end_offset = (int64_t)((highest + 1) << s->cluster_bits);
    return 0;
}

/* After a repair that left no corruption: the dirty and corrupt bits go
 * (QEMU's mark clean, mark consistent), everything reaches the disk. */
static int ck_finish_repair(struct ck *c)
{
    qcow2_state *s = c->s;
    int ret = qc_flush_metadata(c->n);
    if (ret == 0)
        ret = bi_co_flush(c->n->file);
    uint64_t bad = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
    if (ret == 0 && !c->res->check_errors && !c->res->corruptions &&
        (s->incompat & bad)) {
        ret = qc_update_incompat(c->n, s->incompat & ~bad);
        if (ret == 0)
            s->corrupt = false;
    }
    return ret;
}

int qcow2_check_image(bi_node *n, struct bi_check_result *res_out, int fix,
                      bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct bi_check_result local;
    struct bi_check_result *res = res_out ? res_out : &local;
    struct ck c = {.n = n, .s = s, .res = res, .fix = fix};
    int ret = 0;
    memset(res, 0, sizeof(*res));
    if (fix && s->read_only) {
        bi_error_set(err, EROFS, "Cannot repair a read-only image");
        return -EROFS;
    }
    bi_co_mutex_lock(&s->lock);
    if (fix)
        ret = qc_before_meta_write(n);
    if (ret == 0 && !s->read_only)
        ret = qc_flush_metadata(n);
    int64_t fsz = ret < 0 ? ret : bi_getlength(n->file);
    if (fsz < 0) {
        res->check_errors++;
        ret = (int)fsz;
        goto out;
    }
    c.file_len = (uint64_t)fsz;
    c.ref_size = s->refcount_max <= UINT16_MAX ? 2 : 4;
    c.ref_max = BI_MIN(s->refcount_max, (uint64_t)UINT32_MAX);
    c.l2buf = bi_blockalign(n->file, s->cluster_size);
    ret = c.l2buf ? ck_resize(&c, qc_size_to_clusters(s, c.file_len)) : -ENOMEM;
    if (ret < 0) {
        res->check_errors++;
        goto out;
    }
    res->total_clusters = qc_size_to_clusters(s, n->size);
    res->has_frag_info = true;
    struct bi_check_result snap = {0};
    ret = ck_snapshot_table(&c, &snap, err);
    if (ret == 0)
        ret = ck_refcounts(&c);
    if (ret == 0)
        ret = ck_fix_snapshot_table(&c, &snap);
    ck_add_result(res, &snap);
    if (ret == 0 && fix && !s->read_only)
        ret = ck_finish_repair(&c);
    if (ret < 0 && fix && !res->check_errors)
        res->check_errors++;
out:
    bi_co_mutex_unlock(&s->lock);
    free(c.ref);
    bi_free_aligned(c.l2buf);
    return ret;
}
