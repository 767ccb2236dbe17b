/* SPDX-License-Identifier: MIT */
/*
 * qcow2 cluster mapping: guest ranges to extents (the longest run of one
 * kind), block status, allocating writes (one contiguous host run per
 * request where free space allows, COW head/tail handed to the generic
 * layer), zero writes, discard and growth.
 */
#include "io/aio.h"
#include "qcow2.h"
#include "util/util.h"
#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Longest allocation run handed out by one co_map(BI_MAP_WRITE). */
#define QC_MAX_ALLOC_BYTES (64ULL << 20)

/* ------------------------------------------------------------ L2 tables */

static int validate_l2_offset(bi_node *n, uint64_t l1_idx, uint64_t l2_off)
{
    qcow2_state *s = n->opaque;
    if (l2_off & (s->cluster_size - 1))
        return qc_signal_corruption(n,
                                    "L2 table offset %#" PRIx64
                                    " unaligned (L1 index: %#" PRIx64 ")",
                                    l2_off, l1_idx);
    if (l2_off < s->cluster_size)
        return qc_signal_corruption(n,
                                    "L2 table offset %#" PRIx64
                                    " overlaps the header (L1 index: "
                                    "%#" PRIx64 ")",
                                    l2_off, l1_idx);
    return 0;
}

/* Read-only lookup: *table is NULL when the L2 table is not allocated. */
static int get_l2_ro(bi_node *n, uint64_t off, void **table, uint64_t *idx)
{
    qcow2_state *s = n->opaque;
    uint64_t l1_idx = off >> (s->l2_bits + s->cluster_bits);
    *table = NULL;
    *idx = (off >> s->cluster_bits) & (s->l2_entries - 1);
    if (l1_idx >= s->l1_size)
        return 0;
    uint64_t l2_off = s->l1_table[l1_idx] & L1E_OFFSET_MASK;
    if (!l2_off)
        return 0;
    int ret = validate_l2_offset(n, l1_idx, l2_off);
    if (ret < 0)
        return ret;
    return qc_cache_get(n, &s->l2_cache, l2_off, false, table);
}

int qc_write_l1_entry(bi_node *n, uint32_t idx)
{
    qcow2_state *s = n->opaque;
    uint64_t off = s->l1_table_offset + (uint64_t)idx * 8;
    uint64_t v = htobe64(s->l1_table[idx]);
    int ret = qc_check_overlap(n, QC_OL_L1, off, 8);
    if (ret < 0)
        return ret;
    bi_debug_event(n->file, BI_DBG_L1_UPDATE);
    return bi_co_pwrite(n->file, off, &v, 8, 0);
}

/* Writes one cached table now (L2: its refcount dependency first). */
static int write_l2_now(bi_node *n, void *table, uint64_t off)
{
    qcow2_state *s = n->opaque;
    qc_cache_mark_dirty(&s->l2_cache, table);
    int ret = qc_cache_writeback(n, &s->l2_cache);
    BI_UNUSED(off);
    return ret;
}

/* Lookup for writing: allocates the L2 table or copies a shared one. */
int qc_get_l2_table(bi_node *n, uint64_t off, bool alloc, void **table,
                    uint64_t *idx)
{
    qcow2_state *s = n->opaque;
    if (!alloc)
        return get_l2_ro(n, off, table, idx);
    uint64_t l1_idx = off >> (s->l2_bits + s->cluster_bits);
    *table = NULL;
    *idx = (off >> s->cluster_bits) & (s->l2_entries - 1);
    int ret;
    if (l1_idx >= s->l1_size) {
        /* the VM state past the disk: the L1 table grows, as QEMU's
         * get_cluster_table grows it */
        ret = qc_grow_l1(n, l1_idx + 1);
        if (ret < 0)
            return ret;
    }
    uint64_t l1e = s->l1_table[l1_idx];
    uint64_t old = l1e & L1E_OFFSET_MASK;
    if (old && (l1e & QCOW_OFLAG_COPIED)) {
        ret = validate_l2_offset(n, l1_idx, old);
        if (ret < 0)
            return ret;
        return qc_cache_get(n, &s->l2_cache, old, false, table);
    }
    if (old) {
        ret = validate_l2_offset(n, l1_idx, old);
        if (ret < 0)
            return ret;
    }
    int64_t nl2 = qc_alloc_clusters(n, 1);
    if (nl2 < 0)
        return (int)nl2;
    void *t;
    ret = qc_cache_get(n, &s->l2_cache, (uint64_t)nl2, true, &t);
    if (ret < 0)
        goto fail_free;
    if (old) {
        /* copy-on-write of an L2 table shared with a snapshot: none of
         * its clusters may be written in place any more */
        void *ot;
        bi_debug_event(n->file, BI_DBG_L2_ALLOC_COW_READ);
        ret = qc_cache_get(n, &s->l2_cache, old, false, &ot);
        if (ret < 0) {
            qc_cache_put(&s->l2_cache, t);
            qc_cache_discard(&s->l2_cache, (uint64_t)nl2);
            goto fail_free;
        }
        memcpy(t, ot, s->cluster_size);
        qc_cache_put(&s->l2_cache, ot);
        for (uint64_t i = 0; i < s->l2_entries; i++) {
            uint64_t e, b;
            qc_get_l2(s, t, i, &e, &b);
            if (!qc_has_data_file(s) && (e & QCOW_OFLAG_COPIED))
                qc_set_l2(s, t, i, e & ~QCOW_OFLAG_COPIED, b);
        }
    }
    bi_debug_event(n->file, BI_DBG_L2_ALLOC_WRITE);
    ret = write_l2_now(n, t, (uint64_t)nl2);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0) {
        qc_cache_put(&s->l2_cache, t);
        qc_cache_discard(&s->l2_cache, (uint64_t)nl2);
        goto fail_free;
    }
    s->l1_table[l1_idx] = (uint64_t)nl2 | QCOW_OFLAG_COPIED;
    ret = qc_write_l1_entry(n, (uint32_t)l1_idx);
    if (ret < 0) {
        s->l1_table[l1_idx] = l1e;
        qc_cache_put(&s->l2_cache, t);
        qc_cache_discard(&s->l2_cache, (uint64_t)nl2);
        goto fail_free;
    }
    if (old)
        qc_defer_free(n, old, s->cluster_size);
    *table = t;
    return 0;
fail_free:
    qc_update_refcount(n, (uint64_t)nl2, s->cluster_size, -1);
    return ret;
}

/* ------------------------------------------------------------- mapping */

static uint64_t entry_host(const qcow2_state *s, uint64_t entry)
{
    return entry & L2E_OFFSET_MASK;
}

static unsigned sc_index(const qcow2_state *s, uint64_t off)
{
    return (unsigned)((off >> s->subcluster_bits) & (s->sc_per_cluster - 1));
}

static bool type_has_host(enum qcow2_sc_type t)
{
    return t == QC_NORMAL || t == QC_ZERO_ALLOC || t == QC_UNALLOC_ALLOC;
}

/* Coarse kinds for reads: zero and unallocated merge whatever the host. */
static int coarse(enum qcow2_sc_type t)
{
    switch (t) {
    case QC_ZERO_PLAIN:
    case QC_ZERO_ALLOC:
        return 1;
    case QC_UNALLOC_PLAIN:
    case QC_UNALLOC_ALLOC:
        return 2;
    case QC_NORMAL:
        return 3;
    default:
        return 4;
    }
}

struct qc_run {
    enum qcow2_sc_type type;
    uint64_t len;
    uint64_t host;  /* host offset of the first byte (type_has_host) */
    uint64_t entry; /* L2 entry of the first cluster */
};

/* Checks the L2 entry (index l2_idx) of the guest cluster at guest before
 * it is used: 0, or -EIO with the corruption reported as QEMU does. */
static int check_entry(bi_node *n, uint64_t entry, uint64_t bitmap,
                       enum qcow2_sc_type t, uint64_t l2_idx, uint64_t guest)
{
    qcow2_state *s = n->opaque;
    if (t == QC_INVALID)
        return qc_signal_corruption(
            n,
            "Invalid cluster entry found (L2 index: %#" PRIx64
            ", L2 entry: %#" PRIx64 ", bitmap: %#" PRIx64 ")",
            l2_idx, entry, bitmap);
    if (type_has_host(t) && (entry_host(s, entry) & (s->cluster_size - 1)))
        return qc_signal_corruption(n,
                                    "Cluster allocation offset %#" PRIx64
                                    " unaligned (L2 index: "
                                    "%#" PRIx64 ")",
                                    entry_host(s, entry), l2_idx);
    /* an external data file holds each cluster at its guest offset */
    if (type_has_host(t) && qc_has_data_file(s) &&
        entry_host(s, entry) != guest)
        return qc_signal_corruption_nonfatal(
            n,
            "External data file host cluster offset %#" PRIx64
            " does not match guest cluster offset: %#" PRIx64
            ", L2 index: %#" PRIx64 ")",
            entry_host(s, entry), guest, l2_idx);
    if (t == QC_COMPRESSED && s->ext_l2 && bitmap)
        return qc_signal_corruption(
            n,
            "Compressed cluster entry found with a non-zero subcluster "
            "bitmap (L2 index: %#" PRIx64 ")",
            l2_idx);
    return 0;
}

/* The longest run from off (at most len bytes) of one type; with
 * coarse_kinds, zero/unallocated variants merge. */
static int map_run(bi_node *n, uint64_t off, uint64_t len, bool coarse_kinds,
                   struct qc_run *r)
{
    qcow2_state *s = n->opaque;
    uint64_t end = off + len;
    uint64_t pos = off;
    void *table = NULL;
    uint64_t table_l1 = UINT64_MAX;
    int ret = 0;
    bool first = true;

