/* SPDX-License-Identifier: MIT */
/*
 * qemu-img measure for qcow2: the metadata a fully allocated image of that
 * size needs (header, L2 tables, L1 table, refcount table and blocks,
 * counted to their fixed point as every cluster including refcount
 * metadata is refcounted), plus the data clusters: all of them for fully
 * allocated; for required only the clusters holding data in the source
 * (all of them with a backing file or falloc/full preallocation). Facts
 * from the qcow2 specification and QEMU's documented behaviour.
 */
#include "blkimg/convert.h"
#include "blkimg/image_ops.h"
#include "format/luks/luks.h"
#include "qcow2.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define L1E 8ULL
#define RTE 8ULL

static int parse_bool(const char *v, bool *out)
{
    if (!v || !strcmp(v, "on") || !strcmp(v, "true") || !strcmp(v, "yes")) {
        *out = true;
    } else if (!strcmp(v, "off") || !strcmp(v, "false") || !strcmp(v, "no")) {
        *out = false;
    } else {
        return -EINVAL;
    }
    return 0;
}

/* Last value of key among "key=value" strings; *found tells presence. */
static const char *opt_get(const char *const *opts, const char *key,
                           bool *found)
{
    const char *v = NULL;
    size_t kl = strlen(key);
    *found = false;
    for (; opts && *opts; opts++) {
        if (!strncmp(*opts, key, kl) &&
            ((*opts)[kl] == '=' || (*opts)[kl] == 0)) {
            *found = true;
            v = (*opts)[kl] == '=' ? *opts + kl + 1 : NULL;
        }
    }
    return v;
}

static int64_t refcount_metadata_size(int64_t clusters, uint64_t cs, int order)
{
    int64_t per_table = (int64_t)(cs / RTE);
    int64_t per_block = (int64_t)(cs * 8 / (1ULL << order));
    int64_t table = 0, blocks = 0, last, n = 0;

    do {
        last = n;
        blocks = (clusters + table + blocks + per_block - 1) / per_block;
        table = (blocks + per_table - 1) / per_table;
        n = clusters + blocks + table;
    } while (n != last);
    return (blocks + table) * (int64_t)cs;
}

static uint64_t prealloc_size(uint64_t total, uint64_t cs, int order,
                              uint64_t l2e)
{
    uint64_t meta = cs; /* header */
    uint64_t aligned = bi_align_up(total, cs);
    uint64_t nl2e = aligned / cs;
    nl2e = bi_align_up(nl2e, cs / l2e);
    meta += nl2e * l2e;
    uint64_t nl1e = nl2e * l2e / cs;
    nl1e = bi_align_up(nl1e, cs / L1E);
    meta += nl1e * L1E;
    meta += (uint64_t)refcount_metadata_size((int64_t)((meta + aligned) / cs),
                                             cs, order);
    return meta + aligned;
}

/* What the creation options say about the new image's layout. */
struct measure_params {
    bool ext_l2;
    uint64_t cs; /* cluster size */
    int version;
    uint64_t refbits;
    enum bi_prealloc prealloc;
    bool has_backing;
    uint64_t vsize; /* the size option, cluster-aligned */
    uint64_t luks;  /* bytes of the LUKS header (encrypt.format=luks) */
};

/* extended_l2 and cluster_size, checked as qcow2 create checks them. */
static int parse_clusters(const char *const *opts, struct measure_params *p,
                          bi_error *err)
{
    bool f;
    const char *v = opt_get(opts, "extended_l2", &f);
    if (f && parse_bool(v, &p->ext_l2) < 0) {
        bi_error_set(err, 0, "Parameter 'extended_l2' expects 'on' or 'off'");
        return -EINVAL;
    }
    v = opt_get(opts, "cluster_size", &f);
    if (f && (!v || bi_parse_size(v, &p->cs) < 0)) {
        bi_error_set(err, 0,
                     "Parameter 'cluster_size' expects a non-negative "
                     "number below 2^64");
        return -EINVAL;
    }
    if (!bi_is_pow2(p->cs) || p->cs < 512 || p->cs > 2 * 1024 * 1024) {
        bi_error_set(err, 0,
                     "Cluster size must be a power of two between 512 and "
                     "2048k");
        return -EINVAL;
    }
    if (p->ext_l2 && p->cs < 16384) {
        bi_error_set(err, 0,
                     "Extended L2 entries are only supported with cluster "
                     "sizes of at least 16384 bytes");
        return -EINVAL;
    }
    return 0;
}

