/* SPDX-License-Identifier: MIT */
/*
 * qcow2: header parsing with full bounds checks, open/close, info and the
 * driver table. See qcow2.h for the layout of the driver.
 */
#include "qcow2.h"
#include "blkimg/qcow2.h"
#include "util/util.h"
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int qc_error(bi_error *err, int code, const char *fmt, ...)
{
    char buf[3000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return bi_error_setc(err, code, "%s", buf);
}

/* ------------------------------------------------------------ L2 entries */

void qc_get_l2(const qcow2_state *s, const void *table, uint64_t idx,
               uint64_t *entry, uint64_t *bitmap)
{
    const uint8_t *p = (const uint8_t *)table + idx * s->l2_entry_size;
    *entry = qc_get64(p);
    *bitmap = s->ext_l2 ? qc_get64(p + 8) : 0;
}

void qc_set_l2(const qcow2_state *s, void *table, uint64_t idx, uint64_t entry,
               uint64_t bitmap)
{
    uint8_t *p = (uint8_t *)table + idx * s->l2_entry_size;
    uint64_t v = htobe64(entry);
    memcpy(p, &v, 8);
    if (s->ext_l2) {
        v = htobe64(bitmap);
        memcpy(p + 8, &v, 8);
    }
}

enum qcow2_sc_type qc_sc_type(const qcow2_state *s, uint64_t entry,
                              uint64_t bitmap, unsigned sc)
{
    if (entry & QCOW_OFLAG_COMPRESSED)
        return QC_COMPRESSED;
    uint64_t host = entry & L2E_OFFSET_MASK;
    bool has_host =
        host || (qc_has_data_file(s) && (entry & QCOW_OFLAG_COPIED));
    if (!s->ext_l2) {
        if (s->version >= 3 && (entry & QCOW_OFLAG_ZERO))
            return has_host ? QC_ZERO_ALLOC : QC_ZERO_PLAIN;
        return has_host ? QC_NORMAL : QC_UNALLOC_PLAIN;
    }
    uint32_t alloc = (uint32_t)bitmap, zero = (uint32_t)(bitmap >> 32);
    if (alloc & zero)
        return QC_INVALID;
    if (!has_host) {
        if (alloc)
            return QC_INVALID;
        return (zero >> sc) & 1 ? QC_ZERO_PLAIN : QC_UNALLOC_PLAIN;
    }
    if ((alloc >> sc) & 1)
        return QC_NORMAL;
    if ((zero >> sc) & 1)
        return QC_ZERO_ALLOC;
    return QC_UNALLOC_ALLOC;
}

/* --------------------------------------------------------------- header */

int qc_write_header_field(bi_node *n, uint64_t off, const void *be_bytes,
                          size_t len)
{
    int ret = bi_co_pwrite(n->file, off, be_bytes, len, 0);
    if (ret < 0)
        return ret;
    return bi_co_flush(n->file);
}

int qc_update_incompat(bi_node *n, uint64_t incompat)
{
    qcow2_state *s = n->opaque;
    if (s->version < 3)
        return 0;
    uint64_t v = htobe64(incompat);
    int ret = qc_write_header_field(n, QH_INCOMPAT, &v, 8);
    if (ret == 0)
        s->incompat = incompat;
    return ret;
}

int qc_signal_corruption(bi_node *n, const char *fmt, ...)
{
    qcow2_state *s = n->opaque;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (!s->read_only && !s->corrupt) {
        bi_message(BI_MESSAGE_WARNING,
                   "qcow2: Marking image as corrupt: %s; further corruption "
                   "events will be suppressed",
                   buf);
        s->corrupt = true;
        if (s->version >= 3)
            qc_update_incompat(n, s->incompat | QCOW2_INCOMPAT_CORRUPT);
    } else if (s->read_only && !s->corrupt && !s->signaled) {
        bi_message(BI_MESSAGE_WARNING,
                   "qcow2: Image is corrupt: %s; further corruption "
                   "events will be suppressed",
                   buf);
        s->corrupt = true;
    }
    return -EIO;
}

int qc_signal_corruption_nonfatal(bi_node *n, const char *fmt, ...)
{
    qcow2_state *s = n->opaque;
    char buf[512];
    va_list ap;
    if (s->corrupt || s->signaled)
        return -EIO;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    bi_message(BI_MESSAGE_WARNING,
               "qcow2: Image is corrupt: %s; further non-fatal corruption "
               "events will be suppressed",
               buf);
    s->signaled = true;
    return -EIO;
}

static int clear_autoclear(bi_node *n, uint64_t keep)
{
    qcow2_state *s = n->opaque;
    if (!s->autoclear_pending || keep == s->autoclear)
        return 0;
    uint64_t v = htobe64(keep);
    int ret = qc_write_header_field(n, QH_AUTOCLEAR, &v, 8);
    if (ret < 0)
        return ret;
    s->autoclear = keep;
    s->autoclear_pending =
        keep != (s->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW);
    return 0;
}

int qc_before_write(bi_node *n)
{
    qcow2_state *s = n->opaque;
    uint64_t keep = QCOW2_AUTOCLEAR_DATA_FILE_RAW;
    if (qc_bitmaps_kept(s))
        keep |= QCOW2_AUTOCLEAR_BITMAPS; /* qcow2_bitmap.c keeps them */
    return clear_autoclear(n, s->autoclear & keep);
}

int qc_before_meta_write(bi_node *n)
{
    qcow2_state *s = n->opaque;
    return clear_autoclear(n, s->autoclear & QCOW2_AUTOCLEAR_KNOWN);
}

static const char *feature_name(const qcow2_state *s, int type, int bit)
{
    for (int i = 0; i < s->n_features; i++)
        if (s->features[i].type == type && s->features[i].bit == bit)
            return s->features[i].name;
    return NULL;
}

static int report_unsupported(qcow2_state *s, uint64_t mask, bi_error *err)
{
    char buf[900] = "";
    size_t pos = 0;
    for (int bit = 0; bit < 64; bit++) {
        if (!(mask & (1ULL << bit)))
            continue;
        const char *name = feature_name(s, 0, bit);
        if (!name)
            continue;
        pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s%s",
                                pos ? ", " : "", name);
        if (pos >= sizeof(buf))
            pos = sizeof(buf) - 1;
        mask &= ~(1ULL << bit);
    }
    if (mask)
        snprintf(buf + pos, sizeof(buf) - pos,
                 "%sUnknown incompatible feature: %" PRIx64, pos ? ", " : "",
                 mask);
    return qc_error(err, -ENOTSUP, "Unsupported qcow2 feature(s): %s", buf);
}

