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
#include "format/luks/luks.h"
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
    bool set_data_file; /* replace the data file name with data_file */
    const char *data_file;
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
            (ext[i].type == QCOW2_EXT_DATA_FILE && !p->set_data_file))
            ret = put_ext(out, cs, &pos, ext[i].type, old + ext[i].off,
                          ext[i].len);
    }
    if (ret == 0 && p->set_data_file && p->data_file)
        ret = put_ext(out, cs, &pos, QCOW2_EXT_DATA_FILE, p->data_file,
                      (uint32_t)strlen(p->data_file));
    if (ret == 0 && p->backing_fmt)
        ret = put_ext(out, cs, &pos, QCOW2_EXT_BACKING_FORMAT, p->backing_fmt,
                      (uint32_t)strlen(p->backing_fmt));
    /* as QEMU: no feature table in headers of clusters up to 4 KiB */
    if (ret == 0 && p->version >= 3 && cs > 4096) {
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
    p->set_data_file = false;
    p->data_file = NULL;
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

/* QEMU's make_completely_empty(): the image file is reset to a header, a
 * one-cluster refcount table, one refcount block and an empty L1 table,
 * and truncated after them. The dirty bit covers the steps in between. */
static int make_completely_empty(bi_node *n, uint64_t l1_clusters)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size, *rt;
    uint8_t f[20];
    int64_t off;
    int ret;

    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret < 0)
        goto out;
    qc_cache_drop_all(&s->l2_cache);
    qc_cache_drop_all(&s->rb_cache);
    if (!(s->incompat & QCOW2_INCOMPAT_DIRTY)) {
        ret = qc_update_incompat(n, s->incompat | QCOW2_INCOMPAT_DIRTY);
        if (ret < 0)
            goto out;
    }
    /* from here until the refcounts are rebuilt the image is dirty; the
     * debug events where QEMU's make_completely_empty raises them */
    bi_debug_event(n->file, BI_DBG_L1_UPDATE);
    ret = bi_co_pwrite_zeroes(n->file, s->l1_table_offset, l1_clusters * cs, 0);
    if (ret < 0)
        goto broken;
    memset(s->l1_table, 0, (size_t)s->l1_alloc * 8);
    bi_debug_event(n->file, BI_DBG_EMPTY_IMAGE_PREPARE);
    ret = bi_co_pwrite_zeroes(n->file, cs, (2 + l1_clusters) * cs, 0);
    if (ret < 0)
        goto broken;
    /* L1 table three clusters in, the refcount table in cluster 1, its
     * first refcount block in cluster 2 */
    uint64_t v = htobe64(3 * cs);
    memcpy(f, &v, 8);
    v = htobe64(cs);
    memcpy(f + 8, &v, 8);
    uint32_t one = htobe32(1);
    memcpy(f + 16, &one, 4);
    bi_debug_event(n->file, BI_DBG_L1_UPDATE);
    bi_debug_event(n->file, BI_DBG_REFTABLE_UPDATE);
    ret = qc_write_header_field(n, QH_L1_OFFSET, f, sizeof(f));
    if (ret < 0)
        goto broken;
    s->l1_table_offset = 3 * cs;
    rt = calloc(cs / 8, sizeof(uint64_t));
    if (!rt) {
        ret = -ENOMEM;
        goto broken;
    }
    free(s->refcount_table);
    s->refcount_table = rt;
    s->refcount_table_offset = cs;
    s->refcount_table_clusters = 1;
    s->refcount_table_size = cs / 8;
    v = htobe64(2 * cs);
    ret = qc_write_header_field(n, cs, &v, 8);
    if (ret < 0)
        goto broken;
    s->refcount_table[0] = 2 * cs;
    s->free_cluster_index = 0;
    s->free_byte_offset = 0;
    off = qc_alloc_clusters(n, 3 + l1_clusters);
    if (off != 0) {
        ret = off < 0 ? (int)off : -EIO;
        goto broken;
    }
    /* everything describes the file again: clean */
    ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0)
        ret = qc_update_incompat(n, s->incompat & ~QCOW2_INCOMPAT_DIRTY);
    if (ret < 0)
        goto out;
    s->marked_dirty = false;
    bi_error err;
    bi_error_init(&err);
    ret = n->file->drv->co_truncate(n->file, (3 + l1_clusters) * cs, false,
                                    BI_PREALLOC_OFF, &err);
    if (ret == 0)
        s->file_size = (3 + l1_clusters) * cs;
    goto out;