/* compat and refcount_bits, and whether they go together. */
static int parse_compat(const char *const *opts, struct measure_params *p,
                        bi_error *err)
{
    bool f;
    const char *v = opt_get(opts, "compat", &f);
    if (f && v) {
        if (!strcmp(v, "0.10") || !strcmp(v, "v2")) {
            p->version = 2;
        } else if (!strcmp(v, "1.1") || !strcmp(v, "v3")) {
            p->version = 3;
        } else {
            bi_error_set(err, 0, "Invalid compatibility level: '%s'", v);
            return -EINVAL;
        }
    }
    v = opt_get(opts, "refcount_bits", &f);
    if (f) {
        char *end = NULL;
        errno = 0;
        unsigned long long r = v ? strtoull(v, &end, 0) : 0;
        if (!v || !*v || *end || errno) {
            bi_error_set(err, 0, "Parameter 'refcount_bits' expects a number");
            return -EINVAL;
        }
        p->refbits = r;
    }
    if (p->refbits > 64 || !bi_is_pow2(p->refbits)) {
        bi_error_set(err, 0,
                     "Refcount width must be a power of two and may not "
                     "exceed 64 bits");
        return -EINVAL;
    }
    if (p->version < 3 && p->refbits != 16) {
        bi_error_set(err, 0,
                     "Different refcount widths than 16 bits require "
                     "compatibility level 1.1 or above (use compat=1.1 or "
                     "greater)");
        return -EINVAL;
    }
    return 0;
}

/* preallocation, backing_file, encryption (the LUKS header's size) and size
 * (which must leave the L1 table within QEMU's 32 MiB). */
static int parse_rest(const char *const *opts, struct measure_params *p,
                      bi_error *err)
{
    bool f;
    const char *v = opt_get(opts, "preallocation", &f);
    if (f && v && bi_prealloc_parse(v, &p->prealloc) < 0) {
        bi_error_set(err, 0, "invalid parameter value: %s", v);
        return -EINVAL;
    }
    opt_get(opts, "backing_file", &p->has_backing);
    v = opt_get(opts, "encrypt.format", &f);
    if (f && v && !strcmp(v, "luks")) {
        /* the LUKS header's clusters, as QEMU counts them */
        char **lo = qc_luks_create_opts(opts);
        int ret = luks_new_header_len((const char *const *)lo, &p->luks, err);
        qc_luks_create_opts_free(lo);
        qc_luks_error_words(err);
        if (ret < 0)
            return ret;
    }
    v = opt_get(opts, "size", &f);
    if (v && bi_parse_size(v, &p->vsize) < 0) {
        bi_error_set(err, 0, "Parameter 'size' expects a size");
        return -EINVAL;
    }
    p->vsize = bi_align_up(p->vsize, p->cs);
    uint64_t l2e = p->ext_l2 ? 16 : 8;
    uint64_t l2_tables = (p->vsize / p->cs + p->cs / l2e - 1) / (p->cs / l2e);
    if (l2_tables * L1E > 32ULL * 1024 * 1024) {
        bi_error_set(err, 0,
                     "The image size is too large (try using a larger "
                     "cluster size)");
        return -EINVAL;
    }
    return 0;
}

/* The bytes of whole clusters (of size cs) that hold data in src's view
 * (its backing chain included), into *required. Zeroes need nothing. */
