/* SPDX-License-Identifier: MIT */
/*
 * qcow2 image creation. Layout, as QEMU's for the common case:
 *   cluster 0 header | refcount table | refcount blocks | L1 table
 * With preallocation, as QEMU: an empty image grown by the driver's truncate
 * in the preallocation mode (see create_preallocated).
 */
#include "crypto/secret.h"
#include "format/luks/luks.h"
#include "qcow2.h"
#include "util/util.h"
#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct qc_create {
    uint64_t size;
    int version;
    uint64_t cluster_size;
    int cluster_bits;
    int refcount_order;
    bool lazy;
    bool ext_l2;
    int compression;
    const char *backing_file;
    const char *backing_fmt;
    const char *data_file;
    bool data_file_raw;
    enum bi_prealloc prealloc;
    bool prealloc_meta_only; /* L2 tables mapped, no data preallocation */
    uint32_t crypt;          /* QCOW2_CRYPT_* */
    char **luks_opts;        /* encrypt.* keys unprefixed (LUKS and AES) */
    uint64_t crypto_off, crypto_len; /* the LUKS header, once written */
};

/* qemu 7.2's qcow2 creation options (names, types, help texts, the
 * defaults its "Formatting" line shows), in its order. */
const struct bi_opt_desc qc_create_opts[] = {
    {"encryption", BI_OPT_BOOL,
     "Encrypt the image with format 'aes'. (Deprecated in favor of "
     "encrypt.format=aes)",
     NULL, 0},
    {"encrypt.format", BI_OPT_STRING,
     "Encrypt the image, format choices: 'aes', 'luks'", NULL, 0},
    {"encrypt.key-secret", BI_OPT_STRING,
     "ID of secret providing qcow AES key or LUKS passphrase", NULL, 0},
    {"encrypt.cipher-alg", BI_OPT_STRING, "Name of encryption cipher algorithm",
     NULL, 0},
    {"encrypt.cipher-mode", BI_OPT_STRING, "Name of encryption cipher mode",
     NULL, 0},
    {"encrypt.ivgen-alg", BI_OPT_STRING, "Name of IV generator algorithm", NULL,
     0},
    {"encrypt.ivgen-hash-alg", BI_OPT_STRING,
     "Name of IV generator hash algorithm", NULL, 0},
    {"encrypt.hash-alg", BI_OPT_STRING, "Name of encryption hash algorithm",
     NULL, 0},
    {"encrypt.iter-time", BI_OPT_NUMBER,
     "Time to spend in PBKDF in milliseconds", NULL, 0},
    {"cluster_size", BI_OPT_SIZE, "qcow2 cluster size", "65536", 0},
    {"extended_l2", BI_OPT_BOOL, "Extended L2 tables", "off", 0},
    {"preallocation", BI_OPT_STRING,
     "Preallocation mode (allowed values: off, metadata, falloc, full)", NULL,
     0},
    {"compression_type", BI_OPT_STRING,
     "Compression method used for image cluster compression", "zlib", 0},
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"compat", BI_OPT_STRING, "Compatibility level (v2 [0.10] or v3 [1.1])",
     NULL, 0},
    {"backing_file", BI_OPT_STRING, "File name of a base image", NULL, 0},
    {"backing_fmt", BI_OPT_STRING, "Image format of the base image", NULL, 0},
    {"data_file", BI_OPT_STRING, "File name of an external data file", NULL, 0},
    {"data_file_raw", BI_OPT_BOOL,
     "The external data file must stay valid as a raw image", NULL, 0},
    {"lazy_refcounts", BI_OPT_BOOL, "Postpone refcount updates", "off", 0},
    {"refcount_bits", BI_OPT_NUMBER, "Width of a reference count entry in bits",
     "16", 0},
    {NULL, 0, NULL, NULL, 0},
};

static int parse_bool(const char *key, const char *v, bool *out, bi_error *err)
{
    if (!v || !strcmp(v, "on")) {
        *out = true;
        return 0;
    }
    if (!strcmp(v, "off")) {
        *out = false;
        return 0;
    }
    return qc_error(err, -EINVAL, "Parameter '%s' expects 'on' or 'off'", key);
}