/* A name stored in an image must be a plain local file name. */
static int check_plain_name(const char *what, const char *name, bi_error *err)
{
    static const char *const protos[] = {
        "json:",      "nbd:",    "nbd+",         "http:",  "https:",
        "ftp:",       "ftps:",   "ssh:",         "iscsi:", "rbd:",
        "gluster",    "nfs:",    "null-",        "vvfat:", "blkdebug:",
        "blkverify:", "quorum:", "host_device:", "fat:",
    };
    if (!name[0])
        return qc_error(err, -EINVAL, "%s name is empty", what);
    for (size_t i = 0; i < BI_ARRAY_SIZE(protos); i++)
        if (!strncmp(name, protos[i], strlen(protos[i])))
            return qc_error(err, -EINVAL,
                            "%s name '%s' is not a plain local file name", what,
                            name);
    return 0;
}

/* offset cluster aligned, offset + len representable and inside the file;
 * opened for check, a table past the end of the file is left for the
 * check to report (it reads as zeroes there), as QEMU does. */
static bool table_ok(const qcow2_state *s, uint64_t offset, uint64_t len)
{
    if (offset & (s->cluster_size - 1))
        return false;
    if (offset > INT64_MAX - len)
        return false;
    if (!s->check_mode &&
        offset + len > bi_align_up(s->file_size, s->cluster_size))
        return false;
    return true;
}

static char *dup_str(const uint8_t *p, size_t len)
{
    char *r = malloc(len + 1);
    if (!r)
        return NULL;
    memcpy(r, p, len);
    r[len] = 0;
    return r;
}

static int parse_extensions(qcow2_state *s, const uint8_t *hdr, uint64_t start,
                            uint64_t end, bi_error *err)
{
    uint64_t off = start;
    while (off < end) {
        if (end - off < 8)
            return qc_error(err, -EINVAL,
                            "qcow2_read_extension: ERROR: "
                            "pread fail from offset %" PRIu64,
                            off);
        uint32_t type = qc_get32(hdr + off);
        uint32_t len = qc_get32(hdr + off + 4);
        off += 8;
        if (len > end - off)
            return qc_error(err, -EINVAL, "Header extension too large");
        const uint8_t *d = hdr + off;
        switch (type) {
        case QCOW2_EXT_END:
            return 0;
        case QCOW2_EXT_BACKING_FORMAT:
            if (len >= 16)
                return qc_error(err, -EINVAL,
                                "ERROR: ext_backing_format: len=%u too large "
                                "(>=16)",
                                len);
            free(s->backing_format);
            s->backing_format = dup_str(d, len);
            if (!s->backing_format)
                return -ENOMEM;
            break;
        case QCOW2_EXT_FEATURE_TABLE: {
            uint32_t cnt = len / 48;
            free(s->features);
            s->features = calloc(cnt ? cnt : 1, sizeof(*s->features));
            if (!s->features)
                return -ENOMEM;
            s->n_features = (int)cnt;
            for (uint32_t i = 0; i < cnt; i++) {
                s->features[i].type = d[i * 48];
                s->features[i].bit = d[i * 48 + 1];
                memcpy(s->features[i].name, d + i * 48 + 2, 46);
                s->features[i].name[46] = 0;
            }
            break;
        }
        case QCOW2_EXT_BITMAPS:
            s->has_bitmaps = true;
            if (len < 24)
                return qc_error(err, -EINVAL,
                                "bitmaps_ext: Invalid extension length");
            s->nb_bitmaps = qc_get32(d);
            s->bitmap_dir_size = qc_get64(d + 8);
            s->bitmap_dir_offset = qc_get64(d + 16);
            break;
        case QCOW2_EXT_CRYPTO:
            if (len != 16)
                return qc_error(err, -EINVAL,
                                "CRYPTO header extension size %u, but "
                                "expected size 16",
                                len);
            s->has_crypto_hdr = true;
            s->crypto_hdr_offset = qc_get64(d);
            s->crypto_hdr_length = qc_get64(d + 8);
            break;
        case QCOW2_EXT_DATA_FILE:
            if (len > QCOW2_MAX_BACKING_NAME)
                return qc_error(err, -EINVAL, "Data file name too long");
            free(s->data_file_name);
            s->data_file_name = dup_str(d, len);
            if (!s->data_file_name)
                return -ENOMEM;
            break;
        default:
            break; /* unknown: preserved (we never rewrite the area) */
        }
        off += bi_align_up(len, 8);
    }
    return 0;
}