broken:
    /* the in-memory refcounts no longer describe the file: the node is
     * unusable (QEMU ejects its driver), but the image is not marked
     * corrupt: the dirty bit on disk has the next writable open rebuild
     * the refcounts, which a corrupt bit would forbid */
    s->corrupt = true;
    s->marked_dirty = false;
out:
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* QEMU's full-discard fallback: every cluster unallocated (entries zeroed,
 * not zero clusters); host clusters whose refcount drops to zero are
 * discarded in the file (QEMU passes snapshot-type discards down). */
static int make_empty_discard(bi_node *n)
{
    qcow2_state *s = n->opaque;
    uint64_t span = 1ULL << (s->l2_bits + s->cluster_bits);
    struct qcow2_free_range *freed = NULL;
    int n_freed = 0;
    int ret;
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret == 0)
        ret = qc_flush_metadata(n);
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
    if (ret == 0 && s->n_pending_free) {
        n_freed = s->n_pending_free;
        freed = malloc(sizeof(*freed) * (size_t)n_freed);
        if (freed)
            memcpy(freed, s->pending_free, sizeof(*freed) * (size_t)n_freed);
        else
            n_freed = 0;
    }
    if (ret == 0)
        ret = qc_flush_metadata(n);
    for (int i = 0; ret == 0 && i < n_freed; i++) {
        uint64_t c0 = freed[i].offset >> s->cluster_bits;
        uint64_t c1 = (freed[i].offset + freed[i].len - 1) >> s->cluster_bits;
        for (uint64_t c = c0; c <= c1; c++) {
            uint64_t rc;
            if (qc_get_refcount(n, c, &rc) == 0 && rc == 0)
                bi_co_pdiscard(n->file, c << s->cluster_bits, s->cluster_size);
        }
    }
    free(freed);
    bi_co_mutex_unlock(&s->lock);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    return ret;
}

/* QEMU 7.2's qcow2_make_empty(): a v3 image without snapshots, bitmaps,
 * LUKS or a data file whose L1 table fits beside the header in what one
 * refcount block covers is reset and truncated; any other is emptied by
 * discarding every cluster. */
int qcow2_co_make_empty(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (s->read_only)
        return -EACCES;
    if (s->corrupt)
        return -EIO;
    uint64_t l1_clusters =
        ((uint64_t)s->l1_size * 8 + s->cluster_size - 1) / s->cluster_size;
    if (s->version >= 3 && s->nb_snapshots == 0 && s->nb_bitmaps == 0 &&
        3 + l1_clusters <= (1ULL << s->rb_bits) && s->crypt_method != 2 &&
        !qc_has_data_file(s)) {
        int ret = make_completely_empty(n, l1_clusters);
        if (ret < 0)
            return ret;
        /* QEMU's qcow2_mark_clean() rewrites the whole header */
        bi_error err;
        bi_error_init(&err);
        return qcow2_change_backing_file(n, s->backing_file, s->backing_format,
                                         &err);
    }
    return make_empty_discard(n);
}

/* ------------------------------------------------------------ amend */

/* qemu 7.2's qcow2 creation options that amend does not take. */
static const char *const create_only[] = {
    "cluster_size",
    "compression_type",
    "encrypt.cipher-alg",
    "encrypt.cipher-mode",
    "encrypt.format",
    "encrypt.hash-alg",
    "encrypt.ivgen-alg",
    "encrypt.ivgen-hash-alg",
    "encrypt.key-secret",
    "encryption",
    "extended_l2",
    "preallocation",
    NULL,
};

struct amend_req {
    bool has_size, has_compat, has_backing_file, has_backing_fmt;
    bool has_data_file, has_data_file_raw, has_lazy, has_refcount_bits;
    bool has_encrypt;
    uint64_t size;
    const char *compat, *backing_file, *backing_fmt, *data_file;
    bool data_file_raw, lazy;
    uint64_t refcount_bits;
};

static int parse_bool(const char *k, const char *v, bool *out, bi_error *err)
{
    if (!strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true") ||
        !strcmp(v, "y")) {
        *out = true;
    } else if (!strcmp(v, "off") || !strcmp(v, "no") || !strcmp(v, "false") ||
               !strcmp(v, "n")) {
        *out = false;
    } else {
        bi_error_set(err, 0, "Parameter '%s' expects 'on' or 'off'", k);
        return -EINVAL;
    }
    return 0;
}

