/* SPDX-License-Identifier: MIT */
/*
 * qcow2 image operations: changing the backing file recorded in the header
 * (rebase), emptying the image (commit) and amending options (amend).
 *
 * The header cluster is rebuilt as QEMU's qcow2_update_header() lays it
 * out: header fields, extensions (crypto, data file, backing format,
 * feature table, bitmaps, unknown ones in their order), end marker, then
 * the backing file name; the whole cluster is written at once and flushed.
 */
#include "qcow2.h"
#include "util/util.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}

static void wr32(uint8_t *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, 4);
}

static void wr64(uint8_t *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}

/* What the rebuilt header cluster gets. */
struct hdr_plan {
    const char *backing_file; /* NULL: none */
    const char *backing_fmt;  /* NULL: none */
    uint32_t version;
    uint64_t incompat, compat, autoclear;
};

/* Appends one extension (padded to 8 bytes); -ENOSPC if it does not fit. */
static int put_ext(uint8_t *out, uint64_t cs, uint64_t *pos, uint32_t type,
                   const void *data, uint32_t len)
{
    uint64_t need = 8 + bi_align_up(len, 8);
    if (*pos + need > cs)
        return -ENOSPC;
    wr32(out + *pos, type);
    wr32(out + *pos + 4, len);
    memcpy(out + *pos + 8, data, len);
    memset(out + *pos + 8 + len, 0, need - 8 - len);
    *pos += need;
    return 0;
}

/* Feature name table as QEMU writes it into v3 headers. */
static const struct {
    uint8_t type, bit;
    const char *name;
} feature_table[] = {
    {0, 0, "dirty bit"},
    {0, 1, "corrupt bit"},
    {0, 2, "external data file"},
    {0, 3, "compression type"},
    {0, 4, "extended L2 entries"},
    {1, 0, "lazy refcounts"},
    {2, 0, "bitmaps"},
    {2, 1, "raw external data"},
};

static int rebuild_header_co(bi_node *n, const struct hdr_plan *p)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint8_t *old = bi_blockalign(n->file, cs);
    uint8_t *out = bi_blockalign(n->file, cs);
    int ret;
    if (!old || !out) {
        ret = -ENOMEM;
        goto done;
    }
    ret = bi_co_pread(n->file, 0, old, cs);
    if (ret < 0)
        goto done;
    memset(out, 0, cs);

    uint32_t old_hl = s->version >= 3 ? s->header_length : QH_V2_LENGTH;
    uint32_t new_hl;
    if (p->version >= 3)
        new_hl = s->version >= 3 ? s->header_length : QH_V3_LENGTH;
    else
        new_hl = QH_V2_LENGTH;
    memcpy(out, old, QH_V2_LENGTH);
    if (p->version >= 3) {
        if (s->version >= 3) {
            memcpy(out + QH_V2_LENGTH, old + QH_V2_LENGTH,
                   old_hl - QH_V2_LENGTH);
        } else {
            wr32(out + QH_REFCOUNT_ORDER, s->refcount_order);
            wr32(out + QH_HEADER_LENGTH, new_hl);
            out[QH_COMPRESSION_TYPE] = (uint8_t)s->compression_type;
        }
        wr64(out + QH_INCOMPAT, p->incompat);
        wr64(out + QH_COMPAT, p->compat);
        wr64(out + QH_AUTOCLEAR, p->autoclear);
    }
    wr32(out + QH_VERSION, p->version);

    /* old extensions, up to the end marker or the old backing name */
    uint64_t old_end = cs;
    uint64_t bo = be64toh(*(uint64_t *)(old + QH_BACKING_OFFSET));
    if (bo > old_hl && bo < cs)
        old_end = bo;
    struct {
        uint32_t type, len;
        uint64_t off;
    } ext[64];
    int n_ext = 0;
    for (uint64_t off = old_hl; off + 8 <= old_end && n_ext < 64;) {
        uint32_t type = rd32(old + off), len = rd32(old + off + 4);
        if (type == QCOW2_EXT_END || len > old_end - off - 8)
            break;
        ext[n_ext].type = type;
        ext[n_ext].len = len;
        ext[n_ext].off = off + 8;
        n_ext++;
        off += 8 + bi_align_up(len, 8);
    }

    uint64_t pos = new_hl;
    /* crypto and data file first */
    for (int i = 0; i < n_ext && ret == 0; i++) {
        if (ext[i].type == QCOW2_EXT_CRYPTO ||
            ext[i].type == QCOW2_EXT_DATA_FILE)
            ret = put_ext(out, cs, &pos, ext[i].type, old + ext[i].off,
                          ext[i].len);
    }
    if (ret == 0 && p->backing_fmt)
        ret = put_ext(out, cs, &pos, QCOW2_EXT_BACKING_FORMAT, p->backing_fmt,
                      (uint32_t)strlen(p->backing_fmt));
    if (ret == 0 && p->version >= 3) {
        size_t nf = sizeof(feature_table) / sizeof(feature_table[0]);
        uint8_t ft[sizeof(feature_table) / sizeof(feature_table[0]) * 48];
        memset(ft, 0, sizeof(ft));
        for (size_t i = 0; i < nf; i++) {
            ft[i * 48] = feature_table[i].type;
            ft[i * 48 + 1] = feature_table[i].bit;
            memcpy(ft + i * 48 + 2, feature_table[i].name,
                   strlen(feature_table[i].name));
        }
        ret = put_ext(out, cs, &pos, QCOW2_EXT_FEATURE_TABLE, ft,
                      (uint32_t)sizeof(ft));
    }
    for (int i = 0; i < n_ext && ret == 0; i++) {
        if (ext[i].type == QCOW2_EXT_BITMAPS)
            ret = put_ext(out, cs, &pos, ext[i].type, old + ext[i].off,
                          ext[i].len);
    }
    for (int i = 0; i < n_ext && ret == 0; i++) {
        uint32_t t = ext[i].type;
        if (t != QCOW2_EXT_CRYPTO && t != QCOW2_EXT_DATA_FILE &&
            t != QCOW2_EXT_BACKING_FORMAT && t != QCOW2_EXT_FEATURE_TABLE &&
            t != QCOW2_EXT_BITMAPS)
            ret = put_ext(out, cs, &pos, t, old + ext[i].off, ext[i].len);
    }
    if (ret < 0)
        goto done;
    if (pos + 8 > cs) {
        ret = -ENOSPC;
        goto done;
    }
    pos += 8; /* end marker (zeroes) */
    if (p->backing_file) {
        size_t len = strlen(p->backing_file);
        if (pos + len > cs) {
            ret = -ENOSPC;
            goto done;
        }
        memcpy(out + pos, p->backing_file, len);
        wr64(out + QH_BACKING_OFFSET, pos);
        wr32(out + QH_BACKING_SIZE, (uint32_t)len);
    } else {
        wr64(out + QH_BACKING_OFFSET, 0);
        wr32(out + QH_BACKING_SIZE, 0);
    }
    ret = bi_co_pwrite(n->file, 0, out, cs, 0);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0) {
        s->version = p->version;
        s->header_length = new_hl;
        s->incompat = p->incompat;
        s->compat = p->compat;
        s->autoclear = p->autoclear;
    }