static char *dirname_join(const char *base_file, const char *name)
{
    if (name[0] == '/')
        return bi_xstrdup(name);
    const char *slash = strrchr(base_file, '/');
    if (!slash)
        return bi_xstrdup(name);
    return bi_xasprintf("%.*s/%s", (int)(slash - base_file), base_file, name);
}

static bool has_opt(const struct bi_open_opts *o, const char *kv)
{
    if (!o || !o->driver_opts)
        return false;
    for (const char *const *p = o->driver_opts; *p; p++)
        if (!strcmp(*p, kv))
            return true;
    return false;
}

static uint64_t parse_cache_opt(const struct bi_open_opts *o, const char *key,
                                uint64_t def)
{
    if (!o || !o->driver_opts)
        return def;
    size_t kl = strlen(key);
    for (const char *const *p = o->driver_opts; *p; p++) {
        if (!strncmp(*p, key, kl) && (*p)[kl] == '=') {
            uint64_t v;
            if (bi_parse_size(*p + kl + 1, &v) == 0)
                return v;
        }
    }
    return def;
}

/* Open, phase 1: the fixed part of the header (into fixed, QH_V3_LENGTH
 * bytes): magic, version, cluster size, the v3 fields. */
static int open_fixed_header(bi_node *n, qcow2_state *s, uint8_t *fixed,
                             bi_error *err)
{
    int ret;
    int64_t fsz = bi_getlength(n->file);
    if (fsz < 0)
        return qc_error(err, (int)fsz, "Could not read qcow2 header: %s",
                        strerror((int)-fsz));
    s->file_size = (uint64_t)fsz;
    if (s->file_size < QH_V2_LENGTH)
        return qc_error(err, -EINVAL, "Image is not in qcow2 format");

    memset(fixed, 0, QH_V3_LENGTH);
    ret = bi_co_pread(n->file, 0, fixed, BI_MIN(QH_V3_LENGTH, s->file_size));
    if (ret < 0)
        return qc_error(err, ret, "Could not read qcow2 header: %s",
                        strerror(-ret));
    if (qc_get32(fixed + QH_MAGIC) != QCOW2_MAGIC)
        return qc_error(err, -EINVAL, "Image is not in qcow2 format");
    s->version = qc_get32(fixed + QH_VERSION);
    if (s->version < 2 || s->version > 3)
        return qc_error(err, -ENOTSUP, "Unsupported qcow2 version %u",
                        s->version);
    s->cluster_bits = qc_get32(fixed + QH_CLUSTER_BITS);
    if (s->cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
        s->cluster_bits > QCOW2_MAX_CLUSTER_BITS)
        return qc_error(err, -EINVAL, "Unsupported cluster size: 2^%u",
                        s->cluster_bits);
    s->cluster_size = 1ULL << s->cluster_bits;

    if (s->version == 2) {
        s->header_length = QH_V2_LENGTH;
        s->refcount_order = 4;
    } else {
        s->header_length = qc_get32(fixed + QH_HEADER_LENGTH);
        if (s->header_length < QH_V3_MIN_LENGTH)
            return qc_error(err, -EINVAL, "qcow2 header too short");
        if (s->header_length > s->cluster_size)
            return qc_error(err, -EINVAL, "qcow2 header exceeds cluster size");
        s->incompat = qc_get64(fixed + QH_INCOMPAT);
        s->compat = qc_get64(fixed + QH_COMPAT);
        s->autoclear = qc_get64(fixed + QH_AUTOCLEAR);
        s->refcount_order = qc_get32(fixed + QH_REFCOUNT_ORDER);
        if (s->header_length > QH_COMPRESSION_TYPE)
            s->compression_type = fixed[QH_COMPRESSION_TYPE];
    }
    if (s->file_size < s->header_length)
        return qc_error(err, -EINVAL, "qcow2 header exceeds the file size");

    return 0;
}

/* Open, phase 3: the features the header asks for (incompatible bits,
 * corrupt bit, refcount width, encryption, compression, extended L2) and
 * the geometry that follows from them. */