    memset(r, 0, sizeof(*r));
    while (pos < end) {
        uint64_t l1_idx = pos >> (s->l2_bits + s->cluster_bits);
        uint64_t idx;
        if (l1_idx != table_l1) {
            if (table)
                qc_cache_put(&s->l2_cache, table);
            table = NULL;
            ret = get_l2_ro(n, pos, &table, &idx);
            if (ret < 0)
                return ret;
            table_l1 = l1_idx;
        }
        idx = (pos >> s->cluster_bits) & (s->l2_entries - 1);
        enum qcow2_sc_type t;
        uint64_t entry = 0, bitmap = 0, unit_end;
        if (!table) {
            t = QC_UNALLOC_PLAIN;
            uint64_t span = 1ULL << (s->l2_bits + s->cluster_bits);
            unit_end = (pos | (span - 1)) + 1;
            if (unit_end < pos) /* overflow at the very top */
                unit_end = end;
        } else {
            qc_get_l2(s, table, idx, &entry, &bitmap);
            t = qc_sc_type(s, entry, bitmap, sc_index(s, pos));
            ret = check_entry(n, entry, bitmap, t, idx,
                              qc_start_of_cluster(s, pos));
            if (ret < 0)
                goto out;
            if (t == QC_COMPRESSED)
                unit_end = qc_start_of_cluster(s, pos) + s->cluster_size;
            else
                unit_end = (pos | (s->subcluster_size - 1)) + 1;
        }
        uint64_t host = 0;
        if (type_has_host(t))
            host = entry_host(s, entry) + qc_offset_into_cluster(s, pos);
        if (first) {
            r->type = t;
            r->host = host;
            r->entry = entry;
            first = false;
        } else {
            bool same =
                coarse_kinds ? coarse(t) == coarse(r->type) : t == r->type;
            if (!same || t == QC_COMPRESSED)
                break;
            bool need_host = coarse_kinds ? t == QC_NORMAL : type_has_host(t);
            if (need_host && host != r->host + (pos - off))
                break;
        }
        pos = BI_MIN(unit_end, end);
        if (t == QC_COMPRESSED)
            break;
    }
    r->len = pos - off;
out:
    if (table)
        qc_cache_put(&s->l2_cache, table);
    return ret;
}

/* A data extent of an encrypted image (guest offset goff) carries the
 * sector encryption for the generic layer. */
static void set_crypt(const qcow2_state *s, uint64_t goff,
                      struct bi_extent *ext)
{
    if (!s->crypt)
        return;
    ext->crypt = s->crypt;
    ext->crypt_offset = qc_crypt_pos(s, goff, ext->host_offset);
}

static int map_read(bi_node *n, uint64_t off, uint64_t len,
                    struct bi_extent *ext)
{
    qcow2_state *s = n->opaque;
    struct qc_run r;
    bi_co_mutex_lock(&s->lock);
    int ret = map_run(n, off, len, true, &r);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        return ret;
    ext->len = r.len;
    switch (r.type) {
    case QC_NORMAL:
        bi_debug_event(n->file, BI_DBG_READ_AIO);
        ext->kind = BI_EXT_DATA;
        ext->host = qc_data_node(n);
        ext->host_offset = r.host;
        set_crypt(s, off, ext);
        break;
    case QC_ZERO_PLAIN:
    case QC_ZERO_ALLOC:
        ext->kind = BI_EXT_ZERO;
        break;
    case QC_COMPRESSED:
        ext->kind = BI_EXT_COMPRESSED;
        ext->host_offset = r.entry; /* the L2 entry, for co_read_compressed */
        break;
    default:
        if (n->backing)
            bi_debug_event(n->file, BI_DBG_READ_BACKING_AIO);
        ext->kind = BI_EXT_UNALLOC;
        break;
    }
    return 0;
}

/* QEMU's test for a metadata-preallocated image: clearly more clusters
 * are referenced than the file really holds, so data runs may be holes. */
static int detect_metadata_prealloc(bi_node *n)
{
    qcow2_state *s = n->opaque;
    int64_t flen = bi_getlength(n->file);
    int64_t alloc = bi_allocated_file_size(n->file);
    if (flen < 0 || alloc < 0)
        return 0;
    uint64_t real = (uint64_t)alloc >> s->cluster_bits;
    uint64_t threshold = BI_MAX(real * 10 / 9, real + 2);
    uint64_t end = qc_size_to_clusters(s, (uint64_t)flen);
    uint64_t count = 0;
    for (uint64_t i = 0; i < end && count <= threshold; i++) {
        uint64_t rc;
        int ret = qc_get_refcount(n, i, &rc);
        if (ret < 0)
            return ret;
        count += rc != 0;
    }
    return count > threshold;
}

int qcow2_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                          struct bi_status *st)
{
    qcow2_state *s = n->opaque;
    struct qc_run r;
    memset(st, 0, sizeof(*st));
    if (off >= n->size) {
        st->flags = BI_BS_EOF;
        return 0;
    }
    if (len > n->size - off)
        len = n->size - off;
    bi_co_mutex_lock(&s->lock);
    int ret = 0;
    if (!s->metadata_prealloc_checked) {
        ret = detect_metadata_prealloc(n);
        if (ret >= 0) {
            s->metadata_prealloc = ret > 0;
            s->metadata_prealloc_checked = true;
        }
    }
    if (ret >= 0)
        ret = map_run(n, off, len, false, &r);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        return ret;
    st->len = r.len;
    switch (r.type) {
    case QC_NORMAL:
        st->flags = BI_BS_DATA | BI_BS_ALLOCATED | BI_BS_OFFSET_VALID;
        break;
    case QC_ZERO_PLAIN:
        st->flags = BI_BS_ZERO | BI_BS_ALLOCATED;
        break;
    case QC_ZERO_ALLOC:
        st->flags = BI_BS_ZERO | BI_BS_ALLOCATED | BI_BS_OFFSET_VALID;
        break;
    case QC_UNALLOC_ALLOC:
        st->flags = BI_BS_OFFSET_VALID;
        break;
    case QC_COMPRESSED:
        st->flags = BI_BS_DATA | BI_BS_ALLOCATED | BI_BS_COMPRESSED;
        break;
    default:
        st->flags = 0;
        break;
    }
    /* QEMU gives no host offset of an encrypted image's data */
    if (s->crypt_method)
        st->flags &= ~BI_BS_OFFSET_VALID;
    if (st->flags & BI_BS_OFFSET_VALID) {
        st->offset = r.host;
        st->file = qc_data_node(n);
        if (s->metadata_prealloc && (st->flags & BI_BS_DATA))
            st->flags |= BI_BS_RECURSE;
    }
    if (off + st->len >= n->size)
        st->flags |= BI_BS_EOF;
    return 0;
}

/* ------------------------------------------------------ compressed data */

struct decomp_job {
    int type;
    const void *src;
    size_t slen;
    void *dst;
    size_t dlen;
};

static int decomp_fn(void *arg)
{
    struct decomp_job *j = arg;
    return qc_decompress(j->type, j->src, j->slen, j->dst, j->dlen);
}

int qc_read_compressed_cluster(bi_node *n, uint64_t entry, void *buf)
{
    qcow2_state *s = n->opaque;
    uint64_t coff = entry & s->cluster_offset_mask;
    uint64_t nsec = ((entry >> s->csize_shift) & s->csize_mask) + 1;
    uint64_t csize = nsec * 512 - (coff & 511);
    void *cbuf = bi_blockalign(n->file, csize);
    if (!cbuf)
        return -ENOMEM;
    bi_debug_event(n->file, BI_DBG_READ_COMPRESSED);
    int ret = bi_co_pread(n->file, coff, cbuf, csize);
    if (ret == 0) {
        struct decomp_job j = {(int)s->compression_type, cbuf, csize, buf,
                               s->cluster_size};
        ret = bi_run_in_thread(decomp_fn, &j);
        if (ret < 0)
            ret = -EIO;
    }
    bi_free_aligned(cbuf);
    return ret;
}

int qcow2_co_read_compressed(bi_node *n, const struct bi_extent *ext,
                             uint64_t off, uint64_t len,
                             const struct iovec *iov, int iovcnt)
{
    qcow2_state *s = n->opaque;
    uint64_t in = qc_offset_into_cluster(s, off);
    if (in + len > s->cluster_size)
        return -EINVAL;
    void *buf = bi_blockalign(n->file, s->cluster_size);
    if (!buf)
        return -ENOMEM;
    int ret = qc_read_compressed_cluster(n, ext->host_offset, buf);
    if (ret == 0)
        bi_iov_from_buf(iov, iovcnt, 0, (uint8_t *)buf + in, len);
    bi_free_aligned(buf);
    return ret;
}

/* ----------------------------------------------------- copy on write */

/* Fills buf with the current guest content of [goff, goff+len), which
 * lies in one cluster described by entry/bitmap. */
static int fill_cow(bi_node *n, uint64_t goff, uint64_t len, uint8_t *buf,
                    uint64_t entry, uint64_t bitmap)
{
    qcow2_state *s = n->opaque;
    uint8_t *cbuf = NULL;
    int ret = 0;
    uint64_t pos = goff;
    while (pos < goff + len) {
        uint64_t unit_end =
            BI_MIN((pos | (s->subcluster_size - 1)) + 1, goff + len);
        uint64_t chunk = unit_end - pos;
        uint8_t *dst = buf + (pos - goff);
        enum qcow2_sc_type t = qc_sc_type(s, entry, bitmap, sc_index(s, pos));
        switch (t) {
        case QC_NORMAL: {
            uint64_t h = entry_host(s, entry) + qc_offset_into_cluster(s, pos);
            ret = bi_co_pread(qc_data_node(n), h, dst, chunk);
            if (ret == 0 && s->crypt)
                ret = qc_crypt_buf(s, false, pos, h, dst, chunk);
            break;
        }
        case QC_COMPRESSED:
            if (!cbuf) {
                cbuf = bi_blockalign(n->file, s->cluster_size);
                if (!cbuf) {
                    ret = -ENOMEM;
                    break;
                }
                ret = qc_read_compressed_cluster(n, entry, cbuf);
                if (ret < 0)
                    break;
            }
            memcpy(dst, cbuf + qc_offset_into_cluster(s, pos), chunk);
            break;
        case QC_ZERO_PLAIN:
        case QC_ZERO_ALLOC:
            memset(dst, 0, chunk);
            break;
        case QC_UNALLOC_PLAIN:
        case QC_UNALLOC_ALLOC:
            memset(dst, 0, chunk);
            if (n->backing) {
                uint64_t bsize = n->backing->size;
                if (pos < bsize) {
                    uint64_t rl = BI_MIN(chunk, bsize - pos);
                    ret = bi_co_pread(n->backing, pos, dst, rl);
                }
            }
            break;
        default:
            ret = -EIO;
            break;
        }
        if (ret < 0)
            break;
        pos = unit_end;
    }
    bi_free_aligned(cbuf);
    return ret;
}

/* ------------------------------------------------------ allocating writes */