static int parse_number(const char *k, const char *v, uint64_t *out,
                        bi_error *err)
{
    char *end;
    errno = 0;
    unsigned long long r = strtoull(v, &end, 0);
    if (!*v || *end || errno || v[0] == '-') {
        bi_error_set(err, 0, "Parameter '%s' expects a number", k);
        return -EINVAL;
    }
    *out = r;
    return 0;
}

/* qemu_opts_do_parse() against the amend options, in the user's order. */
static int parse_amend(const char *const *options, struct amend_req *r,
                       bi_error *err)
{
    memset(r, 0, sizeof(*r));
    for (int i = 0; options && options[i]; i++) {
        char k[128];
        const char *eq = strchr(options[i], '=');
        const char *v = eq ? eq + 1 : "on";
        size_t kl = eq ? (size_t)(eq - options[i]) : strlen(options[i]);
        if (kl >= sizeof(k))
            kl = sizeof(k) - 1;
        memcpy(k, options[i], kl);
        k[kl] = 0;
        if (!strcmp(k, "size")) {
            if (bi_parse_size(v, &r->size) < 0) {
                bi_error_set(err, 0,
                             "Parameter 'size' expects a non-negative "
                             "number below 2^64\nOptional suffix k, M, G, "
                             "T, P or E means kilo-, mega-, giga-, tera-, "
                             "peta-\nand exabytes, respectively.");
                return -EINVAL;
            }
            r->has_size = true;
        } else if (!strcmp(k, "compat")) {
            r->compat = v;
            r->has_compat = true;
        } else if (!strcmp(k, "backing_file")) {
            r->backing_file = v;
            r->has_backing_file = true;
        } else if (!strcmp(k, "backing_fmt")) {
            r->backing_fmt = v;
            r->has_backing_fmt = true;
        } else if (!strcmp(k, "data_file")) {
            r->data_file = v;
            r->has_data_file = true;
        } else if (!strcmp(k, "data_file_raw")) {
            if (parse_bool(k, v, &r->data_file_raw, err) < 0)
                return -EINVAL;
            r->has_data_file_raw = true;
        } else if (!strcmp(k, "lazy_refcounts")) {
            if (parse_bool(k, v, &r->lazy, err) < 0)
                return -EINVAL;
            r->has_lazy = true;
        } else if (!strcmp(k, "refcount_bits")) {
            if (parse_number(k, v, &r->refcount_bits, err) < 0)
                return -EINVAL;
            r->has_refcount_bits = true;
        } else if (!strcmp(k, "encrypt.keyslot") ||
                   !strcmp(k, "encrypt.iter-time")) {
            uint64_t dummy;
            if (parse_number(k, v, &dummy, err) < 0)
                return -EINVAL;
            r->has_encrypt = true;
        } else if (!strcmp(k, "encrypt.state") ||
                   !strcmp(k, "encrypt.old-secret") ||
                   !strcmp(k, "encrypt.new-secret")) {
            r->has_encrypt = true;
        } else {
            bool creation = false;
            for (int j = 0; create_only[j]; j++)
                creation |= !strcmp(k, create_only[j]);
            bi_error_set(err, 0, "Invalid parameter '%s'%s", k,
                         creation ? "\nThis option is only supported for "
                                    "image creation"
                                  : "");
            return -EINVAL;
        }
    }
    return 0;
}

static bool str_eq(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return !strcmp(a, b);
}

static int mark_clean_locked(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (!(s->incompat & QCOW2_INCOMPAT_DIRTY))
        return 0;
    int ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0)
        ret = qc_update_incompat(n, s->incompat & ~QCOW2_INCOMPAT_DIRTY);
    return ret;
}

struct amend_co {
    bi_node *n;
    struct hdr_plan plan;
    int op; /* 0 header, 1 mark clean + header, 2 expand zero clusters,
             * 3 refcount order, 4 snapshot table with v3 extra data */
    bi_amend_status_cb *cb;
    void *opaque;
    uint32_t refcount_order; /* op 3 */
    bi_error *err;           /* op 3 */
};

/* QEMU's qcow2_amend_helper_cb: the progress of several operations (each
 * reporting its own offset / work size) as one, the work of operations
 * not started yet projected from those done. */
struct amend_helper {
    bi_amend_status_cb *cb;
    void *opaque;
    int total_ops, ops_done;
    int cur_op, last_op; /* 0: none */
    int64_t offset_done, last_work;
};