static int open_features(bi_node *n, qcow2_state *s,
                         const struct bi_open_opts *o, const uint8_t *hdr,
                         bi_error *err)
{
    int ret;
    if (s->incompat & ~QCOW2_INCOMPAT_KNOWN) {
        return report_unsupported(s, s->incompat & ~QCOW2_INCOMPAT_KNOWN, err);
    }
    if ((s->incompat & QCOW2_INCOMPAT_CORRUPT) && !n->read_only &&
        !s->check_mode) {
        return qc_error(err, -EACCES,
                        "qcow2: Image is corrupt; cannot be opened read/write");
    }
    s->corrupt = (s->incompat & QCOW2_INCOMPAT_CORRUPT) != 0;
    if (s->refcount_order > 6) {
        return qc_error(err, -EINVAL,
                        "Reference count entry width too large; "
                        "may not exceed 64 bits");
    }
    s->refcount_bits = 1u << s->refcount_order;
    s->refcount_max =
        s->refcount_bits == 64 ? UINT64_MAX : (1ULL << s->refcount_bits) - 1;
    s->rb_bits = s->cluster_bits + 3 - s->refcount_order;

    s->crypt_method = qc_get32(hdr + QH_CRYPT);
    if (s->crypt_method > 2) {
        return qc_error(err, -EINVAL, "Unsupported encryption method: %u",
                        s->crypt_method);
    }
    ret = qc_crypto_open(n, s, o, err);
    if (ret < 0)
        return ret;

    if (s->incompat & QCOW2_INCOMPAT_COMPRESSION) {
        if (s->header_length <= QH_COMPRESSION_TYPE ||
            s->compression_type == 0) {
            return qc_error(err, -EINVAL,
                            "qcow2: Compression type incompatible feature bit "
                            "must not be set with zlib compression type");
        }
    } else if (s->compression_type != 0) {
        return qc_error(err, -EINVAL,
                        "qcow2: Invalid compression type: incompatible feature "
                        "bit is not set");
    }
    if (s->compression_type > 1) {
        return qc_error(err, -ENOTSUP, "qcow2: unknown compression type: %u",
                        s->compression_type);
    }

    s->ext_l2 = (s->incompat & QCOW2_INCOMPAT_EXTL2) != 0;
    if (s->ext_l2 && s->cluster_bits < 14) {
        return qc_error(err, -EINVAL,
                        "Extended L2 entries are only supported with cluster "
                        "sizes of at least 16384 bytes");
    }
    s->l2_entry_size = s->ext_l2 ? 16 : 8;
    s->l2_bits = s->cluster_bits - (s->ext_l2 ? 4 : 3);
    s->l2_entries = 1ULL << s->l2_bits;
    s->sc_per_cluster = s->ext_l2 ? 32 : 1;
    s->subcluster_bits = s->cluster_bits - (s->ext_l2 ? 5 : 0);
    s->subcluster_size = 1ULL << s->subcluster_bits;
    s->csize_shift = 62 - (s->cluster_bits - 8);
    s->csize_mask = (1ULL << (s->cluster_bits - 8)) - 1;
    s->cluster_offset_mask = (1ULL << s->csize_shift) - 1;

    return 0;
}

/* Open, phase 4: an external raw data file's bit and the backing file
 * name stored at backing_off in the first cluster hdr. */
static int open_backing_name(qcow2_state *s, const uint8_t *hdr,
                             uint64_t backing_off, uint32_t backing_len,
                             bi_error *err)
{
    int ret;
    /* data file */
    if (s->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW) {
        if (!qc_has_data_file(s)) {
            return qc_error(err, -EINVAL, "data-file-raw requires a data file");
        }
        s->data_file_raw = true;
    }

    /* backing file (an empty name is none, as in QEMU) */
    if (backing_off && backing_len) {
        if (backing_len > QCOW2_MAX_BACKING_NAME) {
            return qc_error(err, -EINVAL, "Backing file name too long");
        }
        if (backing_len > s->cluster_size - backing_off) {
            return qc_error(err, -EINVAL, "Invalid backing file offset");
        }
        if (memchr(hdr + backing_off, 0, backing_len)) {
            return qc_error(err, -EINVAL,
                            "Backing file name contains a NUL byte");
        }
        if (s->data_file_raw) {
            return qc_error(err, -EINVAL,
                            "data-file-raw cannot be used with a "
                            "backing file");
        }
        s->backing_file = dup_str(hdr + backing_off, backing_len);
        if (!s->backing_file) {
            return -ENOMEM;
        }
        ret = check_plain_name("Backing file", s->backing_file, err);
        if (ret < 0)
            return ret;
    }

    return 0;
}

/* Open, phase 5: the size and the tables' places and sizes, each checked
 * before anything is read from them. */
static int open_table_geometry(bi_node *n, qcow2_state *s, const uint8_t *hdr,
                               bi_error *err)
{
    uint64_t size = qc_get64(hdr + QH_SIZE);
    s->l1_size = qc_get32(hdr + QH_L1_SIZE);
    s->l1_table_offset = qc_get64(hdr + QH_L1_OFFSET);
    s->refcount_table_offset = qc_get64(hdr + QH_RT_OFFSET);
    s->refcount_table_clusters = qc_get32(hdr + QH_RT_CLUSTERS);
    s->nb_snapshots = qc_get32(hdr + QH_NB_SNAPSHOTS);
    s->snapshots_offset = qc_get64(hdr + QH_SNAPSHOTS_OFFSET);

    if (size > INT64_MAX) {
        return qc_error(err, -EFBIG, "Image size too large");
    }
    if ((uint64_t)s->refcount_table_clusters >
        QCOW2_MAX_REFTABLE_BYTES / s->cluster_size) {
        return qc_error(err, -EINVAL, "Reference count table too large");
    }
    /* opened for checking, an image without one is the check's finding
     * (every cluster's refcount is 0; -r all rebuilds), as in QEMU */
    if (s->refcount_table_clusters == 0 && !s->check_mode) {
        return qc_error(err, -EINVAL,
                        "Image does not contain a reference count "
                        "table");
    }
    s->refcount_table_size =
        ((uint64_t)s->refcount_table_clusters << s->cluster_bits) / 8;
    if (!table_ok(s, s->refcount_table_offset,
                  (uint64_t)s->refcount_table_clusters << s->cluster_bits)) {
        return qc_error(err, -EINVAL, "Invalid reference count table offset");
    }
    /* opened for checking, the snapshot table is the check's to read
     * and judge (QEMU's qcow2_check_read_snapshot_table) */
    if (s->check_mode) {
        s->nb_snapshots = 0;
        s->snapshots_offset = 0;
    }
    if (s->nb_snapshots > QCOW2_MAX_SNAPSHOTS) {
        return qc_error(err, -EINVAL, "Too many snapshots");
    }
    if (s->nb_snapshots && !table_ok(s, s->snapshots_offset, 40)) {
        return qc_error(err, -EINVAL, "Invalid snapshot table offset");
    }
    if ((uint64_t)s->l1_size > QCOW2_MAX_L1_BYTES / 8) {
        return qc_error(err, -EFBIG, "Active L1 table too large");
    }
    {
        /* guest clusters covered by one L1 entry = l2_entries */
        uint64_t l1_bits = s->l2_bits + s->cluster_bits;
        uint64_t need =
            l1_bits >= 64 ? 1 : (size + (1ULL << l1_bits) - 1) >> l1_bits;
        if (need > s->l1_size) {
            return qc_error(err, -EINVAL, "L1 table is too small");
        }
    }
    if (s->l1_size &&
        !table_ok(s, s->l1_table_offset, (uint64_t)s->l1_size * 8)) {
        return qc_error(err, -EINVAL, "Invalid L1 table offset");
    }
    n->size = size;

    return 0;
}