/* Can the cluster be written in place for [a, b) (guest, inside it)? */
bool qc_mw_in_place(const qcow2_state *s, uint64_t entry, uint64_t bitmap,
                    uint64_t a, uint64_t b)
{
    if (entry & QCOW_OFLAG_COMPRESSED)
        return false;
    if (!(entry & QCOW_OFLAG_COPIED))
        return false;
    if (!entry_host(s, entry) && !qc_has_data_file(s))
        return false;
    if (!s->ext_l2)
        return !(entry & QCOW_OFLAG_ZERO);
    unsigned first = sc_index(s, a), last = sc_index(s, b - 1);
    for (unsigned i = first; i <= last; i++)
        if (!((bitmap >> i) & 1))
            return false;
    return true;
}

/* The cluster holds data that a copy must keep (whole-cluster COW). */
bool qc_mw_has_old_data(const qcow2_state *s, uint64_t entry, uint64_t bitmap)
{
    if (entry & QCOW_OFLAG_COMPRESSED)
        return true;
    if (!entry_host(s, entry) &&
        !(qc_has_data_file(s) && (entry & QCOW_OFLAG_COPIED)))
        return false;
    if (!s->ext_l2)
        return !(entry & QCOW_OFLAG_ZERO);
    return (uint32_t)bitmap != 0;
}

static void free_alloc(struct qc_alloc *a)
{
    if (!a)
        return;
    free(a->old_entry);
    free(a->old_bitmap);
    free(a);
}

/* An allocated cluster of ours in an extended-L2 image: a write fills
 * its unallocated subclusters where it is and updates the bitmap, in an
 * extent of its own. */
bool qc_mw_needs_bitmap_update(const qcow2_state *s, uint64_t entry)
{
    return s->ext_l2 && (entry & QCOW_OFLAG_COPIED) &&
           !(entry & QCOW_OFLAG_COMPRESSED) &&
           (entry_host(s, entry) || qc_has_data_file(s));
}

/* A preallocated zero cluster of ours (no extended L2): written where it
 * is, its entry then loses the zero flag. */
bool qc_mw_is_own_zero(const qcow2_state *s, uint64_t entry)
{
    return !s->ext_l2 && (entry & QCOW_OFLAG_COPIED) &&
           (entry & QCOW_OFLAG_ZERO) && !(entry & QCOW_OFLAG_COMPRESSED) &&
           entry_host(s, entry) && !qc_has_data_file(s);
}

/* Maps a write of [off, end) whose first cluster (entry) is written in
 * place: ext becomes the longest host-contiguous run of clusters that
 * are all written in place, at most QC_MAX_ALLOC_BYTES. No metadata
 * changes, so there is no ordering to keep. 0 or -errno (an overlap with
 * metadata included). */
static int mw_overwrite(bi_node *n, uint64_t off, uint64_t end, uint64_t entry,
                        struct bi_extent *ext)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size, c0 = qc_start_of_cluster(s, off);
    uint64_t host0 = entry_host(s, entry) + (off - c0);
    uint64_t pos = c0 + cs, tl1 = UINT64_MAX, idx, bitmap;
    void *table = NULL;
    while (pos < end && pos - off < QC_MAX_ALLOC_BYTES) {
        uint64_t l1 = pos >> (s->l2_bits + s->cluster_bits);
        if (l1 != tl1) {
            if (table)
                qc_cache_put(&s->l2_cache, table);
            table = NULL;
            int ret = get_l2_ro(n, pos, &table, &idx);
            if (ret < 0)
                return ret;
            tl1 = l1;
            if (!table)
                break;
        }
        idx = (pos >> s->cluster_bits) & (s->l2_entries - 1);
        qc_get_l2(s, table, idx, &entry, &bitmap);
        if (!qc_mw_in_place(s, entry, bitmap, pos, BI_MIN(end, pos + cs)) ||
            entry_host(s, entry) != host0 + (pos - off))
            break;
        pos += cs;
    }
    if (table)
        qc_cache_put(&s->l2_cache, table);
    ext->kind = BI_EXT_DATA;
    ext->host = qc_data_node(n);
    ext->host_offset = host0;
    ext->len = BI_MIN(pos, end) - off;
    assert(ext->len > 0 && ext->len <= end - off);
    set_crypt(s, off, ext);
    s->map_events |= 1ULL << BI_DBG_WRITE_AIO;
    if (!s->data_file)
        return qc_check_overlap(n, 0, host0, ext->len);
    return 0;
}

/* How many clusters from c0 (at most QC_MAX_ALLOC_BYTES, before end) a
 * write allocates in one run: every one that is neither written in place
 * nor needs a bitmap update. table is c0's L2 table, whose reference
 * this consumes. 1 or more in *nb, 0; or -errno. */
static int mw_count_run(bi_node *n, uint64_t c0, uint64_t end, void *table,
                        uint64_t *nb)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size, idx;
    uint64_t max_nb = BI_MAX(QC_MAX_ALLOC_BYTES / cs, 1);
    uint64_t pos = c0 + cs, tl1 = c0 >> (s->l2_bits + s->cluster_bits);
    *nb = 1;
    while (pos < end && *nb < max_nb) {
        uint64_t l1 = pos >> (s->l2_bits + s->cluster_bits);
        if (l1 != tl1) {
            qc_cache_put(&s->l2_cache, table);
            table = NULL;
            int ret = qc_get_l2_table(n, pos, true, &table, &idx);
            if (ret < 0)
                return ret;
            tl1 = l1;
        }
        idx = (pos >> s->cluster_bits) & (s->l2_entries - 1);
        uint64_t e2, b2;
        qc_get_l2(s, table, idx, &e2, &b2);
        if (qc_mw_in_place(s, e2, b2, pos, BI_MIN(end, pos + cs)) ||
            qc_mw_needs_bitmap_update(s, e2))
            break;
        (*nb)++;
        pos += cs;
    }
    if (table)
        qc_cache_put(&s->l2_cache, table);
    return 0;
}

/* Records the L2 entries of a's a->nb clusters as they are before the
 * write (what commit replaces and what the COW copies). 0, or -errno for
 * an entry that is invalid (reported by check_entry). */
static int mw_record_old(bi_node *n, struct qc_alloc *a)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size, idx;
    a->old_entry = calloc(a->nb, 8);
    a->old_bitmap = calloc(a->nb, 8);
    if (!a->old_entry || !a->old_bitmap)
        return -ENOMEM;
    for (uint64_t j = 0; j < a->nb; j++) {
        void *tt;
        int ret = get_l2_ro(n, a->guest + j * cs, &tt, &idx);
        if (ret < 0)
            return ret;
        if (!tt)
            continue;
        qc_get_l2(s, tt, idx, &a->old_entry[j], &a->old_bitmap[j]);
        qc_cache_put(&s->l2_cache, tt);
        enum qcow2_sc_type tj =
            qc_sc_type(s, a->old_entry[j], a->old_bitmap[j], 0);
        if (tj == QC_INVALID)
            return check_entry(n, a->old_entry[j], a->old_bitmap[j], tj, idx,
                               a->guest + j * cs);
    }
    return 0;
}

/* Chooses the host run of a: the cluster itself when written where it is
 * (keep), the guest offset in a data file, or else new clusters (freed
 * ones first, as QEMU reuses them), whose refcounts are raised here:
 * ordering, the refcounts of a new run reach the disk before any L2
 * entry points at it (commit). 0 or -errno. */
static int mw_host_run(bi_node *n, struct qc_alloc *a, uint64_t entry,
                       bool keep)
{
    qcow2_state *s = n->opaque;
    a->allocated = false;
    if (keep) {
        a->host = qc_has_data_file(s) ? a->guest : entry_host(s, entry);
        return 0;
    }
    if (qc_has_data_file(s)) {
        a->host = a->guest; /* guest offset == data file offset */
        return 0;
    }
    int64_t h = qc_reclaim_freed(n, a->nb);
    if (h == 0)
        h = qc_alloc_clusters(n, a->nb);
    if (h < 0)
        return (int)h;
    assert(!qc_offset_into_cluster(s, (uint64_t)h));
    a->host = (uint64_t)h;
    a->allocated = true;
    return 0;
}

/* The guest range [*head, *tail) the write of [off, wend) covers with its
 * copy-on-write head and tail: whole clusters where old data must be
 * kept, (sub)cluster units otherwise, only unallocated subclusters with
 * a bitmap update (partial), none for a raw data file. more: the request
 * goes on past the run. */
void qc_mw_cow_bounds(const qcow2_state *s, const struct qc_alloc *a,
                      uint64_t off, uint64_t wend, bool partial, bool more,
                      uint64_t *head, uint64_t *tail)
{
    uint64_t cs = s->cluster_size, c0 = a->guest, nb = a->nb;
    uint64_t unit = s->ext_l2 ? s->subcluster_size : cs;
    if (s->data_file_raw) {
        *head = off;
        *tail = wend;
    } else if (partial) {
        *head = bi_align_down(off, unit);
        if ((a->old_bitmap[0] >> sc_index(s, off)) & 1)
            *head = off;
        *tail = BI_MIN(bi_align_up(wend, unit), c0 + cs);
        if (wend < *tail && ((a->old_bitmap[0] >> sc_index(s, wend)) & 1))
            *tail = wend;
    } else {
        *head = qc_mw_has_old_data(s, a->old_entry[0], a->old_bitmap[0])
                    ? c0
                    : bi_align_down(off, unit);
        *tail =
            qc_mw_has_old_data(s, a->old_entry[nb - 1], a->old_bitmap[nb - 1])
                ? c0 + nb * cs
                : bi_align_up(wend, unit);
        if (more)
            *tail = wend;
    }
    assert(c0 <= *head && *head <= off && wend <= *tail &&
           *tail <= c0 + nb * cs);
}

/* Fills ext's copy-on-write head [head, off) and tail [wend, tail) with
 * the bytes the clusters hold now (or their backing file's), raising
 * QEMU's cow_read and cow_write events where QEMU copies. Nothing is
 * written here: the data, head and tail reach the disk together before
 * the L2 entries change (commit). 0 or -errno (buffers left in ext for
 * the caller to free). */