static void helper_cb(void *opaque, int64_t off, int64_t work)
{
    struct amend_helper *h = opaque;
    if (h->cur_op != h->last_op) {
        if (h->last_op) {
            h->offset_done += h->last_work;
            h->ops_done++;
        }
        h->last_op = h->cur_op;
    }
    if (!h->cb || h->total_ops <= 0 || h->ops_done >= h->total_ops)
        return;
    h->last_work = work;
    int64_t cur = h->offset_done + work;
    int64_t projected =
        cur * (h->total_ops - h->ops_done - 1) / (h->ops_done + 1);
    h->cb(h->opaque, h->offset_done + off, cur + projected);
}

/* Expands the zero clusters of one L2 table (QEMU's
 * expand_zero_clusters_in_l1 body): plain zero clusters become unallocated
 * without a backing file, else new clusters of zeroes (their refcount that
 * of the table, which may be shared); preallocated ones are zeroed in
 * place. The table is changed where it is, shared or not, as QEMU does:
 * zero clusters read the same through every table that shares them.
 * Data first (flushed), then the refcounts, then the table. */
static int expand_l2(bi_node *n, uint64_t *t_be, uint64_t l2_refcount,
                     bool *dirty)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    bool backed = s->backing_file && s->backing_file[0];
    bool wrote = false;
    int ret = 0;
    *dirty = false;
    for (uint64_t j = 0; j < s->l2_entries && ret == 0; j++) {
        uint64_t e = be64toh(t_be[j]);
        if ((e & QCOW_OFLAG_COMPRESSED) || !(e & QCOW_OFLAG_ZERO))
            continue;
        uint64_t host = e & L2E_OFFSET_MASK;
        uint64_t shared_host = 0;
        if (host && !qc_has_data_file(s)) {
            /* a preallocated cluster that tables other than this one
             * reference (a snapshot's data) is not zeroed in place, as
             * QEMU 7.2 does (losing the snapshot's bytes): this table's
             * references to it are dropped instead */
            uint64_t crc;
            ret = qc_get_refcount(n, host >> s->cluster_bits, &crc);
            if (ret < 0)
                return ret;
            if (crc > l2_refcount) {
                shared_host = host;
                host = 0;
            }
        }
        if (!host) {
            for (uint64_t k = 0; shared_host && k < l2_refcount; k++)
                qc_defer_free(n, shared_host, cs);
            if (!backed) {
                t_be[j] = 0;
                *dirty = true;
                continue;
            }
            int64_t off = qc_alloc_clusters(n, 1);
            if (off < 0)
                return (int)off;
            host = (uint64_t)off;
            if (l2_refcount > 1) {
                ret =
                    qc_update_refcount(n, host, cs, (int64_t)(l2_refcount - 1));
                if (ret < 0) {
                    qc_update_refcount(n, host, cs, -1);
                    return ret;
                }
            }
        }
        if (qc_offset_into_cluster(s, host))
            return qc_signal_corruption(n,
                                        "Cluster allocation offset %#" PRIx64
                                        " unaligned (L2 offset: %#" PRIx64
                                        ", L2 index: %#" PRIx64 ")",
                                        host, (uint64_t)0, j);
        ret = qc_check_overlap(n, 0, host, cs);
        if (ret == 0)
            ret = bi_co_pwrite_zeroes(n->file, host, cs, 0);
        if (ret < 0)
            return ret;
        wrote = true;
        /* QEMU flags by the table's refcount alone; a preallocated cluster
         * shared with a snapshot table would then be written in place
         * later: only a cluster of refcount 1 is flagged (check clean) */
        uint64_t crc = l2_refcount;
        if (l2_refcount == 1 && (e & L2E_OFFSET_MASK)) {
            ret = qc_get_refcount(n, host >> s->cluster_bits, &crc);
            if (ret < 0)
                return ret;
        }
        t_be[j] = htobe64(host | (crc == 1 ? QCOW_OFLAG_COPIED : 0));
        *dirty = true;
    }
    if (wrote) {
        ret = bi_co_flush(n->file);
        if (ret == 0)
            ret = qc_cache_writeback(n, &s->rb_cache);
        if (ret == 0)
            ret = bi_co_flush(n->file);
    }
    return ret;
}

/* Expands the zero clusters reachable from one L1 table (active: through
 * the cache; a snapshot's: tables read and written directly). */