/* The encryption options (encryption=on or encrypt.format, and the
 * encrypt.* keys) into c, checked as QEMU 7.2 checks them before the
 * cipher's own options. */
static int parse_encryption(const struct bi_optlist *l, bool encryption,
                            const char *fmt, struct qc_create *c, bi_error *err)
{
    char **kv = bi_xzalloc(sizeof(*kv) * (size_t)(l->n + 1));
    int n = 0, ret = 0;
    for (int i = 0; i < l->n; i++)
        if (!strncmp(l->v[i].key, "encrypt.", 8) &&
            strcmp(l->v[i].key, "encrypt.format"))
            kv[n++] = bi_xasprintf("%s=%s", l->v[i].key,
                                   l->v[i].value ? l->v[i].value : "");
    if (encryption && fmt)
        ret = qc_error(err, -EINVAL,
                       "'encrypt.format' and its alias 'encryption' can't "
                       "be used at the same time");
    else if (encryption)
        fmt = "aes";
    if (ret == 0 && !fmt && n)
        ret = qc_error(err, -EINVAL, "Parameter 'encrypt.format' is missing");
    if (ret == 0 && fmt && strcmp(fmt, "aes") && strcmp(fmt, "luks"))
        ret = qc_error(err, -EINVAL,
                       "Parameter 'format' does not accept value '%s'", fmt);
    if (ret == 0 && fmt) {
        c->crypt = !strcmp(fmt, "aes") ? QCOW2_CRYPT_AES : QCOW2_CRYPT_LUKS;
        c->luks_opts = qc_luks_create_opts((const char *const *)kv);
    }
    qc_luks_create_opts_free(kv);
    return ret;
}