static int mw_fill_cow(bi_node *n, const struct qc_alloc *a,
                       struct bi_extent *ext, uint64_t head, uint64_t wend)
{
    qcow2_state *s = n->opaque;
    uint64_t nb = a->nb;
    bool events =
        (ext->cow_head_len || ext->cow_tail_len) &&
        (n->backing ||
         qc_mw_has_old_data(s, a->old_entry[0], a->old_bitmap[0]) ||
         qc_mw_has_old_data(s, a->old_entry[nb - 1], a->old_bitmap[nb - 1]));
    if (events)
        bi_debug_event(n->file, BI_DBG_COW_READ);
    if (ext->cow_head_len) {
        ext->cow_head = bi_blockalign(ext->host, ext->cow_head_len);
        if (!ext->cow_head)
            return -ENOMEM;
        int ret = fill_cow(n, head, ext->cow_head_len, ext->cow_head,
                           a->old_entry[0], a->old_bitmap[0]);
        if (ret < 0)
            return ret;
    }
    if (ext->cow_tail_len) {
        ext->cow_tail = bi_blockalign(ext->host, ext->cow_tail_len);
        if (!ext->cow_tail)
            return -ENOMEM;
        int ret = fill_cow(n, wend, ext->cow_tail_len, ext->cow_tail,
                           a->old_entry[nb - 1], a->old_bitmap[nb - 1]);
        if (ret < 0)
            return ret;
    }
    /* QEMU raises cow_write when it writes the data with the copied
     * bytes, write_aio for the guest data alone; both here */
    if (events)
        s->map_events |= 1ULL << BI_DBG_COW_WRITE;
    s->map_events |= 1ULL << BI_DBG_WRITE_AIO;
    return 0;
}

/* Maps the allocating write of [off, end) starting in the cluster of
 * a->guest: host run, extent, COW head and tail. On success ext->cookie
 * is a (commit writes the L2 entries after the data). On failure the
 * new run's refcounts are given back and a is freed. 0 or -errno. */
static int mw_allocate(bi_node *n, struct qc_alloc *a, uint64_t off,
                       uint64_t end, uint64_t entry, bool partial, bool keep,
                       struct bi_extent *ext)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size, c0 = a->guest;
    int ret = mw_record_old(n, a);
    if (ret == 0)
        ret = mw_host_run(n, a, entry, keep);
    if (ret < 0) {
        free_alloc(a);
        return ret;
    }
    uint64_t wend = BI_MIN(end, c0 + a->nb * cs), head, tail;
    qc_mw_cow_bounds(s, a, off, wend, partial, wend < end, &head, &tail);
    ext->kind = BI_EXT_DATA;
    ext->host = qc_data_node(n);
    ext->host_offset = a->host + (off - c0);
    ext->len = wend - off;
    ext->cow_head_len = off - head;
    ext->cow_tail_len = tail - wend;
    set_crypt(s, off, ext);
    a->wstart = a->host + (head - c0);
    a->wend = a->host + (tail - c0);
    if (!s->data_file)
        ret = qc_check_overlap(n, 0, a->wstart, a->wend - a->wstart);
    if (ret == 0)
        ret = mw_fill_cow(n, a, ext, head, wend);
    if (ret == 0) {
        ext->cookie = a;
        return 0;
    }
    bi_free_aligned(ext->cow_head);
    bi_free_aligned(ext->cow_tail);
    ext->cow_head = ext->cow_tail = NULL;
    if (a->allocated)
        qc_update_refcount(n, a->host, a->nb * cs, -1);
    free_alloc(a);
    return ret;
}

/* Maps a write of [off, off + len) (s->lock held) to one extent from off:
 * an overwrite in place, or an allocation whose L2 entries commit
 * updates after the data is written. Ordering invariant for the
 * allocation: refcounts of the new clusters first (mw_host_run), then
 * the data with its COW head and tail, then the L2 entries, and the L1
 * entry only for an L2 table that is itself on disk. 0 or -errno. */
static int map_write_locked(bi_node *n, uint64_t off, uint64_t len,
                            struct bi_extent *ext)
{
    qcow2_state *s = n->opaque;
    uint64_t end = off + len, c0 = qc_start_of_cluster(s, off);
    void *table;
    uint64_t idx, entry, bitmap;
    assert(len > 0);
    int ret = qc_get_l2_table(n, off, true, &table, &idx);
    if (ret < 0)
        return ret;
    qc_get_l2(s, table, idx, &entry, &bitmap);
    enum qcow2_sc_type t0 = qc_sc_type(s, entry, bitmap, sc_index(s, off));
    ret = check_entry(n, entry, bitmap, t0, idx, c0);
    if (ret < 0) {
        qc_cache_put(&s->l2_cache, table);
        return ret;
    }
    if (qc_mw_in_place(s, entry, bitmap, off,
                       BI_MIN(end, c0 + s->cluster_size))) {
        qc_cache_put(&s->l2_cache, table);
        return mw_overwrite(n, off, end, entry, ext);
    }
    struct qc_alloc *a = calloc(1, sizeof(*a));
    if (!a) {
        qc_cache_put(&s->l2_cache, table);
        return -ENOMEM;
    }
    a->guest = c0;
    bool partial = qc_mw_needs_bitmap_update(s, entry);
    bool keep = partial || qc_mw_is_own_zero(s, entry);
    if (keep) {
        qc_cache_put(&s->l2_cache, table);
        a->nb = 1;
    } else {
        ret = mw_count_run(n, c0, end, table, &a->nb);
        if (ret < 0) {
            free_alloc(a);
            return ret;
        }
    }
    assert(a->nb >= 1);
    return mw_allocate(n, a, off, end, entry, partial, keep, ext);
}

_Static_assert(BI_DBG__MAX <= 64, "map_events holds one bit per event");

int qcow2_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                 struct bi_extent *ext)
{
    qcow2_state *s = n->opaque;
    memset(ext, 0, sizeof(*ext));
    if (len == 0)
        return -EINVAL;
    if (s->crypt_method && !s->crypt)
        return -EIO; /* opened for metadata only: no key */
    if (!(flags & BI_MAP_WRITE))
        return map_read(n, off, len, ext);
    if (s->read_only)
        return -EROFS;
    if (s->corrupt)
        return -EIO;
    bi_co_mutex_lock(&s->lock);
    s->map_events = 0;
    int ret = qc_before_write(n);
    if (ret == 0)
        ret = map_write_locked(n, off, len, ext);
    if (ret == 0)
        ret = qc_bitmaps_mark(n, off, ext->len); /* before the data */
    uint64_t events = ret == 0 ? s->map_events : 0;
    s->map_events = 0;
    bi_co_mutex_unlock(&s->lock);
    if (events & (1ULL << BI_DBG_COW_WRITE))
        bi_debug_event(n->file, BI_DBG_COW_WRITE);
    if (events & (1ULL << BI_DBG_WRITE_AIO))
        bi_debug_event(n->file, BI_DBG_WRITE_AIO);
    return ret;
}

static uint32_t touched_mask(const qcow2_state *s, uint64_t cstart, uint64_t a,
                             uint64_t b)
{
    /* subclusters of the cluster at cstart overlapping [a, b) */
    uint64_t lo = BI_MAX(a, cstart), hi = BI_MIN(b, cstart + s->cluster_size);
    if (lo >= hi)
        return 0;
    unsigned f = sc_index(s, lo), l = sc_index(s, hi - 1);
    uint32_t m = 0;
    for (unsigned i = f; i <= l; i++)
        m |= 1u << i;
    return m;
}

int qcow2_co_write_done(bi_node *n, struct bi_extent *ext, int ret)
{
    qcow2_state *s = n->opaque;
    struct qc_alloc *a = ext->cookie;
    bi_free_aligned(ext->cow_head);
    bi_free_aligned(ext->cow_tail);
    ext->cow_head = ext->cow_tail = NULL;
    ext->cookie = NULL;
    if (!a)
        return ret;
    uint64_t cs = s->cluster_size;
    bi_co_mutex_lock(&s->lock);
    if (ret < 0) {
        if (a->allocated)
            qc_update_refcount(n, a->host, a->nb * cs, -1);
        goto out;
    }
    /* guest range actually written, for subcluster bitmaps */
    uint64_t gstart = a->guest + (a->wstart - a->host);
    uint64_t gend = a->guest + (a->wend - a->host);
    for (uint64_t j = 0; j < a->nb; j++) {
        uint64_t g = a->guest + j * cs;
        void *table;
        uint64_t idx;
        ret = qc_get_l2_table(n, g, true, &table, &idx);
        if (ret < 0)
            goto out;
        uint64_t cur, curb;
        qc_get_l2(s, table, idx, &cur, &curb);
        uint64_t ne = (a->host + j * cs) | QCOW_OFLAG_COPIED;
        if (qc_has_data_file(s))
            ne = g | QCOW_OFLAG_COPIED;
        uint64_t nbm = 0;
        if (s->ext_l2) {
            uint32_t m = touched_mask(s, g, gstart, gend);
            uint32_t alloc = (uint32_t)curb, zero = (uint32_t)(curb >> 32);
            if (a->allocated && !(cur & QCOW_OFLAG_COMPRESSED) &&
                entry_host(s, cur) && !(cur & QCOW_OFLAG_COPIED)) {
                /* COW of a shared cluster: whole cluster was copied */
                m |= alloc;
            } else if (cur & QCOW_OFLAG_COMPRESSED) {
                m = 0xffffffffu;
                alloc = zero = 0;
            }
            alloc |= m;
            zero &= ~m;
            nbm = (uint64_t)alloc | ((uint64_t)zero << 32);
        }
        qc_set_l2(s, table, idx, ne, nbm);
        qc_cache_mark_dirty(&s->l2_cache, table);
        qc_cache_put(&s->l2_cache, table);
        /* the old host cluster loses this reference */
        if (cur != ne || a->allocated) {
            if ((cur & QCOW_OFLAG_COMPRESSED) ||
                (entry_host(s, cur) && entry_host(s, cur) != entry_host(s, ne)))
                qc_free_l2_entry_clusters(n, cur);
        }
    }
    if (n->cache == BI_CACHE_WRITETHROUGH || n->cache == BI_CACHE_DIRECTSYNC)
        ret = qc_flush_metadata(n);
    else
        ret = 0;
out:
    bi_co_mutex_unlock(&s->lock);
    free_alloc(a);
    return ret;
}

/* Writes the extent ext of the write at guest offset off (its plaintext
 * in iov: COW head, data, COW tail) encrypted, through a bounce buffer. */