static int source_data(bi_node *src, uint64_t size, uint64_t cs,
                       uint64_t *required, bi_error *err)
{
    uint64_t off = 0, pnum;
    *required = 0;
    while (off < size) {
        struct bi_status st;
        memset(&st, 0, sizeof(st));
        int ret = bi_block_status_above(src, NULL, off, size - off, &st);
        if (ret < 0) {
            bi_error_set(err, -ret, "Unable to get block status");
            return ret;
        }
        pnum = st.len ? st.len : size - off;
        /* DATA|ZERO: a data cluster over a host file hole, data to qemu
         * (it does not look into the host file) */
        if ((st.flags & BI_BS_ZERO) && !(st.flags & BI_BS_DATA)) {
            /* zero: nothing needed */
        } else if ((st.flags & (BI_BS_DATA | BI_BS_ALLOCATED)) ==
                   (BI_BS_DATA | BI_BS_ALLOCATED)) {
            pnum = bi_align_up(off + pnum, cs) - off;
            *required += off % cs + pnum;
        }
        off += pnum;
    }
    return 0;
}

/* What src's persistent bitmaps take in an image of cluster size cs, as
 * QEMU counts it: each bitmap fully allocated (its bits in whole
 * clusters, one bit per granularity of the virtual size) plus its table
 * (8 bytes a data cluster, in whole clusters), and the directory (an
 * entry of 24 bytes and the name, 8-byte aligned) in whole clusters. */
static uint64_t bitmaps_size(bi_node *src, uint64_t size, uint64_t cs)
{
    struct bi_bitmap_info **v;
    int n;
    uint64_t total = 0, dir = 0;
    if (bi_bitmap_list(src, &v, &n) < 0)
        return 0;
    for (int i = 0; i < n; i++) {
        uint64_t bits = (size + v[i]->granularity - 1) / v[i]->granularity;
        uint64_t clusters = ((bits + 7) / 8 + cs - 1) / cs;
        total += clusters * cs + bi_align_up(clusters * 8, cs);
        dir += bi_align_up(24 + strlen(v[i]->name), 8);
    }
    bi_bitmap_list_free(v, n);
    return total + bi_align_up(dir, cs);
}

int qcow2_measure(const char *const *opts, bi_node *src, struct bi_measure *out,
                  bi_error *err)
{
    struct measure_params p = {
        .cs = 65536, .version = 3, .refbits = 16, .prealloc = BI_PREALLOC_OFF};
    int ret = parse_clusters(opts, &p, err);
    if (ret == 0)
        ret = parse_compat(opts, &p, err);
    if (ret == 0)
        ret = parse_rest(opts, &p, err);
    if (ret < 0)
        return ret;

    uint64_t required = 0, vsize = p.vsize, ssize = 0;
    if (src) {
        int64_t len = bi_getlength(src);
        if (len < 0) {
            bi_error_set(err, (int)-len, "Unable to get image virtual_size");
            return (int)len;
        }
        ssize = (uint64_t)len;
        vsize = bi_align_up(ssize, p.cs);
        if (p.has_backing) {
            required = vsize;
        } else {
            ret = source_data(src, ssize, p.cs, &required, err);
            if (ret < 0)
                return ret;
        }
    }
    if (p.prealloc == BI_PREALLOC_FULL || p.prealloc == BI_PREALLOC_FALLOC)
        required = vsize;
    int order = __builtin_ctzll(p.refbits);
    uint64_t luks = bi_align_up(p.luks, p.cs);
    out->fully_allocated =
        prealloc_size(vsize, p.cs, order, p.ext_l2 ? 16 : 8) + luks;
    out->required = out->fully_allocated - vsize + required;
    out->has_bitmaps = p.version >= 3 && src && bi_bitmap_supported(src);
    out->bitmaps = out->has_bitmaps ? bitmaps_size(src, ssize, p.cs) : 0;
    return 0;
}