static int parse_opts(const struct bi_create_opts *o, struct qc_create *c,
                      bi_error *err)
{
    struct bi_optlist l = {0, NULL};
    int ret = 0;
    bool have_refcount_bits = false;
    bool dup_done = false;
    uint64_t refcount_bits = 16;
    bool encryption = false;
    const char *enc_fmt = NULL;

    memset(c, 0, sizeof(*c));
    c->version = 3;
    c->cluster_size = 65536;
    c->size = o->size;
    c->prealloc = o->prealloc;
    c->backing_file = o->backing_file;
    c->backing_fmt = o->backing_fmt;
    for (const char *const *p = o->options; p && *p; p++) {
        ret = bi_optlist_parse(&l, *p);
        if (ret < 0) {
            qc_error(err, -EINVAL, "Invalid option list: %s", *p);
            goto out;
        }
    }
    for (int i = 0; i < l.n; i++) {
        const char *k = l.v[i].key, *v = l.v[i].value;
        if (!strcmp(k, "size")) {
            if (!v || bi_parse_size(v, &c->size) < 0) {
                ret = qc_error(err, -EINVAL,
                               "Parameter 'size' expects a "
                               "non-negative number below 2^64");
                goto out;
            }
        } else if (!strcmp(k, "compat")) {
            if (v && (!strcmp(v, "0.10") || !strcmp(v, "v2")))
                c->version = 2;
            else if (v && (!strcmp(v, "1.1") || !strcmp(v, "v3")))
                c->version = 3;
            else {
                ret = qc_error(err, -EINVAL,
                               "Parameter 'version' does not accept value '%s'",
                               v ? v : "");
                goto out;
            }
        } else if (!strcmp(k, "backing_file")) {
            c->backing_file = v;
        } else if (!strcmp(k, "backing_fmt")) {
            c->backing_fmt = v;
        } else if (!strcmp(k, "cluster_size")) {
            uint64_t cs;
            if (!v || bi_parse_size(v, &cs) < 0 || !bi_is_pow2(cs) ||
                cs < 512 || cs > (2u << 20)) {
                ret = qc_error(err, -EINVAL,
                               "Cluster size must be a power of "
                               "two between 512 and 2048k");
                goto out;
            }
            c->cluster_size = cs;
        } else if (!strcmp(k, "preallocation")) {
            if (!v || bi_prealloc_parse(v, &c->prealloc) < 0) {
                ret = qc_error(err, -EINVAL,
                               "Parameter 'preallocation' does not "
                               "accept value '%s'",
                               v ? v : "");
                goto out;
            }
        } else if (!strcmp(k, "lazy_refcounts")) {
            ret = parse_bool("lazy_refcounts", v, &c->lazy, err);
            if (ret < 0)
                goto out;
        } else if (!strcmp(k, "refcount_bits")) {
            char *e;
            unsigned long long b = v ? strtoull(v, &e, 10) : 0;
            if (!v || *e || !b || b > 64 || !bi_is_pow2(b)) {
                ret = qc_error(err, -EINVAL,
                               "Refcount width must be a power of "
                               "two and may not exceed 64 bits");
                goto out;
            }
            refcount_bits = b;
            have_refcount_bits = true;
        } else if (!strcmp(k, "extended_l2")) {
            ret = parse_bool("extended_l2", v, &c->ext_l2, err);
            if (ret < 0)
                goto out;
        } else if (!strcmp(k, "compression_type")) {
            if (v && !strcmp(v, "zlib"))
                c->compression = QCOW2_COMPRESSION_ZLIB;
            else if (v && !strcmp(v, "zstd"))
                c->compression = QCOW2_COMPRESSION_ZSTD;
            else {
                ret = qc_error(err, -EINVAL,
                               "Parameter 'compression-type' does "
                               "not accept value '%s'",
                               v ? v : "");
                goto out;
            }
        } else if (!strcmp(k, "data_file")) {
            c->data_file = v;
        } else if (!strcmp(k, "data_file_raw")) {
            ret = parse_bool("data_file_raw", v, &c->data_file_raw, err);
            if (ret < 0)
                goto out;
        } else if (!strcmp(k, "encryption")) {
            ret = parse_bool("encryption", v, &encryption, err);
            if (ret < 0)
                goto out;
        } else if (!strcmp(k, "encrypt.format")) {
            enc_fmt = v ? v : "";
        } else if (!strncmp(k, "encrypt.", 8)) {
            continue; /* gathered below */
        } else {
            ret = qc_error(err, -EINVAL, "Invalid parameter '%s'", k);
            goto out;
        }
    }
    ret = parse_encryption(&l, encryption, enc_fmt, c, err);
    if (ret < 0)
        goto out;
    /* option strings live in l; keep the ones we point to */
    if (c->backing_file && c->backing_file != o->backing_file)
        c->backing_file = bi_xstrdup(c->backing_file);
    if (c->backing_fmt && c->backing_fmt != o->backing_fmt)
        c->backing_fmt = bi_xstrdup(c->backing_fmt);
    if (c->data_file)
        c->data_file = bi_xstrdup(c->data_file);
    dup_done = true;

    c->cluster_bits = __builtin_ctzll(c->cluster_size);
    c->refcount_order = __builtin_ctzll(refcount_bits);
    const char *v3hint = "(use version=v3 or greater)";
    if (c->version == 2) {
        if (have_refcount_bits && refcount_bits != 16) {
            ret = qc_error(err, -EINVAL,
                           "Different refcount widths than 16 bits require "
                           "compatibility level 1.1 or above %s",
                           v3hint);
            goto out;
        }
        if (c->lazy) {
            ret = qc_error(err, -EINVAL,
                           "Lazy refcounts only supported with compatibility "
                           "level 1.1 and above %s",
                           v3hint);
            goto out;
        }
        if (c->ext_l2) {
            ret = qc_error(err, -EINVAL,
                           "Extended L2 entries are only supported with "
                           "compatibility level 1.1 and above %s",
                           v3hint);
            goto out;
        }
        if (c->compression != QCOW2_COMPRESSION_ZLIB) {
            ret = qc_error(err, -EINVAL,
                           "Non-zlib compression type is only supported with "
                           "compatibility level 1.1 and above %s",
                           v3hint);
            goto out;
        }
        if (c->data_file) {
            ret = qc_error(err, -EINVAL,
                           "External data files are only supported with "
                           "compatibility level 1.1 and above %s",
                           v3hint);
            goto out;
        }
    }
    if (c->ext_l2 && c->cluster_size < 16384) {
        ret = qc_error(err, -EINVAL,
                       "Extended L2 entries are only supported "
                       "with cluster sizes of at least 16384 "
                       "bytes");
        goto out;
    }
    if (c->data_file_raw && !c->data_file) {
        ret = qc_error(err, -EINVAL, "data-file-raw requires data-file");
        goto out;
    }
    if (c->data_file_raw && c->backing_file) {
        ret = qc_error(err, -EINVAL,
                       "Backing file and data-file-raw cannot be "
                       "used at the same time");
        goto out;
    }
    if (c->backing_file && c->prealloc != BI_PREALLOC_OFF && !c->ext_l2) {
        ret = qc_error(err, -EINVAL,
                       "Backing file and preallocation can only "
                       "be used at the same time if extended_l2 "
                       "is on");
        goto out;
    }
    /* a raw data file is the disk: every cluster maps to it from the
     * start, as QEMU does */
    if (c->data_file_raw && c->prealloc == BI_PREALLOC_OFF)
        c->prealloc_meta_only = true;
    if (c->backing_file && !c->backing_fmt) {
        ret = qc_error(err, -EINVAL,
                       "Backing file specified without backing format");
        goto out;
    }
    if (c->backing_file && strlen(c->backing_file) > QCOW2_MAX_BACKING_NAME) {
        ret = qc_error(err, -EINVAL, "Backing file name too long");
        goto out;
    }
out:
    if (ret < 0) {
        /* copies made above are freed; nothing points into the freed
         * option list */
        if (dup_done) {
            if (c->backing_file && c->backing_file != o->backing_file)
                free((char *)c->backing_file);
            if (c->backing_fmt && c->backing_fmt != o->backing_fmt)
                free((char *)c->backing_fmt);
            free((char *)c->data_file);
        }
        c->backing_file = o->backing_file;
        c->backing_fmt = o->backing_fmt;
        c->data_file = NULL;
    }
    bi_optlist_free(&l);
    return ret;
}