static int write_encrypted(bi_node *n, const struct bi_extent *ext,
                           const struct iovec *iov, int cnt, uint64_t off)
{
    qcow2_state *s = n->opaque;
    uint64_t total = ext->cow_head_len + ext->len + ext->cow_tail_len;
    uint64_t h0 = ext->host_offset - ext->cow_head_len;
    uint8_t *b = bi_blockalign(ext->host, total);
    if (!b)
        return -ENOMEM;
    bi_iov_to_buf(iov, cnt, 0, b, total);
    int ret = qc_crypt_buf(s, true, off - ext->cow_head_len, h0, b, total);
    if (ret == 0)
        ret = bi_co_pwrite(ext->host, h0, b, total, BI_REQ_NO_DETECT_ZEROES);
    explicit_bzero(b, total);
    bi_free_aligned(b);
    return ret;
}

/* An allocating write done by the driver itself (zero fallback, v2 zero
 * writes, uncompressible clusters): map, write head+data+tail, commit. */
static int qc_write_buf(bi_node *n, uint64_t off, const void *buf, uint64_t len)
{
    while (len) {
        struct bi_extent ext;
        int ret = qcow2_co_map(n, off, len, BI_MAP_WRITE, &ext);
        if (ret < 0)
            return ret;
        struct iovec iov[3];
        int cnt = 0;
        if (ext.cow_head_len)
            iov[cnt++] = (struct iovec){ext.cow_head, ext.cow_head_len};
        iov[cnt++] = (struct iovec){(void *)buf, ext.len};
        if (ext.cow_tail_len)
            iov[cnt++] = (struct iovec){ext.cow_tail, ext.cow_tail_len};
        uint64_t total = ext.cow_head_len + ext.len + ext.cow_tail_len;
        if (ext.crypt)
            ret = write_encrypted(n, &ext, iov, cnt, off);
        else
            ret = bi_co_pwritev(ext.host, ext.host_offset - ext.cow_head_len,
                                total, iov, cnt, 0);
        ret = qcow2_co_write_done(n, &ext, ret);
        if (ret < 0)
            return ret;
        off += ext.len;
        buf = (const uint8_t *)buf + ext.len;
        len -= ext.len;
    }
    return 0;
}

/* Zeroes [off, off + len) of an encrypted image whose ends are not on
 * encryption sectors: the whole sectors around it are read, zeroed in
 * the range and written back (encrypted by qc_write_buf). */
static int write_zero_sectors(bi_node *n, uint64_t off, uint64_t len)
{
    uint64_t a = bi_align_down(off, 512), e = bi_align_up(off + len, 512);
    uint64_t in = BI_MIN(e, n->size) - a;
    uint8_t *buf = bi_blockalign(n->file, e - a);
    if (!buf)
        return -ENOMEM;
    memset(buf, 0, e - a);
    int ret = bi_co_pread(n, a, buf, in);
    if (ret == 0) {
        memset(buf + (off - a), 0, len);
        ret = qc_write_buf(n, a, buf, e - a);
    }
    explicit_bzero(buf, e - a);
    bi_free_aligned(buf);
    return ret;
}

static int write_zero_buf(bi_node *n, uint64_t off, uint64_t len)
{
    qcow2_state *s = n->opaque;
    if (s->crypt && (off % 512 || len % 512))
        return write_zero_sectors(n, off, len);
    uint64_t chunk = BI_MIN(len, 1ULL << 20);
    void *z = bi_blockalign(n->file, chunk);
    if (!z)
        return -ENOMEM;
    memset(z, 0, chunk);
    int ret = 0;
    while (len && ret == 0) {
        uint64_t l = BI_MIN(len, chunk);
        ret = qc_write_buf(n, off, z, l);
        off += l;
        len -= l;
    }
    bi_free_aligned(z);
    return ret;
}

/* Sets [off, off+len) (subcluster aligned, within one cluster run) to
 * zero or unallocated in the L2 tables. */
static int zero_units_locked(bi_node *n, uint64_t off, uint64_t len, bool unmap,
                             bool discard)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t pos = off, end = off + len;
    int ret = 0;
    while (pos < end) {
        uint64_t c = qc_start_of_cluster(s, pos);
        uint64_t cend = BI_MIN(end, c + cs);
        void *table;
        uint64_t idx;
        if (discard) {
            ret = get_l2_ro(n, pos, &table, &idx);
            if (ret < 0)
                return ret;
            if (!table) {
                /* nothing allocated: v3 discard still records zeroes
                 * only when a backing file could show through */
                if (!(s->version >= 3 && n->backing)) {
                    uint64_t span = 1ULL << (s->l2_bits + s->cluster_bits);
                    pos = BI_MIN(end, (pos | (span - 1)) + 1);
                    continue;
                }
                ret = qc_get_l2_table(n, pos, true, &table, &idx);
                if (ret < 0)
                    return ret;
            } else {
                qc_cache_put(&s->l2_cache, table);
                ret = qc_get_l2_table(n, pos, true, &table, &idx);
                if (ret < 0)
                    return ret;
            }
        } else {
            ret = qc_get_l2_table(n, pos, true, &table, &idx);
            if (ret < 0)
                return ret;
        }
        uint64_t e, b;
        qc_get_l2(s, table, idx, &e, &b);
        uint64_t ne = e, nb = b;
        bool full = pos == c && cend == c + cs;
        bool host_ok = (e & QCOW_OFLAG_COPIED) &&
                       !(e & QCOW_OFLAG_COMPRESSED) &&
                       (entry_host(s, e) || qc_has_data_file(s));
        bool drop = false;
        if (!s->ext_l2) {
            if (discard) {
                bool allocated = (e & QCOW_OFLAG_COMPRESSED) ||
                                 entry_host(s, e) || (e & QCOW_OFLAG_ZERO);
                if (allocated || n->backing) {
                    ne = s->version >= 3 ? QCOW_OFLAG_ZERO : 0;
                    drop = true;
                }
            } else if (host_ok && !unmap) {
                ne = e | QCOW_OFLAG_ZERO; /* keep the preallocation */
            } else {
                ne = QCOW_OFLAG_ZERO;
                drop = true;
            }
        } else {
            uint32_t m = touched_mask(s, c, pos, cend);
            uint32_t alloc = (uint32_t)b, zero = (uint32_t)(b >> 32);
            if (e & QCOW_OFLAG_COMPRESSED) {
                if (full) {
                    ne = 0;
                    alloc = 0;
                    zero = 0xffffffffu;
                    drop = true;
                } else {
                    qc_cache_put(&s->l2_cache, table);
                    return -ENOTSUP; /* caller writes explicit zeroes */
                }
            } else if (full && (unmap || discard || !host_ok)) {
                ne = 0;
                alloc = 0;
                zero = 0xffffffffu;
                drop = entry_host(s, e) || qc_has_data_file(s);
            } else if (!host_ok && entry_host(s, e)) {
                /* shared cluster, partial: keep it, explicit zeroes */
                qc_cache_put(&s->l2_cache, table);
                return -ENOTSUP;
            } else {
                alloc &= ~m;
                zero |= m;
            }
            nb = (uint64_t)alloc | ((uint64_t)zero << 32);
        }
        if (ne != e || nb != b) {
            qc_set_l2(s, table, idx, ne, nb);
            qc_cache_mark_dirty(&s->l2_cache, table);
            if (drop && !qc_has_data_file(s) &&
                ((e & QCOW_OFLAG_COMPRESSED) || entry_host(s, e)))
                qc_free_l2_entry_clusters(n, e);
        }
        qc_cache_put(&s->l2_cache, table);
        pos = cend;
    }
    return 0;
}

/* Whether guest [off, off+len) (inside one cluster) is unallocated, so
 * that it reads as zeroes in an image without a backing file. */
static int v2_unallocated(bi_node *n, uint64_t off, uint64_t len, bool *yes)
{
    struct bi_extent ext;
    memset(&ext, 0, sizeof(ext));
    int ret = qcow2_co_map(n, off, len, BI_MAP_READ, &ext);
    if (ret < 0)
        return ret;
    *yes = ext.kind == BI_EXT_UNALLOC && ext.len >= len;
    return 0;
}

/* A partial cluster of a zero write to a v2 image without a backing file
 * (QEMU's qcow2_co_pwrite_zeroes): an unallocated cluster already reads
 * as zeroes and stays unallocated; any other gets zeroes written. */
static int v2_zero_partial(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    bool unalloc = false;
    int ret = len ? v2_unallocated(n, off, len, &unalloc) : 0;
    if (ret < 0 || !len || unalloc)
        return ret;
    if (flags & BI_REQ_NO_FALLBACK)
        return -ENOTSUP;
    return write_zero_buf(n, off, len);
}

/* Zero writes to a v2 (compat=0.10) image without a backing file, as QEMU
 * 7.2 does them: v2 has no zero flag, so whole clusters are discarded
 * (unallocated clusters read as zeroes) and partial ones are handled by
 * v2_zero_partial. [a, b) are the whole clusters of [off, off+len). */
static int v2_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, uint64_t a,
                            uint64_t b, int flags)
{
    qcow2_state *s = n->opaque;
    if (a >= b) /* inside one cluster, or across two partial ones */
        a = b = bi_align_up(off, s->cluster_size);
    if (a > off + len)
        a = b = off + len;
    int ret = v2_zero_partial(n, off, a - off, flags);
    if (ret == 0 && b < off + len)
        ret = v2_zero_partial(n, b, off + len - b, flags);
    if (ret < 0 || a >= b)
        return ret;
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret == 0)
        ret = qc_bitmaps_mark(n, off, len);
    if (ret == 0)
        ret = zero_units_locked(n, a, b - a, true, true);
    if (ret == 0 &&
        (n->cache == BI_CACHE_WRITETHROUGH || n->cache == BI_CACHE_DIRECTSYNC))
        ret = qc_flush_metadata(n);
    bi_co_mutex_unlock(&s->lock);
    if (ret == -ENOTSUP) /* not expected for v2: zeroes, then */
        ret = write_zero_buf(n, a, BI_MIN(b, n->size) - a);
    return ret;
}