static int expand_l1(struct amend_co *a, const uint64_t *l1, uint32_t l1_size,
                     bool active, int64_t *visited, int64_t total)
{
    bi_node *n = a->n;
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t *buf = NULL;
    int ret = 0;
    if (!active) {
        buf = bi_blockalign(n->file, cs);
        if (!buf)
            return -ENOMEM;
    }
    for (uint32_t i = 0; i < l1_size && ret == 0; i++) {
        uint64_t l2_off = l1[i] & L1E_OFFSET_MASK;
        if (l2_off) {
            uint64_t rc;
            bool dirty;
            if (qc_offset_into_cluster(s, l2_off)) {
                ret = qc_signal_corruption(
                    n, "L2 table offset %#" PRIx64 " unaligned (L1 index: %#x)",
                    l2_off, i);
                break;
            }
            ret = qc_get_refcount(n, l2_off >> s->cluster_bits, &rc);
            if (ret < 0)
                break;
            if (active) {
                void *t;
                ret = qc_cache_get(n, &s->l2_cache, l2_off, false, &t);
                if (ret < 0)
                    break;
                ret = expand_l2(n, t, rc, &dirty);
                if (dirty)
                    qc_cache_mark_dirty(&s->l2_cache, t);
                qc_cache_put(&s->l2_cache, t);
            } else {
                ret = bi_co_pread(n->file, l2_off, buf, cs);
                if (ret == 0)
                    ret = expand_l2(n, buf, rc, &dirty);
                if (ret == 0 && dirty) {
                    ret = qc_check_overlap(n, QC_OL_L2, l2_off, cs);
                    if (ret == 0)
                        ret = bi_co_pwrite(n->file, l2_off, buf, cs, 0);
                }
            }
            if (ret < 0)
                break;
        }
        (*visited)++;
        if (a->cb)
            a->cb(a->opaque, *visited, total);
    }
    bi_free_aligned(buf);
    return ret;
}

/* QEMU's qcow2_expand_zero_clusters(): the active table, then (with the
 * L2 cache written and emptied, as snapshot tables may share its tables)
 * every snapshot's. */
static int expand_zero_locked(struct amend_co *a)
{
    bi_node *n = a->n;
    qcow2_state *s = n->opaque;
    int64_t total = s->l1_size, visited = 0;
    int ret;

    for (uint32_t i = 0; i < s->nb_snapshots; i++)
        total += s->snapshots[i].l1_size;
    ret = expand_l1(a, s->l1_table, s->l1_size, true, &visited, total);
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        return ret;
    qc_cache_drop_all(&s->l2_cache);

    for (uint32_t i = 0; i < s->nb_snapshots && ret == 0; i++) {
        struct qcow2_snapshot *sn = &s->snapshots[i];
        if (!sn->l1_size)
            continue;
        if (qc_offset_into_cluster(s, sn->l1_table_offset) ||
            (uint64_t)sn->l1_size > QCOW2_MAX_L1_BYTES / 8)
            return -EFBIG;
        uint64_t *l1 = malloc((size_t)sn->l1_size * 8);
        if (!l1)
            return -ENOMEM;
        ret = bi_co_pread(n->file, sn->l1_table_offset, l1,
                          (uint64_t)sn->l1_size * 8);
        for (uint32_t j = 0; ret == 0 && j < sn->l1_size; j++)
            l1[j] = be64toh(l1[j]);
        if (ret == 0)
            ret = expand_l1(a, l1, sn->l1_size, false, &visited, total);
        free(l1);
    }
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    return ret;
}