static size_t add_ext(uint8_t *buf, size_t pos, uint32_t type, const void *data,
                      uint32_t len)
{
    qc_put32(buf + pos, type);
    qc_put32(buf + pos + 4, len);
    memcpy(buf + pos + 8, data, len);
    return pos + 8 + bi_align_up(len, 8);
}

static const struct {
    uint8_t type, bit;
    const char *name;
} feature_names[] = {
    {0, 0, "dirty bit"},
    {0, 1, "corrupt bit"},
    {0, 2, "external data file"},
    {0, 3, "compression type"},
    {0, 4, "extended L2 entries"},
    {1, 0, "lazy refcounts"},
    {2, 0, "bitmaps"},
    {2, 1, "raw external data"},
};

/* Builds the header cluster; returns 0 or -errno. */
static int build_header(const struct qc_create *c, uint8_t *buf,
                        uint64_t l1_off, uint32_t l1_size, uint64_t rt_off,
                        uint32_t rt_clusters, const char *data_file_name,
                        bi_error *err)
{
    uint64_t cs = c->cluster_size;
    memset(buf, 0, cs);
    qc_put32(buf + QH_MAGIC, QCOW2_MAGIC);
    qc_put32(buf + QH_VERSION, (uint32_t)c->version);
    qc_put32(buf + QH_CLUSTER_BITS, (uint32_t)c->cluster_bits);
    qc_put64(buf + QH_SIZE, c->size);
    qc_put32(buf + QH_L1_SIZE, l1_size);
    qc_put64(buf + QH_L1_OFFSET, l1_off);
    qc_put64(buf + QH_RT_OFFSET, rt_off);
    qc_put32(buf + QH_RT_CLUSTERS, rt_clusters);
    qc_put32(buf + QH_CRYPT, c->crypt);
    size_t hlen = QH_V2_LENGTH;
    if (c->version >= 3) {
        uint64_t incompat = 0, compat = 0, autoclear = 0;
        if (c->data_file)
            incompat |= QCOW2_INCOMPAT_DATA_FILE;
        if (c->compression != QCOW2_COMPRESSION_ZLIB)
            incompat |= QCOW2_INCOMPAT_COMPRESSION;
        if (c->ext_l2)
            incompat |= QCOW2_INCOMPAT_EXTL2;
        if (c->lazy)
            compat |= QCOW2_COMPAT_LAZY_REFCOUNTS;
        if (c->data_file_raw)
            autoclear |= QCOW2_AUTOCLEAR_DATA_FILE_RAW;
        qc_put64(buf + QH_INCOMPAT, incompat);
        qc_put64(buf + QH_COMPAT, compat);
        qc_put64(buf + QH_AUTOCLEAR, autoclear);
        qc_put32(buf + QH_REFCOUNT_ORDER, (uint32_t)c->refcount_order);
        qc_put32(buf + QH_HEADER_LENGTH, QH_V3_LENGTH);
        buf[QH_COMPRESSION_TYPE] = (uint8_t)c->compression;
        hlen = QH_V3_LENGTH;
    }
    size_t blen = c->backing_file ? strlen(c->backing_file) : 0;
    size_t need = hlen;
    if (c->backing_fmt && c->backing_file)
        need += 8 + bi_align_up(strlen(c->backing_fmt), 8);
    if (data_file_name)
        need += 8 + bi_align_up(strlen(data_file_name), 8);
    if (c->crypto_len)
        need += 8 + 16;
    need += 8 + blen; /* end marker, backing name */
    if (need > cs)
        return qc_error(err, -ENOSPC,
                        "Header extensions do not fit in the "
                        "first cluster");
    size_t pos = hlen;
    if (c->backing_fmt && c->backing_file)
        pos = add_ext(buf, pos, QCOW2_EXT_BACKING_FORMAT, c->backing_fmt,
                      (uint32_t)strlen(c->backing_fmt));
    if (data_file_name)
        pos = add_ext(buf, pos, QCOW2_EXT_DATA_FILE, data_file_name,
                      (uint32_t)strlen(data_file_name));
    if (c->crypto_len) {
        uint8_t ext[16];
        qc_put64(ext, c->crypto_off);
        qc_put64(ext + 8, c->crypto_len);
        pos = add_ext(buf, pos, QCOW2_EXT_CRYPTO, ext, sizeof(ext));
    }
    /* QEMU 7.2 leaves the feature name table out of images with clusters
     * of 4 KiB and less */
    size_t ft = BI_ARRAY_SIZE(feature_names) * 48;
    if (c->version >= 3 && cs > 4096 && need + 8 + ft <= cs) {
        uint8_t tbl[BI_ARRAY_SIZE(feature_names) * 48];
        memset(tbl, 0, sizeof(tbl));
        for (size_t i = 0; i < BI_ARRAY_SIZE(feature_names); i++) {
            tbl[i * 48] = feature_names[i].type;
            tbl[i * 48 + 1] = feature_names[i].bit;
            memcpy(tbl + i * 48 + 2, feature_names[i].name,
                   strlen(feature_names[i].name));
        }
        pos = add_ext(buf, pos, QCOW2_EXT_FEATURE_TABLE, tbl, (uint32_t)ft);
    }
    pos += 8; /* end of extensions */
    if (c->backing_file) {
        qc_put64(buf + QH_BACKING_OFFSET, pos);
        qc_put32(buf + QH_BACKING_SIZE, (uint32_t)blen);
        memcpy(buf + pos, c->backing_file, blen);
    }
    return 0;
}