int qcow2_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    qcow2_state *s = n->opaque;
    if (s->read_only)
        return -EROFS;
    if (s->corrupt)
        return -EIO;
    if (off >= n->size)
        return 0;
    if (len > n->size - off)
        len = n->size - off;
    uint64_t unit = s->ext_l2 ? s->subcluster_size : s->cluster_size;
    uint64_t a = bi_align_up(off, unit);
    uint64_t b = bi_align_down(off + len, unit);
    /* the last partial cluster at the end of the image counts as whole */
    if (off + len == n->size)
        b = bi_align_up(off + len, unit);
    int ret = 0;
    if (s->version < 3 && !n->backing)
        return v2_pwrite_zeroes(n, off, len, a, b, flags);
    if (s->version < 3 || a >= b) {
        if (flags & BI_REQ_NO_FALLBACK)
            return -ENOTSUP;
        return write_zero_buf(n, off, len);
    }
    if (a > off) {
        ret = write_zero_buf(n, off, a - off);
        if (ret < 0)
            return ret;
    }
    if (s->data_file_raw) {
        uint64_t dl = BI_MIN(b, n->size) - a;
        ret = bi_co_pwrite_zeroes(s->data_file, a, dl, flags);
        if (ret < 0)
            return ret;
    }
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret == 0)
        ret = qc_bitmaps_mark(n, off, len);
    if (ret == 0)
        ret = zero_units_locked(n, a, b - a, (flags & BI_REQ_MAY_UNMAP) != 0,
                                false);
    if (ret == 0 &&
        (n->cache == BI_CACHE_WRITETHROUGH || n->cache == BI_CACHE_DIRECTSYNC))
        ret = qc_flush_metadata(n);
    bi_co_mutex_unlock(&s->lock);
    if (ret == -ENOTSUP)
        ret = write_zero_buf(n, a, BI_MIN(b, n->size) - a);
    if (ret < 0)
        return ret;
    if (off + len > b && b < n->size)
        ret = write_zero_buf(n, b, off + len - b);
    return ret;
}

int qcow2_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    qcow2_state *s = n->opaque;
    if (s->read_only)
        return -EROFS;
    if (s->corrupt)
        return -EIO;
    if (off >= n->size)
        return 0;
    if (len > n->size - off)
        len = n->size - off;
    uint64_t a = bi_align_up(off, s->cluster_size);
    uint64_t b = bi_align_down(off + len, s->cluster_size);
    if (off + len == n->size)
        b = bi_align_up(off + len, s->cluster_size);
    bi_co_mutex_lock(&s->lock);
    int ret = qc_before_write(n);
    if (ret == 0) /* QEMU marks the whole request, even partial clusters */
        ret = qc_bitmaps_mark(n, off, len);
    if (ret == 0 && a >= b) {
        bi_co_mutex_unlock(&s->lock);
        return 0; /* partial clusters are not discarded, as in QEMU */
    }
    if (ret == 0)
        ret = zero_units_locked(n, a, b - a, true, true);
    if (ret == -ENOTSUP)
        ret = 0;
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* ------------------------------------------------------- compressed write */

/* A compressed write is done a slice of clusters at a time: the slice's
 * clusters are compressed at once on several threads, then host space is
 * taken for them in guest order (one ticket per slice, in arrival order,
 * so concurrent callers' slices are laid out in the order they came), then
 * host-contiguous pieces go out in one write each, then the L2 entries. */
#define COMP_SLICE_BYTES (1u << 20)
#define COMP_JOBS_MAX 16
#define COMP_IOV_MAX 256

struct comp_batch {
    int type;
    uint64_t cs;
    const uint8_t *buf;  /* the caller's clusters */
    const uint8_t *last; /* the last cluster padded with zeroes, or NULL */
    unsigned k;          /* clusters */
    uint8_t *dst;        /* k * cs: compressed cluster i at i * cs */
    long *out;           /* compressed size of cluster i, or -errno */
};

struct comp_job {
    struct comp_batch *b;
    unsigned first, end;
};

static const uint8_t *comp_src(const struct comp_batch *b, unsigned i)
{
    return (i == b->k - 1 && b->last) ? b->last : b->buf + i * b->cs;
}

static int comp_fn(void *arg)
{
    struct comp_job *j = arg;
    struct comp_batch *b = j->b;
    for (unsigned i = j->first; i < j->end; i++)
        b->out[i] = qc_compress(b->type, comp_src(b, i), b->cs,
                                b->dst + i * b->cs, b->cs - 1);
    return 0;
}

/* Jobs a slice is cut into: the CPUs this process may run on. */
static int comp_jobs(void)
{
    static int n;
    if (!n) {
        cpu_set_t set;
        long c = sched_getaffinity(0, sizeof(set), &set) == 0
                     ? CPU_COUNT(&set)
                     : sysconf(_SC_NPROCESSORS_ONLN);
        n = (int)BI_MAX(1, BI_MIN(c, COMP_JOBS_MAX));
    }
    return n;
}

/* Compresses every cluster of the batch, on up to comp_jobs() threads. */
static int comp_run(struct comp_batch *b)
{
    int nj = (int)BI_MIN((unsigned)comp_jobs(), b->k);
    struct comp_job jobs[COMP_JOBS_MAX];
    void *args[COMP_JOBS_MAX];
    for (int j = 0; j < nj; j++) {
        jobs[j] = (struct comp_job){b, (unsigned)((uint64_t)b->k * j / nj),
                                    (unsigned)((uint64_t)b->k * (j + 1) / nj)};
        args[j] = &jobs[j];
    }
    return bi_run_in_threads(comp_fn, args, nj);
}

static void comp_turn_wait(qcow2_state *s, uint64_t ticket)
{
    while (s->comp_turn != ticket)
        bi_co_queue_wait(&s->comp_wait);
}

static void comp_turn_pass(qcow2_state *s)
{
    s->comp_turn++;
    bi_co_queue_wake_all(&s->comp_wait);
}

/* One cluster of a slice, once host space is taken: compressed bytes at
 * host, or (did not compress) an ordinary allocating write mapped in ext. */
struct comp_piece {
    uint64_t goff;
    bool plain;
    bool mapped;
    uint64_t host, total; /* bytes written at host */
    bi_node *node;
    uint64_t csize;
    struct bi_extent ext;
    struct iovec iov[3];
    int cnt;
    int ret;
};

/* Takes host space for cluster i (the caller has the turn). */
static int comp_place(bi_node *n, const struct comp_batch *b, unsigned i,
                      uint64_t off, struct comp_piece *p)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = b->cs;
    uint64_t glen = BI_MIN(cs, n->size - off);
    int ret;
    p->goff = off;
    if (b->out[i] == -ENOSPC) {
        /* does not compress: stored as ordinary data */
        p->plain = true;
        ret = qcow2_co_map(n, off, glen, BI_MAP_WRITE, &p->ext);
        if (ret < 0)
            return ret;
        p->mapped = true;
        p->node = p->ext.host;
        p->host = p->ext.host_offset - p->ext.cow_head_len;
        if (p->ext.cow_head_len)
            p->iov[p->cnt++] =
                (struct iovec){p->ext.cow_head, p->ext.cow_head_len};
        p->iov[p->cnt++] = (struct iovec){(void *)comp_src(b, i), p->ext.len};
        if (p->ext.cow_tail_len)
            p->iov[p->cnt++] =
                (struct iovec){p->ext.cow_tail, p->ext.cow_tail_len};
        p->total = p->ext.cow_head_len + p->ext.len + p->ext.cow_tail_len;
        return 0;
    }
    if (b->out[i] < 0)
        return (int)b->out[i];
    p->csize = (uint64_t)b->out[i];
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret == 0)
        ret = qc_bitmaps_mark(n, off, glen);
    if (ret == 0) {
        /* as QEMU: the L2 table (allocated if missing) before the bytes,
         * so the file is laid out as qemu-img lays it out */
        void *t0;
        uint64_t i0, e, bm;
        ret = qc_get_l2_table(n, off, true, &t0, &i0);
        if (ret == 0) {
            /* as QEMU: compressed data never overwrites a cluster */
            qc_get_l2(s, t0, i0, &e, &bm);
            if (e & L2E_OFFSET_MASK)
                ret = -EIO;
            qc_cache_put(&s->l2_cache, t0);
        }
    }
    int64_t host = ret < 0 ? ret : qc_alloc_bytes(n, p->csize);
    if (host < 0) {
        bi_co_mutex_unlock(&s->lock);
        return (int)host;
    }
    p->mapped = true;
    p->node = n->file;
    p->host = (uint64_t)host;
    p->total = p->csize;
    p->iov[p->cnt++] = (struct iovec){b->dst + i * cs, p->csize};
    ret = qc_check_overlap(n, 0, p->host, p->csize);
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* Commits a placed piece (its bytes written with result p->ret), or
 * gives its host space back if they were not. */