done:
    bi_free_aligned(old);
    bi_free_aligned(out);
    return ret;
}

static void plan_from_state(const qcow2_state *s, struct hdr_plan *p)
{
    p->backing_file = s->backing_file;
    p->backing_fmt = s->backing_format;
    p->version = s->version;
    p->incompat = s->incompat;
    p->compat = s->compat;
    p->autoclear = s->autoclear;
}

/* ------------------------------------------------------ backing file */

struct cb_args {
    bi_node *n;
    const char *bf, *bfmt;
};

static int change_backing_co(void *arg)
{
    struct cb_args *a = arg;
    qcow2_state *s = a->n->opaque;
    struct hdr_plan p;
    bi_co_mutex_lock(&s->lock);
    plan_from_state(s, &p);
    p.backing_file = a->bf;
    p.backing_fmt = a->bfmt;
    int ret = qc_flush_metadata(a->n);
    if (ret == 0)
        ret = rebuild_header_co(a->n, &p);
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

int qcow2_change_backing_file(bi_node *n, const char *backing_file,
                              const char *backing_fmt, bi_error *err)
{
    qcow2_state *s = n->opaque;
    BI_UNUSED(err);
    if (backing_file && strlen(backing_file) > QCOW2_MAX_BACKING_NAME)
        return -EINVAL;
    /* an image whose data file is raw cannot have a backing file */
    if (backing_file && s->data_file_raw)
        return -EINVAL;
    if (backing_fmt && strlen(backing_fmt) >= 16)
        return -EINVAL;
    if (s->read_only)
        return -EACCES;
    struct cb_args a = {n, backing_file, backing_fmt};
    int ret = bi_run_co(change_backing_co, &a);
    if (ret < 0)
        return ret;
    char *bf = backing_file ? strdup(backing_file) : NULL;
    char *bfmt = backing_fmt ? strdup(backing_fmt) : NULL;
    free(s->backing_file);
    free(s->backing_format);
    s->backing_file = bf;
    s->backing_format = bfmt;
    return 0;
}

/* -------------------------------------------------------- make empty */

/* Every cluster unallocated (entries zeroed, not zero clusters), the host
 * clusters freed: QEMU's make_empty through a full discard. */
int qcow2_co_make_empty(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (s->read_only)
        return -EACCES;
    if (s->corrupt)
        return -EIO;
    uint64_t span = 1ULL << (s->l2_bits + s->cluster_bits);
    int ret;
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    for (uint32_t i = 0; ret == 0 && i < s->l1_size; i++) {
        if (!(s->l1_table[i] & L1E_OFFSET_MASK))
            continue;
        uint64_t base = (uint64_t)i * span;
        void *table;
        uint64_t idx;
        /* an L2 table shared with a snapshot is copied first */
        ret = qc_get_l2_table(n, base, true, &table, &idx);
        if (ret < 0)
            break;
        bool dirty = false;
        for (uint64_t j = 0; j < s->l2_entries; j++) {
            uint64_t e, b;
            qc_get_l2(s, table, j, &e, &b);
            if (!e && !b)
                continue;
            qc_set_l2(s, table, j, 0, 0);
            dirty = true;
            if ((e & QCOW_OFLAG_COMPRESSED) ||
                ((e & L2E_OFFSET_MASK) && !qc_has_data_file(s)))
                qc_free_l2_entry_clusters(n, e);
        }
        if (dirty)
            qc_cache_mark_dirty(&s->l2_cache, table);
        qc_cache_put(&s->l2_cache, table);
    }
    if (ret == 0)
        ret = qc_flush_metadata(n);
    bi_co_mutex_unlock(&s->lock);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    return ret;
}