/* Open, phase 6: the L1 and refcount tables, snapshots and bitmaps read. */
static int open_load_tables(bi_node *n, qcow2_state *s, bi_error *err)
{
    int ret;
    /* L1 table */
    s->l1_alloc = s->l1_size ? s->l1_size : 1;
    s->l1_table = calloc(s->l1_alloc, 8);
    if (!s->l1_table) {
        return -ENOMEM;
    }
    if (s->l1_size) {
        ret = bi_co_pread(n->file, s->l1_table_offset, s->l1_table,
                          (uint64_t)s->l1_size * 8);
        if (ret < 0) {
            return qc_error(err, ret, "Could not read L1 table: %s",
                            strerror(-ret));
        }
        for (uint32_t i = 0; i < s->l1_size; i++)
            s->l1_table[i] = be64toh(s->l1_table[i]);
    }

    /* refcount table */
    s->refcount_table = calloc(BI_MAX(s->refcount_table_size, 1), 8);
    if (!s->refcount_table) {
        return -ENOMEM;
    }
    bi_debug_event(n->file, BI_DBG_REFTABLE_LOAD);
    ret = bi_co_pread(n->file, s->refcount_table_offset, s->refcount_table,
                      s->refcount_table_size * 8);
    if (ret < 0) {
        /* QEMU's words: qcow2_refcount_init's failure */
        return qc_error(err, ret, "Could not initialize refcount handling: %s",
                        strerror(-ret));
    }
    for (uint64_t i = 0; i < s->refcount_table_size; i++)
        s->refcount_table[i] = be64toh(s->refcount_table[i]);

    /* snapshots */
    ret = qc_read_snapshots(n, err);
    if (ret < 0)
        return ret;
    /* persistent bitmaps: only a consistent extension counts */
    if (s->has_bitmaps && (s->autoclear & QCOW2_AUTOCLEAR_BITMAPS)) {
        ret = qc_bitmaps_open(n, !n->read_only && !s->check_mode, err);
        if (ret < 0)
            return ret;
        ret = qc_read_bitmaps(n, err);
        if (ret < 0)
            return ret;
    }

    return 0;
}

/* Open, phase 7: the metadata caches, sized from the runtime options. */
static int open_caches(qcow2_state *s, const struct bi_open_opts *o)
{
    /* caches: 8 MiB of L2 by default (64 GiB of guest at 64 KiB) */
    {
        uint64_t l2_bytes = parse_cache_opt(o, "l2-cache-size", 8ULL << 20);
        uint64_t rb_bytes =
            parse_cache_opt(o, "refcount-cache-size", 1ULL << 20);
        uint64_t l2n = l2_bytes >> s->cluster_bits;
        uint64_t rbn = rb_bytes >> s->cluster_bits;
        if (l2n < 16)
            l2n = 16;
        if (rbn < 16)
            rbn = 16;
        if (l2n > 65536)
            l2n = 65536;
        if (rbn > 65536)
            rbn = 65536;
        if (qc_cache_init(&s->l2_cache, "L2", (int)l2n) < 0 ||
            qc_cache_init(&s->rb_cache, "refcount", (int)rbn) < 0) {
            return -ENOMEM;
        }
    }

    return 0;
}

/* Open, phase 8: the external data file, if the image has one. */
static int open_data_file(bi_node *n, qcow2_state *s,
                          const struct bi_open_opts *o, bi_error *err)
{
    int ret;
    /* external data file */
    if (qc_has_data_file(s)) {
        const char *dname = s->data_file_name;
        if (o && o->driver_opts) {
            for (const char *const *p = o->driver_opts; *p; p++)
                if (!strncmp(*p, "data-file=", 10))
                    dname = *p + 10;
        }
        if (!dname) {
            return qc_error(err, -EINVAL, "Missing data_file option");
        }
        ret = check_plain_name("Data file", dname, err);
        if (ret < 0)
            return ret;
        /* relative to the image's directory; QEMU takes it relative to
         * the working directory: that is tried second */
        char *path = dirname_join(n->filename, dname);
        if (access(path, F_OK) != 0 && access(dname, F_OK) == 0) {
            free(path);
            path = bi_xstrdup(dname);
        }
        struct bi_open_opts dopts;
        bi_open_opts_init(&dopts);
        if (o)
            dopts = *o;
        dopts.format = NULL;
        dopts.protocol_opts = NULL; /* the data file is local */
        dopts.read_write = !n->read_only;
        s->data_file = bi_open_protocol(path, &dopts, err);
        free(path);
        if (!s->data_file) {
            return err && err->code ? err->code : -EIO;
        }
        s->data_file->parent = n;
    } else if (s->data_file_name) {
        return qc_error(err, -EINVAL,
                        "'data-file' can only be set for images "
                        "with an external data file");
    }

    return 0;
}