static int comp_finish(bi_node *n, struct comp_piece *p)
{
    qcow2_state *s = n->opaque;
    if (p->plain)
        return qcow2_co_write_done(n, &p->ext, p->ret);
    uint64_t nsec = ((p->host + p->csize - 1) >> 9) - (p->host >> 9);
    int ret = p->ret;
    bi_co_mutex_lock(&s->lock);
    if (ret < 0) {
        qc_update_refcount(n, p->host & ~511ULL, (nsec + 1) * 512, -1);
        bi_co_mutex_unlock(&s->lock);
        return ret;
    }
    void *table;
    uint64_t idx;
    bi_debug_event(n->file, BI_DBG_L2_UPDATE_COMPRESSED);
    ret = qc_get_l2_table(n, p->goff, true, &table, &idx);
    if (ret == 0) {
        /* the entry held no cluster (comp_place): nothing to free */
        uint64_t ne =
            p->host | (nsec << s->csize_shift) | QCOW_OFLAG_COMPRESSED;
        qc_set_l2(s, table, idx, ne, 0);
        qc_cache_mark_dirty(&s->l2_cache, table);
        qc_cache_put(&s->l2_cache, table);
    }
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* Writes the placed pieces, host-contiguous runs in one request each. */
static void comp_write(struct comp_piece *pc, unsigned k)
{
    struct iovec iov[COMP_IOV_MAX];
    for (unsigned i = 0; i < k;) {
        unsigned j = i;
        int cnt = 0;
        uint64_t total = 0;
        while (j < k && pc[j].node == pc[i].node &&
               pc[j].host == pc[i].host + total &&
               cnt + pc[j].cnt <= COMP_IOV_MAX) {
            memcpy(iov + cnt, pc[j].iov, sizeof(iov[0]) * (size_t)pc[j].cnt);
            cnt += pc[j].cnt;
            total += pc[j].total;
            j++;
        }
        bi_debug_event(pc[i].node, BI_DBG_WRITE_COMPRESSED);
        int ret = bi_co_pwritev(pc[i].node, pc[i].host, total, iov, cnt, 0);
        for (; i < j; i++)
            pc[i].ret = ret;
    }
}

static uint64_t comp_slice_bytes(const qcow2_state *s)
{
    return BI_MAX(s->cluster_size,
                  bi_align_down(COMP_SLICE_BYTES, s->cluster_size));
}

void qc_comp_bufs_free(qcow2_state *s)
{
    while (s->n_comp_bufs)
        bi_free_aligned(s->comp_bufs[--s->n_comp_bufs]);
}

/* An output buffer for a slice: a kept one, or a new one. */
static uint8_t *comp_buf_get(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (s->n_comp_bufs)
        return s->comp_bufs[--s->n_comp_bufs];
    return bi_blockalign(n->file, comp_slice_bytes(s));
}

static void comp_buf_put(qcow2_state *s, uint8_t *p)
{
    if (p && s->n_comp_bufs < QC_COMP_BUFS_KEEP)
        s->comp_bufs[s->n_comp_bufs++] = p;
    else
        bi_free_aligned(p);
}

static int comp_slice(bi_node *n, uint64_t off, const uint8_t *buf,
                      uint64_t len)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    unsigned k = (unsigned)((len + cs - 1) / cs);
    struct comp_batch b = {
        .type = (int)s->compression_type, .cs = cs, .buf = buf, .k = k};
    uint8_t *last = NULL;
    struct comp_piece *pc = calloc(k, sizeof(*pc));
    b.out = calloc(k, sizeof(*b.out));
    b.dst = comp_buf_get(n);
    if (len % cs) {
        last = bi_blockalign(n->file, cs);
        if (last) {
            memset(last, 0, cs);
            memcpy(last, buf + (k - 1) * cs, len % cs);
        }
        b.last = last;
    }
    int ret = -ENOMEM;
    uint64_t ticket = s->comp_ticket++;
    if (pc && b.out && b.dst && (last || !(len % cs)))
        ret = comp_run(&b);
    comp_turn_wait(s, ticket);
    unsigned placed = 0;
    while (ret == 0 && placed < k) {
        ret = comp_place(n, &b, placed, off + placed * cs, &pc[placed]);
        if (ret == 0)
            placed++;
    }
    comp_turn_pass(s); /* the next slice is placed while this one writes */
    if (ret < 0 && pc && placed < k && pc[placed].mapped) {
        pc[placed].ret = ret; /* half placed: give its space back */
        comp_finish(n, &pc[placed]);
    }
    /* as QEMU, the clusters before one that fails are still written */
    comp_write(pc, placed);
    for (unsigned i = 0; i < placed; i++) {
        int r = comp_finish(n, &pc[i]);
        if (r < 0 && ret == 0)
            ret = r;
    }
    bi_free_aligned(last);
    comp_buf_put(s, b.dst);
    free(b.out);
    free(pc);
    return ret;
}

int qcow2_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                               uint64_t len)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    if (s->read_only)
        return -EROFS;
    if (qc_has_data_file(s))
        return -ENOTSUP;
    if (off & (cs - 1))
        return -EINVAL;
    if (len == 0) {
        /* as QEMU: the end of the file goes to a sector boundary, which
         * compressed data leaves anywhere */
        int64_t flen = bi_getlength(n->file);
        if (flen < 0)
            return (int)flen;
        if (!((uint64_t)flen & 511))
            return 0;
        bi_error e;
        bi_error_init(&e);
        return bi_truncate(n->file, bi_align_up((uint64_t)flen, 512), false,
                           BI_PREALLOC_OFF, &e);
    }
    if ((len % cs) && off + len != n->size)
        return -EINVAL;
    uint64_t slice = comp_slice_bytes(s); /* whole clusters, at least one */
    for (uint64_t done = 0; done < len;) {
        uint64_t l = BI_MIN(slice, len - done);
        int ret = comp_slice(n, off + done, (const uint8_t *)buf + done, l);
        if (ret < 0)
            return ret;
        done += l;
    }
    return 0;
}

/* ------------------------------------------------------------- truncate */

int qc_grow_l1(bi_node *n, uint64_t min_size)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    if (min_size <= s->l1_size)
        return 0;
    if (min_size > QCOW2_MAX_L1_BYTES / 8)
        return -EFBIG;
    uint64_t new_size = min_size;
    uint64_t bytes = bi_align_up(new_size * 8, cs);
    uint64_t *nt = calloc(bytes / 8, 8);
    if (!nt)
        return -ENOMEM;
    memcpy(nt, s->l1_table, (uint64_t)s->l1_size * 8);
    bi_debug_event(n->file, BI_DBG_L1_GROW_ALLOC_TABLE);
    int64_t off = qc_alloc_clusters(n, bytes / cs);
    if (off < 0) {
        free(nt);
        return (int)off;
    }
    uint64_t *be = calloc(bytes / 8, 8);
    if (!be) {
        free(nt);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < bytes / 8; i++)
        be[i] = htobe64(nt[i]);
    /* refcounts of the new table first, then the table, then the header */
    bi_debug_event(n->file, BI_DBG_L1_GROW_WRITE_TABLE);
    int ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret == 0)
        ret = qc_check_overlap(n, 0, (uint64_t)off, bytes);
    if (ret == 0)
        /* the entries only, as QEMU (the rest of the cluster is never
         * read; the file does not get a cluster of zeroes) */
        ret = bi_co_pwrite(n->file, (uint64_t)off, be, new_size * 8, 0);
    free(be);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0) {
        free(nt);
        qc_update_refcount(n, (uint64_t)off, bytes, -1);
        return ret;
    }
    uint8_t h[12];
    uint32_t sz = htobe32((uint32_t)new_size);
    uint64_t o = htobe64((uint64_t)off);
    memcpy(h, &sz, 4);
    memcpy(h + 4, &o, 8);
    bi_debug_event(n->file, BI_DBG_L1_GROW_ACTIVATE_TABLE);
    ret = qc_write_header_field(n, QH_L1_SIZE, h, 12);
    if (ret < 0) {
        free(nt);
        qc_update_refcount(n, (uint64_t)off, bytes, -1);
        return ret;
    }
    uint64_t old_off = s->l1_table_offset;
    uint64_t old_bytes = bi_align_up((uint64_t)s->l1_size * 8, cs);
    free(s->l1_table);
    s->l1_table = nt;
    s->l1_alloc = (uint32_t)(bytes / 8);
    s->l1_size = (uint32_t)new_size;
    s->l1_table_offset = (uint64_t)off;
    if (old_off && old_bytes)
        qc_update_refcount(n, old_off, old_bytes, -1);
    return 0;
}

/* Host clusters (not compressed) mapped in [from, to), to discard once
 * they are freed. */
static int collect_hosts(bi_node *n, uint64_t from, uint64_t to, uint64_t **out,
                         size_t *count)
{
    qcow2_state *s = n->opaque;
    size_t cap = 0;
    for (uint64_t pos = from; pos < to;) {
        void *t;
        uint64_t idx;
        int ret = get_l2_ro(n, pos, &t, &idx);
        if (ret < 0)
            return ret;
        uint64_t span_end =
            (pos | ((s->l2_entries << s->cluster_bits) - 1)) + 1;
        if (!t) {
            pos = span_end;
            continue;
        }
        for (; pos < to && pos < span_end; pos += s->cluster_size, idx++) {
            uint64_t e, b;
            qc_get_l2(s, t, idx, &e, &b);
            if ((e & QCOW_OFLAG_COMPRESSED) || !entry_host(s, e))
                continue;
            if (*count == cap) {
                size_t nc = cap ? cap * 2 : 256;
                uint64_t *nv = realloc(*out, nc * sizeof(**out));
                if (!nv) {
                    qc_cache_put(&s->l2_cache, t);
                    return -ENOMEM;
                }
                *out = nv;
                cap = nc;
            }
            (*out)[(*count)++] = entry_host(s, e);
        }
        qc_cache_put(&s->l2_cache, t);
    }
    return 0;
}

/* QEMU's qcow2_shrink_l1_table: the L1 entries past the new end are
 * zeroed on disk (the table keeps its size), then their L2 tables are freed
 * and discarded. Lock held, L2 tables flushed. */
static int shrink_l1_locked(bi_node *n, uint64_t size)
{
    qcow2_state *s = n->opaque;
    uint64_t span = 1ULL << (s->l2_bits + s->cluster_bits);
    uint64_t keep = (size + span - 1) / span;
    if (keep >= s->l1_size)
        return 0;
    uint64_t len = ((uint64_t)s->l1_size - keep) * 8;
    bi_debug_event(n->file, BI_DBG_L1_SHRINK_WRITE_TABLE);
    int ret = qc_check_overlap(n, QC_OL_L1, s->l1_table_offset + keep * 8, len);
    if (ret == 0)
        ret =
            bi_co_pwrite_zeroes(n->file, s->l1_table_offset + keep * 8, len, 0);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        return ret;
    bi_debug_event(n->file, BI_DBG_L1_SHRINK_FREE_L2_CLUSTERS);
    for (uint64_t i = s->l1_size; i-- > keep;) {
        uint64_t l2 = s->l1_table[i] & L1E_OFFSET_MASK;
        s->l1_table[i] = 0;
        if (!l2)
            continue;
        ret = qc_update_refcount(n, l2, s->cluster_size, -1);
        if (ret < 0)
            return ret;
        uint64_t rc;
        if (qc_get_refcount(n, l2 >> s->cluster_bits, &rc) == 0 && !rc)
            bi_co_pdiscard(n->file, l2, s->cluster_size);
    }
    return qc_flush_metadata(n);
}

/* The checks of a resize before anything is read or written, in QEMU's
 * order and words. 0 or -errno with err set. */
static int truncate_check(bi_node *n, uint64_t size, enum bi_prealloc prealloc,
                          bi_error *err)
{
    qcow2_state *s = n->opaque;
    if (s->read_only) {
        bi_error_set(err, EROFS, "Cannot resize a read-only image");
        return -EROFS;
    }
    if (prealloc != BI_PREALLOC_OFF && prealloc != BI_PREALLOC_METADATA &&
        prealloc != BI_PREALLOC_FALLOC && prealloc != BI_PREALLOC_FULL) {
        return bi_error_setc(err, -ENOTSUP,
                             "Unsupported preallocation mode '%s'",
                             bi_prealloc_name(prealloc));
    }
    if (size % 512)
        return bi_error_setc(err, -EINVAL,
                             "The new size must be a multiple of 512");
    /* the snapshot table of v2 images need not record the disk size */
    if (s->nb_snapshots && s->version < 3)
        return bi_error_setc(err, -ENOTSUP,
                             "Can't resize a v2 image which has snapshots");
    if (size > INT64_MAX) {
        bi_error_set(err, EFBIG, "Image size too large");
        return -EFBIG;
    }
    if (size < n->size && prealloc != BI_PREALLOC_OFF) {
        return bi_error_setc(
            err, -EINVAL, "Preallocation can't be used for shrinking an image");
    }
    return 0;
}