static int amend_co_fn(void *arg)
{
    struct amend_co *a = arg;
    qcow2_state *s = a->n->opaque;
    int ret;
    bi_co_mutex_lock(&s->lock);
    ret = qc_flush_metadata(a->n);
    if (ret == 0 && a->op == 1)
        ret = mark_clean_locked(a->n);
    if (ret == 0 && a->op == 2) {
        ret = qc_before_write(a->n);
        if (ret == 0)
            ret = expand_zero_locked(a);
    }
    if (ret == 0 && a->op == 3) {
        ret = qc_before_meta_write(a->n);
        if (ret == 0)
            ret = qc_change_refcount_order(a->n, a->refcount_order, a->cb,
                                           a->opaque, a->err);
    }
    if (ret == 0 && a->op == 4) {
        ret = qc_before_meta_write(a->n);
        if (ret == 0)
            ret = qc_rewrite_snapshot_table(a->n);
    }
    if (ret == 0 && a->op < 2) {
        a->plan.incompat = s->incompat & a->plan.incompat;
        if (a->op == 1)
            a->plan.incompat &= ~QCOW2_INCOMPAT_DIRTY;
        ret = rebuild_header_co(a->n, &a->plan);
    }
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

static int write_header(bi_node *n, const struct hdr_plan *p, bool clean,
                        bi_error *err)
{
    struct amend_co a = {.n = n, .plan = *p, .op = clean ? 1 : 0};
    int ret = bi_run_co(amend_co_fn, &a);
    if (ret < 0)
        bi_error_set(err, -ret, "Failed to update the image header");
    return ret;
}

static void status(bi_amend_status_cb *cb, void *opaque, int64_t off,
                   int64_t total)
{
    if (cb)
        cb(opaque, off, total);
}

/* The key slots of a LUKS image (encrypt.state, keyslot, old-secret,
 * new-secret, iter-time), as the luks driver amends them, on the header
 * in the image's clusters. */
static int amend_encryption(bi_node *n, const char *const *options, bool force,
                            bi_error *err)
{
    qcow2_state *s = n->opaque;
    if (!s->luks || !s->key_secret)
        return bi_error_setc(err, -EINVAL,
                             "Parameter 'encrypt.key-secret' is required for "
                             "cipher");
    char **lo = qc_luks_create_opts(options);
    int ret =
        luks_amend_keyslots(s->luks, n->file, s->crypto_hdr_offset,
                            s->key_secret, (const char *const *)lo, force, err);
    qc_luks_create_opts_free(lo);
    return ret;
}

/* The checks of an amend before anything is written, in the order of
 * qemu's option table; *new_version is the version asked for (the
 * image's own without compat=). 0 or -errno with err set. */
static int amend_check(bi_node *n, const struct amend_req *r,
                       uint32_t *new_version, bi_error *err)
{
    qcow2_state *s = n->opaque;
    *new_version = s->version;
    if (r->has_compat) {
        if (!strcmp(r->compat, "0.10") || !strcmp(r->compat, "v2")) {
            *new_version = 2;
        } else if (!strcmp(r->compat, "1.1") || !strcmp(r->compat, "v3")) {
            *new_version = 3;
        } else {
            bi_error_set(err, 0, "Unknown compatibility level %s", r->compat);
            return -EINVAL;
        }
    }
    if (r->has_encrypt && !s->crypt_method) {
        bi_error_set(err, 0,
                     "Can't amend encryption options - encryption "
                     "not present");
        return -EINVAL;
    }
    if (r->has_encrypt && s->crypt_method != QCOW2_CRYPT_LUKS) {
        bi_error_set(err, 0, "Only LUKS encryption options can be amended");
        return -ENOTSUP;
    }
    if (r->has_refcount_bits &&
        (r->refcount_bits == 0 || r->refcount_bits > 64 ||
         (r->refcount_bits & (r->refcount_bits - 1)))) {
        bi_error_set(err, 0,
                     "Refcount width must be a power of two and may "
                     "not exceed 64 bits");
        return -EINVAL;
    }
    if (r->has_data_file && !qc_has_data_file(s)) {
        bi_error_set(err, 0,
                     "data-file can only be set for images that use "
                     "an external data file");
        return -EINVAL;
    }
    if (r->has_data_file_raw && r->data_file_raw && !s->data_file_raw) {
        bi_error_set(err, 0, "data-file-raw cannot be set on existing images");
        return -EINVAL;
    }
    return 0;
}

/* compat=1.1 on a v2 image: the snapshot table gains each snapshot's
 * 64-bit VM state size and disk size (written anew when one lacks them),
 * then the header becomes v3. 0 or -errno with err set. */
static int amend_upgrade(bi_node *n, struct amend_helper *helper, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct hdr_plan p;
    helper->cur_op = 1;
    helper_cb(helper, 0, 2);
    bool need_snap = false;
    for (uint32_t i = 0; i < s->nb_snapshots; i++)
        need_snap |= s->snapshots[i].extra_data_size < 16;
    if (need_snap) {
        struct amend_co a = {.n = n, .op = 4};
        int ret = bi_run_co(amend_co_fn, &a);
        if (ret < 0) {
            bi_error_set(err, -ret, "Failed to update the snapshot table");
            return ret;
        }
    }
    helper_cb(helper, 1, 2);
    plan_from_state(s, &p);
    p.version = 3;
    p.incompat = 0;
    p.compat = 0;
    p.autoclear = 0;
    int ret = write_header(n, &p, false, err);
    if (ret == 0)
        helper_cb(helper, 2, 2);
    return ret;
}

/* backing_file and backing_fmt may only be given as they are (qemu-img
 * rebase changes them). 0 or -EINVAL with err set. */
static int amend_check_backing(bi_node *n, const struct amend_req *r,
                               bi_error *err)
{
    qcow2_state *s = n->opaque;
    if (!r->has_backing_file && !r->has_backing_fmt)
        return 0;
    if (str_eq(r->has_backing_file ? r->backing_file : NULL, s->backing_file) &&
        str_eq(r->has_backing_fmt ? r->backing_fmt : NULL, s->backing_format))
        return 0;
    bi_error_set(err, 0,
                 "Cannot amend the backing file\nYou can use "
                 "'qemu-img rebase' instead.");
    return -EINVAL;
}

/* lazy_refcounts=on|off: the compat bit in the header; turning it off
 * leaves the image clean. 0 or -errno with err set. */
static int amend_lazy(bi_node *n, bool lazy, uint32_t new_version,
                      bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct hdr_plan p;
    if (lazy == ((s->compat & QCOW2_COMPAT_LAZY_REFCOUNTS) != 0))
        return 0;
    if (lazy && new_version < 3) {
        bi_error_set(err, 0,
                     "Lazy refcounts only supported with "
                     "compatibility level 1.1 and above (use "
                     "compat=1.1 or greater)");
        return -EINVAL;
    }
    plan_from_state(s, &p);
    if (lazy)
        p.compat |= QCOW2_COMPAT_LAZY_REFCOUNTS;
    else
        p.compat &= ~QCOW2_COMPAT_LAZY_REFCOUNTS;
    int ret = write_header(n, &p, !lazy, err);
    if (ret == 0 && !lazy)
        s->marked_dirty = false;
    return ret;
}

/* refcount_bits=N: the refcount structure rewritten at the new width.
 * 0 or -errno with err set. */
static int amend_refcount_width(bi_node *n, uint64_t bits, uint32_t new_version,
                                struct amend_helper *helper, bi_error *err)
{
    if (new_version < 3 && bits != 16) {
        bi_error_set(err, 0,
                     "Refcount widths other than 16 bits require "
                     "compatibility level 1.1 or above (use compat=1.1 "
                     "or greater)");
        return -EINVAL;
    }
    helper->cur_op = 2;
    struct amend_co a = {.n = n,
                         .op = 3,
                         .cb = helper_cb,
                         .opaque = helper,
                         .refcount_order = (uint32_t)__builtin_ctzll(bits),
                         .err = err};
    int ret = bi_run_co(amend_co_fn, &a);
    if (ret < 0 && (!err || !err->msg[0]))
        bi_error_set(err, -ret, "Failed to change the refcount width");
    return ret;
}

/* data_file=NAME (empty: none) and data_file_raw=off: the header's
 * extension and autoclear bit, then the open state. 0 or -errno with err
 * set. */
static int amend_data_file(bi_node *n, const struct amend_req *r, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct hdr_plan p;
    bool raw_off = r->has_data_file_raw && !r->data_file_raw;
    plan_from_state(s, &p);
    if (raw_off)
        p.autoclear &= ~QCOW2_AUTOCLEAR_DATA_FILE_RAW;
    if (r->has_data_file) {
        p.set_data_file = true;
        p.data_file = r->data_file[0] ? r->data_file : NULL;
    }
    int ret = write_header(n, &p, false, err);
    if (ret < 0)
        return ret;
    if (raw_off)
        s->data_file_raw = false;
    if (r->has_data_file) {
        free(s->data_file_name);
        s->data_file_name = p.data_file ? strdup(p.data_file) : NULL;
    }
    return 0;
}

/* compat=0.10 on a v3 image: refused when v2 cannot say what the image
 * holds; else made clean, zero clusters turned into data clusters, and
 * the header written as v2. 0 or -errno with err set. */
static int amend_downgrade(bi_node *n, struct amend_helper *helper,
                           bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct hdr_plan p;
    int ret;
    if (s->refcount_order != 4) {
        bi_error_set(err, 0, "compat=0.10 requires refcount_bits=16");
        return -ENOTSUP;
    }
    if (qc_has_data_file(s)) {
        bi_error_set(err, 0, "Cannot downgrade an image with a data file");
        return -ENOTSUP;
    }
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        if (s->snapshots[i].vm_state_size > UINT32_MAX ||
            s->snapshots[i].disk_size != n->size) {
            bi_error_set(err, 0,
                         "Internal snapshots prevent downgrade of image");
            return -ENOTSUP;
        }
    }
    if (s->incompat & QCOW2_INCOMPAT_DIRTY) {
        struct amend_co a = {.n = n, .op = 1};
        plan_from_state(s, &a.plan);
        ret = bi_run_co(amend_co_fn, &a);
        if (ret < 0) {
            bi_error_set(err, -ret, "Failed to make the image clean");
            return ret;
        }
        s->marked_dirty = false;
    }
    if (s->incompat) {
        bi_error_set(err, 0,
                     "Cannot downgrade an image with incompatible "
                     "features %#" PRIx64 " set",
                     s->incompat);
        return -ENOTSUP;
    }
    helper->cur_op = 3;
    struct amend_co a = {.n = n, .op = 2, .cb = helper_cb, .opaque = helper};
    ret = bi_run_co(amend_co_fn, &a);
    if (ret < 0) {
        bi_error_set(err, -ret, "Failed to turn zero into data clusters");
        return ret;
    }
    plan_from_state(s, &p);
    p.version = 2;
    p.incompat = 0;
    p.compat = 0;
    p.autoclear = 0;
    return write_header(n, &p, false, err);
}