/* Open, phase 9: the node learns its backing file; refcounts set up; a
 * writable image is repaired if left dirty and readied for writes. */
static int open_finish(bi_node *n, qcow2_state *s, bi_error *err)
{
    int ret;
    if (s->backing_file) {
        free(n->backing_filename);
        n->backing_filename = bi_xstrdup(s->backing_file);
        free(n->backing_format);
        n->backing_format =
            s->backing_format ? bi_xstrdup(s->backing_format) : NULL;
    }

    ret = qc_refcount_init(n);
    if (ret < 0)
        return ret;

    if (!n->read_only) {
        if ((s->incompat & QCOW2_INCOMPAT_DIRTY) && !s->check_mode) {
            struct bi_check_result *res = NULL;
            ret = qcow2_check_image(n, res, BI_CHECK_FIX_ALL, err);
            if (ret < 0) {
                if (!err || !err->msg[0])
                    return qc_error(err, ret,
                                    "Could not repair dirty image: %s",
                                    strerror(-ret));
            }
            ret = qc_update_incompat(n, s->incompat & ~QCOW2_INCOMPAT_DIRTY);
            if (ret < 0)
                return ret;
        }
        /* Unknown autoclear bits are cleared before the first write, the
         * bitmaps bit too unless qcow2_bitmap.c keeps the bitmaps. */
        uint64_t keep = s->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW;
        if (qc_bitmaps_kept(s))
            keep |= s->autoclear & QCOW2_AUTOCLEAR_BITMAPS;
        s->autoclear_pending = s->version >= 3 && keep != s->autoclear;
        /* O_DIRECT writes into new clusters: the file grows ahead */
        s->ahead_on = !s->check_mode && !qc_has_data_file(s) &&
                      bi_cache_is_direct(n->file->cache);
        s->ahead_open_len = s->ahead_end = s->file_size;
    }
    return 0;
}

/* Opens the image in phases, each checking what it reads before use. */
static int qcow2_do_open(bi_node *n, const struct bi_open_opts *o,
                         bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint8_t *hdr = NULL;
    int ret;
    uint8_t fixed[QH_V3_LENGTH];

    s->node = n;
    s->read_only = n->read_only;
    s->check_mode = has_opt(o, "x-check=on");
    bi_co_mutex_init(&s->lock);
    bi_co_queue_init(&s->comp_wait);
    ret = open_fixed_header(n, s, fixed, err);
    if (ret < 0)
        return ret;

    /* phase 2: the whole first cluster: header, extensions, backing name */
    uint64_t hlen = BI_MIN(s->cluster_size, s->file_size);
    hdr = bi_blockalign(n->file, s->cluster_size);
    if (!hdr)
        return -ENOMEM;
    memset(hdr, 0, s->cluster_size);
    ret = bi_co_pread(n->file, 0, hdr, hlen);
    if (ret < 0) {
        qc_error(err, ret, "Could not read qcow2 header: %s", strerror(-ret));
        goto out;
    }

    uint64_t backing_off = qc_get64(hdr + QH_BACKING_OFFSET);
    uint32_t backing_len = qc_get32(hdr + QH_BACKING_SIZE);
    if (backing_off > s->cluster_size) {
        ret = qc_error(err, -EINVAL, "Invalid backing file offset");
        goto out;
    }
    uint64_t ext_end = backing_off ? backing_off : s->cluster_size;
    if (s->header_length < ext_end) {
        ret = parse_extensions(s, hdr, s->header_length, ext_end, err);
        if (ret < 0)
            goto out;
    }

    ret = open_features(n, s, o, hdr, err);
    if (ret == 0)
        ret = open_backing_name(s, hdr, backing_off, backing_len, err);
    if (ret == 0)
        ret = open_table_geometry(n, s, hdr, err);
    if (ret == 0)
        ret = open_load_tables(n, s, err);
    if (ret == 0)
        ret = open_caches(s, o);
    if (ret == 0)
        ret = open_data_file(n, s, o, err);
    if (ret == 0)
        ret = open_finish(n, s, err);
out:
    bi_free_aligned(hdr);
    if (ret < 0 && err && !err->msg[0])
        qc_error(err, ret, "Could not open qcow2 image: %s", strerror(-ret));
    return ret;
}

static void qcow2_free_state(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (!s)
        return;
    qc_cache_destroy(&s->l2_cache);
    qc_cache_destroy(&s->rb_cache);
    qc_comp_bufs_free(s);
    free(s->l1_table);
    s->l1_table = NULL;
    free(s->refcount_table);
    s->refcount_table = NULL;
    qc_free_snapshots(s);
    qc_free_bitmaps(s);
    qc_bitmaps_free(s);
    free(s->backing_file);
    free(s->backing_format);
    free(s->data_file_name);
    bi_value_free(s->luks_info);
    s->luks_info = NULL;
    qc_crypto_close(s);
    free(s->features);
    free(s->pending_free);
    s->backing_file = s->backing_format = s->data_file_name = NULL;
    s->features = NULL;
    s->pending_free = NULL;
    if (s->data_file) {
        bi_node_free(s->data_file);
        s->data_file = NULL;
    }
}