static void refblock_set(int order, uint8_t *p, uint64_t i, uint64_t v)
{
    switch (order) {
    case 0:
    case 1:
    case 2: {
        uint64_t bit = i << order;
        unsigned w = 1u << order;
        unsigned mask = ((1u << w) - 1) << (bit % 8);
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
    case 5:
        qc_put32(p + i * 4, (uint32_t)v);
        break;
    default:
        qc_put64(p + i * 8, v);
        break;
    }
}

static char *dir_join(const char *base, const char *name)
{
    if (name[0] == '/')
        return bi_xstrdup(name);
    const char *sl = strrchr(base, '/');
    if (!sl)
        return bi_xstrdup(name);
    return bi_xasprintf("%.*s/%s", (int)(sl - base), base, name);
}

static int write_image(const char *filename, const struct qc_create *c,
                       bi_error *err)
{
    uint64_t cs = c->cluster_size;
    uint64_t l2_entries = cs / (c->ext_l2 ? 16 : 8);
    uint64_t guest_clusters = (c->size + cs - 1) / cs;
    uint64_t l1_size = (guest_clusters + l2_entries - 1) / l2_entries;
    uint64_t l1_clusters = (l1_size * 8 + cs - 1) / cs;
    uint64_t rb_entries = cs * 8 >> c->refcount_order;
    uint64_t t = 1, r = 1;
    int ret;

    if (l1_size * 8 > QCOW2_MAX_L1_BYTES)
        return qc_error(err, -EFBIG,
                        "Image size too large (L1 table would "
                        "exceed 32 MiB)");
    /* refcount table T clusters and R blocks covering everything */
    for (;;) {
        uint64_t total = 1 + t + r + l1_clusters;
        uint64_t r2 = (total + rb_entries - 1) / rb_entries;
        uint64_t t2 = (r2 * 8 + cs - 1) / cs;
        if (r2 == r && t2 == t)
            break;
        r = BI_MAX(r, r2);
        t = BI_MAX(t, t2);
    }
    if (t * cs > QCOW2_MAX_REFTABLE_BYTES)
        return qc_error(err, -EFBIG,
                        "Image size too large for the refcount "
                        "table");
    uint64_t rt_off = cs;
    uint64_t rb_off = (1 + t) * cs;
    uint64_t l1_off = l1_size ? (1 + t + r) * cs : 0;
    uint64_t total = 1 + t + r + (l1_size ? l1_clusters : 0);

    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.read_write = true;
    oo.no_lock = false;
    struct bi_create_opts fco;
    bi_create_opts_init(&fco);
    fco.format = "file";
    fco.size = 0;
    fco.size_set = true;
    ret = bi_create_file(filename, &fco, err);
    if (ret < 0)
        return ret;
    bi_node *f = bi_open_protocol(filename, &oo, err);
    if (!f)
        return err && err->code ? err->code : -EIO;

    uint8_t *buf = bi_blockalign(f, cs);
    if (!buf) {
        ret = -ENOMEM;
        goto out;
    }
    ret = build_header(c, buf, l1_off, (uint32_t)l1_size, rt_off, (uint32_t)t,
                       c->data_file, err);
    if (ret < 0)
        goto out;
    ret = bi_pwrite(f, 0, buf, cs, 0);
    if (ret < 0)
        goto io_err;
    /* refcount table */
    for (uint64_t i = 0; i < t; i++) {
        memset(buf, 0, cs);
        for (uint64_t e = 0; e < cs / 8; e++) {
            uint64_t bi = i * (cs / 8) + e;
            if (bi < r)
                qc_put64(buf + e * 8, rb_off + bi * cs);
        }
        ret = bi_pwrite(f, rt_off + i * cs, buf, cs, 0);
        if (ret < 0)
            goto io_err;
    }
    /* refcount blocks: every cluster in [0, total) has refcount 1 */
    for (uint64_t i = 0; i < r; i++) {
        memset(buf, 0, cs);
        for (uint64_t e = 0; e < rb_entries; e++) {
            if (i * rb_entries + e >= total)
                break;
            refblock_set(c->refcount_order, buf, e, 1);
        }
        ret = bi_pwrite(f, rb_off + i * cs, buf, cs, 0);
        if (ret < 0)
            goto io_err;
    }
    /* L1 table */
    for (uint64_t i = 0; i < (l1_size ? l1_clusters : 0); i++) {
        memset(buf, 0, cs);
        /* QEMU's file ends with the L1 entries, unpadded */
        uint64_t len = cs;
        if (i == l1_clusters - 1)
            len = l1_size * 8 - i * cs;
        ret = bi_pwrite(f, l1_off + i * cs, buf, len, 0);
        if (ret < 0)
            goto io_err;
    }
    ret = bi_flush(f);
    if (ret < 0)
        goto io_err;
    goto out;
io_err:
    qc_error(err, ret, "Could not write qcow2 header: %s", strerror(-ret));
out:
    bi_free_aligned(buf);
    bi_error e2;
    bi_error_init(&e2);
    bi_close(f, &e2);
    return ret;
}

/* Preallocation as QEMU lays it out: an empty image first, then grown to
 * its size through the driver's truncate with the preallocation mode (the
 * resize path, which places L1, L2 tables, refcount structures and data as
 * qemu-img does). The backing file is not opened meanwhile: QEMU attaches
 * it after the truncate, so it does not shape the preallocated entries.
 * On failure the file is removed, as qemu-img removes it. */
static int create_preallocated(const char *filename, const struct qc_create *c,
                               bi_error *err)
{
    struct qc_create empty = *c;
    empty.size = 0;
    empty.prealloc = BI_PREALLOC_OFF;
    empty.prealloc_meta_only = false;
    int ret = write_image(filename, &empty, err);
    if (ret < 0)
        return ret;
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.format = "qcow2";
    oo.read_write = true;
    oo.no_backing = true;
    bi_node *n = bi_open(filename, &oo, err);
    if (!n) {
        ret = err && err->code ? err->code : -EIO;
        goto fail;
    }
    /* a raw external data file stays mapped: metadata at least */
    enum bi_prealloc mode =
        c->prealloc == BI_PREALLOC_OFF ? BI_PREALLOC_METADATA : c->prealloc;
    ret = bi_truncate(n, c->size, false, mode, err);
    if (ret < 0) {
        bi_error_prefix(err, "Could not resize image");
        bi_close(n, NULL);
        goto fail;
    }
    ret = bi_close(n, err);
    if (ret < 0)
        goto fail;
    return 0;
fail:
    unlink(filename);
    return ret;
}

/* The key material of a new encrypted image, made before the file is:
 * LUKS, a header with a new master key; AES, the secret checked. */
struct qc_new_key {
    struct luks_header h;
    char *pw;
    uint8_t *mk;
    uint64_t iter_time;
};

static int new_key(const struct qc_create *c, struct qc_new_key *k,
                   bi_error *err)
{
    memset(k, 0, sizeof(*k));
    int ret;
    if (c->crypt == QCOW2_CRYPT_LUKS) {
        ret = luks_new_header((const char *const *)c->luks_opts, &k->h, &k->pw,
                              &k->mk, &k->iter_time, err);
    } else {
        const char *id =
            luks_opt((const char *const *)c->luks_opts, "key-secret");
        ret = id ? bi_secret_lookup_utf8(id, &k->pw, err)
                 : qc_error(err, -EINVAL,
                            "Parameter 'key-secret' is required for cipher");
    }
    qc_luks_error_words(err);
    return ret;
}

static void free_key(struct qc_new_key *k)
{
    if (k->mk)
        bi_crypto_wipe_free(k->mk, k->h.key_bytes);
    bi_secret_free(k->pw);
    explicit_bzero(&k->h, sizeof(k->h));
}

/* Rewrites the header of the image at filename (made by write_image or
 * create_preallocated) with c's encryption method and crypto extension,
 * as QEMU's header update after its encryption set-up. */
static int write_crypt_header(const char *filename, const struct qc_create *c,
                              bi_error *err)
{
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.read_write = true;
    bi_node *f = bi_open_protocol(filename, &oo, err);
    if (!f)
        return err && err->code ? err->code : -EIO;
    uint8_t *buf = bi_blockalign(f, c->cluster_size);
    int ret = buf ? bi_pread(f, 0, buf, c->cluster_size) : -ENOMEM;
    if (ret == 0) {
        uint64_t l1_off = qc_get64(buf + QH_L1_OFFSET);
        uint32_t l1_size = qc_get32(buf + QH_L1_SIZE);
        uint64_t rt_off = qc_get64(buf + QH_RT_OFFSET);
        uint32_t rt_cl = qc_get32(buf + QH_RT_CLUSTERS);
        ret = build_header(c, buf, l1_off, l1_size, rt_off, rt_cl, c->data_file,
                           err);
    }
    if (ret == 0)
        ret = bi_pwrite(f, 0, buf, c->cluster_size, 0);
    if (ret == 0)
        ret = bi_flush(f);
    if (ret < 0 && err && !err->msg[0])
        qc_error(err, ret, "Could not write qcow2 header: %s", strerror(-ret));
    bi_free_aligned(buf);
    bi_close(f, NULL);
    return ret;
}

/* Encrypts the new image at filename as QEMU's qcow2_set_up_encryption
 * after its resize: the LUKS header in clusters allocated after the
 * image's metadata, then the header's method and extension. */
static int set_up_encryption(const char *filename, struct qc_create *c,
                             struct qc_new_key *k, bi_error *err)
{
    if (c->crypt == QCOW2_CRYPT_LUKS) {
        struct bi_open_opts oo;
        bi_open_opts_init(&oo);
        oo.format = "qcow2";
        oo.read_write = true;
        oo.no_backing = true;
        bi_node *n = bi_open(filename, &oo, err);
        if (!n)
            return err && err->code ? err->code : -EIO;
        int ret = qc_luks_create_header(n, &k->h, k->pw, k->mk, k->iter_time,
                                        &c->crypto_off, &c->crypto_len, err);
        int r2 = bi_close(n, ret < 0 ? NULL : err);
        if (ret < 0 || r2 < 0)
            return ret < 0 ? ret : r2;
    }
    return write_crypt_header(filename, c, err);
}

int qcow2_create(const char *filename, const struct bi_create_opts *o,
                 bi_error *err)
{
    struct qc_new_key key;
    bool have_key = false;
    struct qc_create c;
    int ret = parse_opts(o, &c, err);
    if (ret < 0)
        goto out;
    if (!o->size_set && !c.size) {
        bool size_opt = false;
        for (const char *const *p = o->options; p && *p; p++)
            if (strstr(*p, "size=") == *p || strstr(*p, ",size="))
                size_opt = true;
        if (!size_opt && c.backing_file) {
            char *bpath = dir_join(filename, c.backing_file);
            struct bi_open_opts bo;
            bi_open_opts_init(&bo);
            bo.format = c.backing_fmt;
            bo.force_share = true;
            bo.quiet_probe = true;
            bi_node *b = bi_open(bpath, &bo, err);
            free(bpath);
            if (!b) {
                ret = err && err->code ? err->code : -EIO;
                goto out;
            }
            int64_t bs = bi_getlength(b);
            bi_error e2;
            bi_error_init(&e2);
            bi_close(b, &e2);
            if (bs < 0) {
                ret = qc_error(err, (int)bs,
                               "Could not get the size of the "
                               "backing file");
                goto out;
            }
            c.size = (uint64_t)bs;
        } else if (!size_opt) {
            ret =
                qc_error(err, -EINVAL, "Image creation needs a size parameter");
            goto out;
        }
    }
    if (c.size > INT64_MAX) {
        ret = qc_error(err, -EFBIG, "Image size too large");
        goto out;
    }
    if (c.data_file) {
        char *dpath = dir_join(filename, c.data_file);
        struct bi_create_opts dco;
        bi_create_opts_init(&dco);
        dco.format = "file";
        dco.size = c.size;
        dco.size_set = true;
        dco.prealloc =
            c.prealloc == BI_PREALLOC_METADATA ? BI_PREALLOC_OFF : c.prealloc;
        ret = bi_create_file(dpath, &dco, err);
        free(dpath);
        if (ret < 0)
            goto out;
    }
    uint32_t crypt = c.crypt;
    if (crypt) {
        ret = new_key(&c, &key, err);
        have_key = true;
        if (ret < 0)
            goto out;
    }
    c.crypt = QCOW2_CRYPT_NONE; /* until the LUKS header is in place */
    if (c.prealloc != BI_PREALLOC_OFF || c.prealloc_meta_only)
        ret = create_preallocated(filename, &c, err);
    else
        ret = write_image(filename, &c, err);
    c.crypt = crypt;
    if (ret == 0 && crypt) {
        ret = set_up_encryption(filename, &c, &key, err);
        if (ret < 0)
            unlink(filename);
    }
out:
    if (have_key)
        free_key(&key);
    qc_luks_create_opts_free(c.luks_opts);
    if (c.backing_file && c.backing_file != o->backing_file)
        free((char *)c.backing_file);
    if (c.backing_fmt && c.backing_fmt != o->backing_fmt)
        free((char *)c.backing_fmt);
    free((char *)c.data_file);
    return ret;
}