/* qemu 7.2's qcow2_amend_options: every check first, then the changes in
 * its order (key slots, upgrade, lazy refcounts, refcount width, data
 * file, size, downgrade); each change leaves a valid image, so one that
 * fails leaves the ones before it done, as in QEMU. */
int qcow2_amend(bi_node *n, const char *const *options, bool force,
                bi_amend_status_cb *cb, void *opaque, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct amend_req r;
    uint32_t old_version = s->version, new_version;
    int ret = parse_amend(options, &r, err);
    if (ret == 0) {
        status(cb, opaque, 0, 0); /* options accepted */
        ret = amend_check(n, &r, &new_version, err);
    }
    if (ret < 0)
        return ret;

    struct amend_helper helper = {.cb = cb, .opaque = opaque};
    bool new_width = r.has_refcount_bits && r.refcount_bits != s->refcount_bits;
    helper.total_ops = (new_version != old_version) + new_width;

    if (r.has_encrypt)
        ret = amend_encryption(n, options, force, err);
    if (ret == 0 && new_version > old_version)
        ret = amend_upgrade(n, &helper, err);
    if (ret == 0)
        ret = amend_check_backing(n, &r, err);
    if (ret == 0 && r.has_lazy)
        ret = amend_lazy(n, r.lazy, new_version, err);
    if (ret == 0 && new_width)
        ret =
            amend_refcount_width(n, r.refcount_bits, new_version, &helper, err);
    if (ret == 0 && (r.has_data_file || r.has_data_file_raw))
        ret = amend_data_file(n, &r, err);
    if (ret == 0 && r.has_size && r.size)
        ret = bi_truncate(n, r.size, true, BI_PREALLOC_OFF, err);
    if (ret == 0 && new_version < old_version)
        ret = amend_downgrade(n, &helper, err);
    return ret;
}