static int qcow2_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    return bi_run_co_open(qcow2_do_open, qcow2_free_state, n, o, err);
}

static int close_co(void *arg)
{
    bi_node *n = arg;
    qcow2_state *s = n->opaque;
    if (s->read_only || !s->l1_table || s->close_prepared)
        return 0;
    s->close_prepared = true;
    bi_co_mutex_lock(&s->lock);
    int ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0)
        ret = qc_bitmaps_store(n);
    if (ret == 0)
        qc_file_ahead_trim(n);
    /* everything is on disk: a lazy-refcounts image is clean again */
    if (ret == 0 && (s->incompat & QCOW2_INCOMPAT_DIRTY) && s->marked_dirty &&
        !s->corrupt)
        ret = qc_update_incompat(n, s->incompat & ~QCOW2_INCOMPAT_DIRTY);
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

static int qcow2_co_close_prepare(bi_node *n)
{
    return n->opaque ? close_co(n) : 0;
}

static void qcow2_close(bi_node *n)
{
    if (!n->opaque)
        return;
    bi_run_co(close_co, n);
    qcow2_free_state(n);
}

static int qcow2_probe(const uint8_t *buf, size_t len, const char *filename)
{
    if (len >= 8 && qc_get32(buf) == QCOW2_MAGIC && qc_get32(buf + 4) >= 2)
        return 100;
    return 0;
}

static void qcow2_refresh_limits(bi_node *n)
{
    qcow2_state *s = n->opaque;
    n->limits = n->file->limits;
    if (s && s->data_file) {
        const struct bi_limits *d = &s->data_file->limits;
        n->limits.min_mem_alignment =
            BI_MAX(n->limits.min_mem_alignment, d->min_mem_alignment);
        n->limits.opt_mem_alignment =
            BI_MAX(n->limits.opt_mem_alignment, d->opt_mem_alignment);
    }
    /* The driver maps any byte range; the host nodes align their own I/O.
     * Encrypted images: whole encryption sectors, as QEMU asks. */
    bi_limits_any_range(&n->limits, 0);
    if (s && s->crypt_method)
        n->limits.request_alignment = 512;
}

/* Clusters; one L2 table's guest range bounds a block status answer (as
 * in QEMU) and the VM state starts at the first such range past the end of
 * the guest data. */
static void qcow2_get_geometry(bi_node *n, struct bi_geometry *g)
{
    qcow2_state *s = n->opaque;
    uint64_t span = s->cluster_size << s->l2_bits;
    g->cluster_size = s->cluster_size;
    g->status_span = span;
    g->vm_state_offset = bi_align_up(n->size, span);
}

static int qcow2_co_flush(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if (s->read_only)
        return 0;
    bi_co_mutex_lock(&s->lock);
    int ret = qc_flush_metadata(n);
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* QEMU 7.2 counts the qcow2 file only, not an external data file. */
static int64_t qcow2_get_allocated_file_size(bi_node *n)
{
    return bi_allocated_file_size(n->file);
}

/* "bitmaps": {flags, name, granularity} for each bitmap, in directory
 * order. */
static bi_value *bitmaps_value(const qcow2_state *s)
{
    bi_value *list = bi_value_array();
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        const struct qcow2_bitmap *bm = &s->bitmaps[i];
        bi_value *b = bi_value_object(), *flags = bi_value_array();
        if (bm->flags & 1)
            bi_value_append(flags, bi_value_string("in-use"));
        if (bm->flags & 2)
            bi_value_append(flags, bi_value_string("auto"));
        bi_value_set(b, "flags", flags);
        bi_value_set_string(b, "name", bm->name);
        bi_value_set_uint(b, "granularity", 1ULL << bm->granularity_bits);
        bi_value_append(list, b);
    }
    return list;
}

/* The "encrypt" object: the LUKS header's description, or the format. */
static bi_value *encrypt_value(const qcow2_state *s)
{
    if (s->luks_info)
        return bi_value_copy(s->luks_info);
    bi_value *e = bi_value_object();
    bi_value_set_string(e, "format", s->crypt_method == 1 ? "aes" : "luks");
    return e;
}

/* qemu's ImageInfoSpecificQCow2. */
static bi_value *specific_value(const qcow2_state *s)
{
    bi_value *d = bi_value_object();
    bi_value_set_string(d, "compat", s->version == 2 ? "0.10" : "1.1");
    bi_value_set_string(d, "compression-type",
                        s->compression_type == QCOW2_COMPRESSION_ZSTD ? "zstd"
                                                                      : "zlib");
    if (s->version >= 3)
        bi_value_set_bool(d, "lazy-refcounts",
                          (s->compat & QCOW2_COMPAT_LAZY_REFCOUNTS) != 0);
    if (s->nb_bitmaps && s->bitmaps)
        bi_value_set(d, "bitmaps", bitmaps_value(s));
    bi_value_set_int(d, "refcount-bits", s->refcount_bits);
    if (s->crypt_method)
        bi_value_set(d, "encrypt", encrypt_value(s));
    if (s->version >= 3) {
        if (s->data_file_name || qc_has_data_file(s)) {
            if (s->data_file_name)
                bi_value_set_string(d, "data-file", s->data_file_name);
            bi_value_set_bool(d, "data-file-raw", s->data_file_raw);
        }
        bi_value_set_bool(d, "corrupt",
                          (s->incompat & QCOW2_INCOMPAT_CORRUPT) != 0);
        bi_value_set_bool(d, "extended-l2", s->ext_l2);
    }
    return d;
}

