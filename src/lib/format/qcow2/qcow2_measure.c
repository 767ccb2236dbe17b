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

int qcow2_measure(const char *const *opts, bi_node *src, struct bi_measure *out,
                  bi_error *err)
{
    bool f;
    const char *v;
    bool ext_l2 = false;
    uint64_t cs = 65536;
    int version = 3;
    uint64_t refbits = 16;
    enum bi_prealloc prealloc = BI_PREALLOC_OFF;
    bool has_backing;

    v = opt_get(opts, "extended_l2", &f);
    if (f && parse_bool(v, &ext_l2) < 0) {
        bi_error_set(err, 0, "Parameter 'extended_l2' expects 'on' or 'off'");
        return -EINVAL;
    }
    v = opt_get(opts, "cluster_size", &f);
    if (f) {
        if (!v || bi_parse_size(v, &cs) < 0) {
            bi_error_set(err, 0,
                         "Parameter 'cluster_size' expects a non-negative "
                         "number below 2^64");
            return -EINVAL;
        }
    }
    if (!bi_is_pow2(cs) || cs < 512 || cs > 2 * 1024 * 1024) {
        bi_error_set(err, 0,
                     "Cluster size must be a power of two between 512 and "
                     "2048k");
        return -EINVAL;
    }
    if (ext_l2 && cs < 16384) {
        bi_error_set(err, 0,
                     "Extended L2 entries are only supported with cluster "
                     "sizes of at least 16384 bytes");
        return -EINVAL;
    }
    v = opt_get(opts, "compat", &f);
    if (f && v) {
        if (!strcmp(v, "0.10") || !strcmp(v, "v2")) {
            version = 2;
        } else if (!strcmp(v, "1.1") || !strcmp(v, "v3")) {
            version = 3;
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
        refbits = r;
    }
    if (refbits > 64 || !bi_is_pow2(refbits)) {
        bi_error_set(err, 0,
                     "Refcount width must be a power of two and may not "
                     "exceed 64 bits");
        return -EINVAL;
    }
    if (version < 3 && refbits != 16) {
        bi_error_set(err, 0,
                     "Different refcount widths than 16 bits require "
                     "compatibility level 1.1 or above (use compat=1.1 or "
                     "greater)");
        return -EINVAL;
    }
    v = opt_get(opts, "preallocation", &f);
    if (f && v && bi_prealloc_parse(v, &prealloc) < 0) {
        bi_error_set(err, 0, "invalid parameter value: %s", v);
        return -EINVAL;
    }
    opt_get(opts, "backing_file", &has_backing);
    v = opt_get(opts, "encrypt.format", &f);
    if (f && v && !strcmp(v, "luks")) {
        bi_error_set(err, 0, "LUKS encryption is not supported");
        return -ENOTSUP;
    }

    uint64_t vsize = 0;
    v = opt_get(opts, "size", &f);
    if (v && bi_parse_size(v, &vsize) < 0) {
        bi_error_set(err, 0, "Parameter 'size' expects a size");
        return -EINVAL;
    }
    vsize = bi_align_up(vsize, cs);
    uint64_t l2e = ext_l2 ? 16 : 8;
    uint64_t l2_tables = (vsize / cs + cs / l2e - 1) / (cs / l2e);
    if (l2_tables * L1E > 32ULL * 1024 * 1024) {
        bi_error_set(err, 0,
                     "The image size is too large (try using a larger "
                     "cluster size)");
        return -EINVAL;
    }

    uint64_t required = 0;
    if (src) {
        int64_t ssize = bi_getlength(src);
        if (ssize < 0) {
            bi_error_set(err, (int)-ssize, "Unable to get image virtual_size");
            return (int)ssize;
        }
        vsize = bi_align_up((uint64_t)ssize, cs);
        if (has_backing) {
            required = vsize;
        } else {
            uint64_t off = 0, pnum;
            while (off < (uint64_t)ssize) {
                struct bi_status st;
                memset(&st, 0, sizeof(st));
                int ret = bi_block_status_above(src, NULL, off,
                                                (uint64_t)ssize - off, &st);
                if (ret < 0) {
                    bi_error_set(err, -ret, "Unable to get block status");
                    return ret;
                }
                pnum = st.len ? st.len : (uint64_t)ssize - off;
                /* DATA|ZERO: a data cluster over a host file hole, data to
                 * qemu (it does not look into the host file) */
                if ((st.flags & BI_BS_ZERO) && !(st.flags & BI_BS_DATA)) {
                    /* zero: nothing needed */
                } else if ((st.flags & (BI_BS_DATA | BI_BS_ALLOCATED)) ==
                           (BI_BS_DATA | BI_BS_ALLOCATED)) {
                    pnum = bi_align_up(off + pnum, cs) - off;
                    required += off % cs + pnum;
                }
                off += pnum;
            }
        }
    }
    if (prealloc == BI_PREALLOC_FULL || prealloc == BI_PREALLOC_FALLOC) {
        required = vsize;
    }
    int order = __builtin_ctzll(refbits);
    out->fully_allocated = prealloc_size(vsize, cs, order, l2e);
    out->required = out->fully_allocated - vsize + required;
    out->has_bitmaps = version >= 3 && src && src->drv == &bi_drv_qcow2;
    out->bitmaps = 0;
    return 0;
}