/* qemu 7.2's qcow2 amend options (names, types, help texts). */
const struct bi_opt_desc qc_amend_opts[] = {
    {"backing_file", BI_OPT_STRING, "File name of a base image", NULL, 0},
    {"backing_fmt", BI_OPT_STRING, "Image format of the base image", NULL, 0},
    {"compat", BI_OPT_STRING, "Compatibility level (v2 [0.10] or v3 [1.1])",
     NULL, 0},
    {"data_file", BI_OPT_STRING, "File name of an external data file", NULL, 0},
    {"data_file_raw", BI_OPT_BOOL,
     "The external data file must stay valid as a raw image", NULL, 0},
    {"encrypt.iter-time", BI_OPT_NUMBER,
     "Time to spend in PBKDF in milliseconds", NULL, 0},
    {"encrypt.keyslot", BI_OPT_NUMBER,
     "Select a single keyslot to modify explicitly", NULL, 0},
    {"encrypt.new-secret", BI_OPT_STRING,
     "New secret to set in the matching keyslots. Empty string to erase", NULL,
     0},
    {"encrypt.old-secret", BI_OPT_STRING,
     "Select all keyslots that match this password", NULL, 0},
    {"encrypt.state", BI_OPT_STRING,
     "Select new state of affected keyslots (active/inactive)", NULL, 0},
    {"lazy_refcounts", BI_OPT_BOOL, "Postpone refcount updates", NULL, 0},
    {"refcount_bits", BI_OPT_NUMBER, "Width of a reference count entry in bits",
     NULL, 0},
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};