static int qcow2_get_info(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    qcow2_state *s = n->opaque;
    info->encrypted = s->crypt_method != 0;
    info->has_dirty_flag = true;
    info->dirty_flag = (s->incompat & QCOW2_INCOMPAT_DIRTY) != 0;
    if (s->backing_file)
        bi_info_set(&info->backing_filename, s->backing_file);
    if (s->backing_format)
        bi_info_set(&info->backing_format, s->backing_format);
    info->specific = specific_value(s);
    return 0;
}

/* qemu 7.2's qcow2 runtime options. The cache sizes and data-file are
 * read at open; the rest tune behaviour blkimg does not have (lazy
 * refcount updates at run time, discard passing, overlap check selection,
 * cache cleaning) and are accepted without effect. */
static const struct bi_opt_desc qcow2_runtime_opts[] = {
    {"lazy-refcounts", BI_OPT_BOOL, "Postpone refcount updates", NULL, 0},
    {"pass-discard-request", BI_OPT_BOOL,
     "Pass guest discard requests to the layer below", NULL, 0},
    {"pass-discard-snapshot", BI_OPT_BOOL,
     "Discard freed clusters of deleted snapshots in the layer below", NULL, 0},
    {"pass-discard-other", BI_OPT_BOOL,
     "Discard other freed clusters in the layer below", NULL, 0},
    {"overlap-check", BI_OPT_STRING,
     "Metadata overlap checks: none, constant, cached or all", NULL, 0},
    {"overlap-check.template", BI_OPT_STRING,
     "Overlap check template: none, constant, cached or all", NULL, 0},
    {"overlap-check.main-header", BI_OPT_BOOL, "Check the main header", NULL,
     0},
    {"overlap-check.active-l1", BI_OPT_BOOL, "Check the active L1 table", NULL,
     0},
    {"overlap-check.active-l2", BI_OPT_BOOL, "Check the active L2 tables", NULL,
     0},
    {"overlap-check.refcount-table", BI_OPT_BOOL, "Check the refcount table",
     NULL, 0},
    {"overlap-check.refcount-block", BI_OPT_BOOL, "Check the refcount blocks",
     NULL, 0},
    {"overlap-check.snapshot-table", BI_OPT_BOOL, "Check the snapshot table",
     NULL, 0},
    {"overlap-check.inactive-l1", BI_OPT_BOOL, "Check the inactive L1 tables",
     NULL, 0},
    {"overlap-check.inactive-l2", BI_OPT_BOOL, "Check the inactive L2 tables",
     NULL, 0},
    {"overlap-check.bitmap-directory", BI_OPT_BOOL,
     "Check the bitmap directory", NULL, 0},
    {"cache-size", BI_OPT_SIZE, "Maximum metadata cache size", NULL, 0},
    {"l2-cache-size", BI_OPT_SIZE, "Maximum L2 table cache size", NULL, 0},
    {"l2-cache-entry-size", BI_OPT_SIZE, "Size of an L2 cache entry", NULL, 0},
    {"refcount-cache-size", BI_OPT_SIZE, "Maximum refcount block cache size",
     NULL, 0},
    {"cache-clean-interval", BI_OPT_NUMBER,
     "Seconds between unused cache entry removals", NULL, 0},
    {"data-file", BI_OPT_STRING, "The external data file", NULL, 0},
    {"encrypt.format", BI_OPT_STRING, "Encryption data format", NULL, 0},
    {"encrypt.key-secret", BI_OPT_STRING,
     "ID of secret providing qcow AES key or LUKS passphrase", NULL,
     BI_OPT_STRONG},
    {"backing.encrypt.key-secret", BI_OPT_STRING,
     "The backing file's encrypt.key-secret", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

const struct bi_driver bi_drv_qcow2 = {
    .name = "qcow2",
    .is_protocol = false,
    .state_size = sizeof(qcow2_state),
    .probe = qcow2_probe,
    .open = qcow2_open,
    .close = qcow2_close,
    .co_close_prepare = qcow2_co_close_prepare,
    .create = qcow2_create,
    .create_opts = qc_create_opts,
    .measure = qcow2_measure,
    .refresh_limits = qcow2_refresh_limits,
    .co_map = qcow2_co_map,
    .co_write_done = qcow2_co_write_done,
    .co_read_compressed = qcow2_co_read_compressed,
    .co_pwrite_compressed = qcow2_co_pwrite_compressed,
    .get_geometry = qcow2_get_geometry,
    .co_pwrite_zeroes = qcow2_co_pwrite_zeroes,
    .co_pdiscard = qcow2_co_pdiscard,
    .co_flush = qcow2_co_flush,
    .co_truncate = qcow2_co_truncate,
    .co_block_status = qcow2_co_block_status,
    .get_allocated_file_size = qcow2_get_allocated_file_size,
    .get_info = qcow2_get_info,
    .check = qcow2_check_image,
    .change_backing_file = qcow2_change_backing_file,
    .co_make_empty = qcow2_co_make_empty,
    .amend = qcow2_amend,
    .amend_opts = qc_amend_opts,
    .runtime_opts = qcow2_runtime_opts,
    .snapshot = &qc_snapshot_ops,
    .bitmap = &qc_bitmap_ops,
};