/* Growing with preallocation: the guest bytes of the old partial last
 * cluster, which preallocation carries into the new cluster. *head is NULL
 * (and *head_len 0) when there are none; else bi_free_aligned it.
 * 0 or -errno with err set. */
static int truncate_read_head(bi_node *n, uint64_t size,
                              enum bi_prealloc prealloc, uint8_t **head,
                              uint64_t *head_len, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t old_len = n->size, len = qc_offset_into_cluster(s, old_len);
    *head = NULL;
    *head_len = 0;
    if (size <= old_len || prealloc == BI_PREALLOC_OFF || !len)
        return 0;
    uint8_t *buf = bi_blockalign(n->file, bi_align_up(len, 4096));
    if (!buf)
        return -ENOMEM;
    int ret = bi_co_pread(n, old_len - len, buf, len);
    if (ret < 0) {
        bi_free_aligned(buf);
        bi_error_set(err, -ret, "Could not read the last cluster");
        return ret;
    }
    *head = buf;
    *head_len = len;
    return 0;
}

/* Shrinking: every cluster wholly past size is zeroed (freed) and its L2
 * entry cleared; the host clusters it used are returned in *dropped
 * (*n_dropped of them, free() it) to be discarded once the tables without
 * them are on disk. Lock held. 0 or -errno with err set. */
static int truncate_drop_tail_locked(bi_node *n, uint64_t size,
                                     uint64_t **dropped, size_t *n_dropped,
                                     bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t a = bi_align_up(size, s->cluster_size);
    int ret;
    if (a >= n->size)
        return 0;
    if (!s->data_file) {
        ret = collect_hosts(n, a, n->size, dropped, n_dropped);
        if (ret < 0) {
            bi_error_set(err, -ret, "Failed to discard cropped clusters");
            return ret;
        }
    }
    ret = zero_units_locked(n, a, bi_align_up(n->size, s->cluster_size) - a,
                            true, false);
    if (ret < 0) { /* QEMU's words for its discard of the tail */
        bi_error_set(err, -ret, "Failed to discard cropped clusters");
        return ret;
    }
    /* zero flags past the end are meaningless: unallocate */
    for (uint64_t pos = a; pos < n->size; pos += s->cluster_size) {
        void *t;
        uint64_t idx;
        ret = get_l2_ro(n, pos, &t, &idx);
        if (ret < 0)
            return ret;
        if (t) {
            qc_set_l2(s, t, idx, 0, 0);
            qc_cache_mark_dirty(&s->l2_cache, t);
            qc_cache_put(&s->l2_cache, t);
        }
    }
    return 0;
}

/* As QEMU: the clusters a shrink dropped are discarded in the file once
 * the tables without them are on disk, those no longer referenced only.
 * Lock held, metadata flushed. 0 or -errno. */
static int truncate_discard_dropped_locked(bi_node *n, const uint64_t *dropped,
                                           size_t n_dropped)
{
    qcow2_state *s = n->opaque;
    if (!n_dropped)
        return 0;
    int ret = bi_co_flush(n->file);
    if (ret < 0)
        return ret;
    for (size_t i = 0; i < n_dropped; i++) {
        uint64_t rc;
        if (qc_get_refcount(n, dropped[i] >> s->cluster_bits, &rc) == 0 && !rc)
            bi_co_pdiscard(n->file, dropped[i], s->cluster_size);
    }
    return 0;
}

/* As QEMU: after a shrink the file ends after the last cluster still in
 * use, once the refcounts that free the rest are on disk. A failure to
 * cut only leaves the file longer (QEMU warns). Lock held. 0 or -errno
 * (of the flush). */
static int truncate_cut_file_locked(bi_node *n)
{
    qcow2_state *s = n->opaque;
    int64_t flen = bi_getlength(n->file);
    int64_t last = flen > 0 ? qc_last_cluster(n, (uint64_t)flen) : flen;
    int ret = bi_co_flush(n->file);
    if (ret < 0 || last < 0)
        return ret;
    uint64_t end = ((uint64_t)last + 1) << s->cluster_bits;
    if (end < (uint64_t)flen) {
        bi_error e2;
        bi_error_init(&e2);
        if (bi_truncate(n->file, end, false, BI_PREALLOC_OFF, &e2) == 0)
            s->file_size = end;
    }
    return 0;
}

/* As QEMU: growing over a backing file that reaches past the old end, the
 * new area must not show the backing file (the file's own zeroes do with
 * falloc/full): its whole (sub)clusters become zero clusters here, and
 * *zero_head is how many bytes from the old end up to the first
 * (sub)cluster boundary the caller writes as explicit zeroes, unlocked.
 * Lock held. 0 or -errno with err set. */
static int truncate_hide_backing_locked(bi_node *n, uint64_t old_len,
                                        uint64_t size,
                                        enum bi_prealloc prealloc,
                                        uint64_t *zero_head, bi_error *err)
{
    qcow2_state *s = n->opaque;
    *zero_head = 0;
    bool needed = size > old_len && n->backing &&
                  bi_getlength(n->backing) > (int64_t)old_len &&
                  (prealloc == BI_PREALLOC_OFF ||
                   prealloc == BI_PREALLOC_METADATA || s->data_file);
    if (!needed)
        return 0;
    uint64_t zs = bi_align_up(old_len, s->subcluster_size);
    int ret = 0;
    if (s->version < 3) {
        bi_error_set(err, ENOTSUP, "Failed to zero out new clusters");
        return -ENOTSUP;
    }
    if (size > zs)
        ret = zero_units_locked(n, zs, bi_align_up(size, s->cluster_size) - zs,
                                false, false);
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to zero out new clusters");
        return ret;
    }
    if (zs > old_len)
        *zero_head = BI_MIN(zs, size) - old_len;
    return 0;
}

/* Explicit zeroes over [old_len, old_len + len): the part of the new area
 * before the first (sub)cluster boundary. 0 or -errno with err set. */
static int truncate_write_zero_head(bi_node *n, uint64_t old_len, uint64_t len,
                                    bi_error *err)
{
    void *z = bi_blockalign(n->file, bi_align_up(len, 4096));
    int ret = -ENOMEM;
    if (z) {
        memset(z, 0, len);
        ret = bi_co_pwrite(n, old_len, z, len, 0);
        bi_free_aligned(z);
    }
    if (ret < 0)
        bi_error_set(err, -ret, "Failed to zero out the new area");
    return ret;
}

/* The table changes of a resize, under the lock, in QEMU's order: drop the
 * tail or grow L1; flush; discard what was dropped; shrink L1 and the
 * file; preallocate (or resize the data file); hide the backing file from
 * the new area; flush; and only then the new size in the header, so a
 * crash at any point leaves the old size over consistent tables.
 * *zero_head: see truncate_hide_backing_locked. 0 or -errno. */
static int truncate_locked(bi_node *n, uint64_t size, bool exact,
                           enum bi_prealloc prealloc, const uint8_t *head,
                           uint64_t head_len, uint64_t *zero_head,
                           bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t old_len = n->size;
    uint64_t *dropped = NULL;
    size_t n_dropped = 0;
    int ret = qc_before_write(n);
    if (ret == 0)
        ret = qc_bitmaps_truncate_begin(n, size, err); /* QEMU's rules */
    if (ret < 0)
        return ret;
    if (size < old_len) {
        ret = truncate_drop_tail_locked(n, size, &dropped, &n_dropped, err);
    } else {
        uint64_t span = 1ULL << (s->l2_bits + s->cluster_bits);
        ret = qc_grow_l1(n, (size + span - 1) / span);
        if (ret < 0)
            bi_error_set(err, -ret, "Failed to grow the L1 table");
    }
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = truncate_discard_dropped_locked(n, dropped, n_dropped);
    free(dropped);
    if (ret < 0)
        return ret;
    if (size < old_len) {
        ret = shrink_l1_locked(n, size);
        if (ret < 0) {
            bi_error_set(err, -ret, "Failed to reduce the number of L2 tables");
            return ret;
        }
        if (!s->data_file)
            ret = truncate_cut_file_locked(n);
    }
    if (ret == 0 && prealloc != BI_PREALLOC_OFF)
        ret = qc_preallocate_locked(n, old_len, size, prealloc, head, head_len,
                                    err);
    else if (ret == 0 && s->data_file)
        ret = bi_truncate(s->data_file, size, exact, BI_PREALLOC_OFF, err);
    if (ret == 0)
        ret = truncate_hide_backing_locked(n, old_len, size, prealloc,
                                           zero_head, err);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        return ret;
    uint64_t v = htobe64(size);
    ret = qc_write_header_field(n, QH_SIZE, &v, 8);
    if (ret < 0)
        return ret;
    n->size = size;
    qc_bitmaps_truncate_done(n, size);
    return 0;
}

int qcow2_co_truncate(bi_node *n, uint64_t size, bool exact,
                      enum bi_prealloc prealloc, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint8_t *head = NULL;
    uint64_t head_len = 0, zero_head = 0, old_len = n->size;
    int ret = truncate_check(n, size, prealloc, err);
    if (ret < 0)
        return ret;
    if (size > old_len && s->data_file_raw && prealloc == BI_PREALLOC_OFF)
        prealloc = BI_PREALLOC_METADATA; /* the raw data file stays mapped */
    ret = truncate_read_head(n, size, prealloc, &head, &head_len, err);
    if (ret < 0)
        return ret;
    bi_co_mutex_lock(&s->lock);
    ret = truncate_locked(n, size, exact, prealloc, head, head_len, &zero_head,
                          err);
    bi_co_mutex_unlock(&s->lock);
    bi_free_aligned(head);
    if (ret == 0 && zero_head)
        ret = truncate_write_zero_head(n, old_len, zero_head, err);
    if (ret < 0 && err && !err->msg[0])
        bi_error_set(err, -ret, "Could not resize image");
    return ret;
}
