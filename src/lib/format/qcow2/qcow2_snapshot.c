/* SPDX-License-Identifier: MIT */
/* qcow2 internal snapshots: reading the snapshot table (bounds-checked). */
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
#include <time.h>

#define QCOW2_MAX_SNAPSHOTS_SIZE (1024ULL * QCOW2_MAX_SNAPSHOTS)

void qc_free_snapshots(qcow2_state *s)
{
    if (!s->snapshots)
        return;
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        free(s->snapshots[i].id_str);
        free(s->snapshots[i].name);
        free(s->snapshots[i].unknown_extra);
    }
    free(s->snapshots);
    s->snapshots = NULL;
}

/* QEMU's BDRV_MAX_LENGTH: no request may reach past it. */
#define SNAP_MAX_LENGTH (INT64_MAX & ~((1LL << 30) - 1))
#define SNAP_KNOWN_EXTRA 24 /* vm_state_size_large, disk_size, icount */

/* Sets err to msg (printf-style) with code as its errno; returns code. */
static int snap_err(bi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int snap_err(bi_error *err, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return bi_error_setc(err, code, "%s", msg);
}

/* Reads len bytes of the snapshot table at off into buf, as QEMU reads
 * it: a request reaching past QEMU's largest length fails with EIO, bytes
 * past the end of the file (file_len) read as zeroes; how->strict (a
 * plain open) refuses them instead. 0 or -errno (err set). */
static int snap_pread(bi_node *n, const struct qc_snap_read *how,
                      uint64_t file_len, uint64_t off, void *buf, uint64_t len,
                      bi_error *err)
{
    if (off > (uint64_t)SNAP_MAX_LENGTH - len)
        return snap_err(err, -EIO, "Failed to read snapshot table: %s",
                        strerror(EIO));
    if (len == 0)
        return 0;
    if (how->strict && (off > file_len || file_len - off < len))
        return snap_err(err, -EINVAL, "Snapshot table exceeds the file");
    uint64_t have = off >= file_len ? 0 : BI_MIN(len, file_len - off);
    memset((uint8_t *)buf + have, 0, len - have);
    int ret = have ? bi_co_pread(n->file, off, buf, have) : 0;
    if (ret < 0)
        return snap_err(err, ret, "Failed to read snapshot table: %s",
                        strerror(-ret));
    return 0;
}

/* The fixed 40-byte part of entry i at *off (8-aligned by the caller);
 * *off moves past it. Returns the id and name lengths in *id_len and
 * *name_len. 0 or -errno. */
static int snap_read_head(bi_node *n, const struct qc_snap_read *how,
                          uint64_t file_len, uint64_t *off,
                          struct qcow2_snapshot *sn, uint16_t *id_len,
                          uint16_t *name_len, bi_error *err)
{
    uint8_t h[40];
    int ret = snap_pread(n, how, file_len, *off, h, sizeof(h), err);
    if (ret < 0)
        return ret;
    *off += sizeof(h);
    sn->l1_table_offset = qc_get64(h);
    sn->l1_size = qc_get32(h + 8);
    *id_len = qc_get16(h + 12);
    *name_len = qc_get16(h + 14);
    sn->date_sec = qc_get32(h + 16);
    sn->date_nsec = qc_get32(h + 20);
    sn->vm_clock_nsec = qc_get64(h + 24);
    sn->vm_state_size = qc_get32(h + 32);
    sn->extra_data_size = qc_get32(h + 36);
    return 0;
}

/* The extra data of entry i at *off: the fields blkimg knows, then the
 * rest kept as it is. Too much extra data fails the read, or with
 * how->repair is cut to QEMU's maximum (counted in how->extra_dropped).
 * *off moves past all of it. 0 or -errno. */
static int snap_read_extra(bi_node *n, struct qc_snap_read *how,
                           uint64_t file_len, uint64_t *off, uint32_t i,
                           struct qcow2_snapshot *sn, bi_error *err)
{
    bool cut = false;
    if (sn->extra_data_size > QCOW2_MAX_SNAPSHOT_EXTRA) {
        if (!how->repair)
            return snap_err(err, -EFBIG,
                            "Too much extra metadata in snapshot table "
                            "entry %" PRIu32 "%s",
                            i,
                            how->strict ? ""
                                        : "\nYou can force-remove this "
                                          "extra metadata with qemu-img "
                                          "check -r all");
        bi_message(BI_MESSAGE_CHECK,
                   "Discarding too much extra metadata in snapshot table "
                   "entry %" PRIu32 " (%" PRIu32 " > %u)",
                   i, sn->extra_data_size, QCOW2_MAX_SNAPSHOT_EXTRA);
        how->extra_dropped++;
        cut = true;
    }
    uint8_t known[SNAP_KNOWN_EXTRA];
    uint32_t nk = BI_MIN(sn->extra_data_size, (uint32_t)sizeof(known));
    int ret = snap_pread(n, how, file_len, *off, known, nk, err);
    if (ret < 0)
        return ret;
    *off += nk;
    if (nk >= 8)
        sn->vm_state_size = qc_get64(known);
    sn->disk_size = nk >= 16 ? qc_get64(known + 8) : n->size;
    sn->has_icount = nk >= 24 && qc_get64(known + 16) != UINT64_MAX;
    sn->icount = sn->has_icount ? qc_get64(known + 16) : 0;
    if (sn->extra_data_size <= sizeof(known))
        return 0;
    uint64_t end = *off + sn->extra_data_size - sizeof(known);
    if (cut)
        sn->extra_data_size = QCOW2_MAX_SNAPSHOT_EXTRA;
    sn->unknown_extra_len = sn->extra_data_size - (uint32_t)sizeof(known);
    sn->unknown_extra = malloc(sn->unknown_extra_len);
    if (!sn->unknown_extra)
        return -ENOMEM;
    ret = snap_pread(n, how, file_len, *off, sn->unknown_extra,
                     sn->unknown_extra_len, err);
    *off = end;
    return ret;
}

/* Reads len bytes at *off as a string of its own (NUL added) into *out;
 * *off moves past them. 0 or -errno. */
static int snap_read_str(bi_node *n, const struct qc_snap_read *how,
                         uint64_t file_len, uint64_t *off, uint16_t len,
                         char **out, bi_error *err)
{
    *out = malloc((size_t)len + 1);
    if (!*out)
        return -ENOMEM;
    (*out)[len] = 0;
    int ret = snap_pread(n, how, file_len, *off, *out, len, err);
    *off += len;
    return ret;
}

/* Frees what entry sn holds and clears it. */
static void snap_free_one(struct qcow2_snapshot *sn)
{
    free(sn->id_str);
    free(sn->name);
    free(sn->unknown_extra);
    memset(sn, 0, sizeof(*sn));
}

/* Reads entry i at *off (QEMU's qcow2_do_read_snapshots, one turn of its
 * loop). *tlen is the table's length as the entries declare it. 1 when
 * how->repair dropped this entry and the ones after it (the table is too
 * big), 0 when read, -errno on failure (err set). */
static int snap_read_one(bi_node *n, struct qc_snap_read *how,
                         uint64_t file_len, uint64_t *off, uint64_t *tlen,
                         uint32_t i, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct qcow2_snapshot *sn = &s->snapshots[i];
    uint64_t pre = *off;
    uint16_t id_len, name_len;
    *tlen = bi_align_up(*tlen, 8);
    *off = bi_align_up(*off, 8);
    int ret =
        snap_read_head(n, how, file_len, off, sn, &id_len, &name_len, err);
    if (ret == 0)
        ret = snap_read_extra(n, how, file_len, off, i, sn, err);
    if (ret == 0)
        ret = snap_read_str(n, how, file_len, off, id_len, &sn->id_str, err);
    if (ret == 0)
        ret = snap_read_str(n, how, file_len, off, name_len, &sn->name, err);
    if (ret < 0)
        return ret;
    *tlen += 40 + (uint64_t)sn->extra_data_size + id_len + name_len;
    if (*tlen > QCOW2_MAX_SNAPSHOTS_SIZE ||
        *off - s->snapshots_offset > INT32_MAX) {
        uint32_t left = s->nb_snapshots - i;
        if (!how->repair && how->strict)
            return snap_err(err, -EFBIG, "Snapshot table is too big");
        if (!how->repair)
            return snap_err(err, -EFBIG,
                            "Snapshot table is too big\nYou can "
                            "force-remove all %" PRIu32 " overhanging "
                            "snapshots with qemu-img check -r all",
                            left);
        bi_message(BI_MESSAGE_CHECK,
                   "Discarding %" PRIu32 " overhanging snapshots (snapshot "
                   "table is too big)",
                   left);
        how->reduced += left;
        snap_free_one(sn);
        s->nb_snapshots = i;
        *off = pre;
        return 1;
    }
    if (how->strict && (uint64_t)sn->l1_size > QCOW2_MAX_L1_BYTES / 8)
        return snap_err(err, -EFBIG, "Snapshot L1 table too large");
    return 0;
}

int qc_read_snapshot_table(bi_node *n, struct qc_snap_read *how, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t off = s->snapshots_offset, tlen = 0;
    assert(!s->snapshots);
    s->snapshots_size = 0;
    if (!s->nb_snapshots)
        return 0;
    int64_t flen = bi_getlength(n->file);
    if (flen < 0)
        return snap_err(err, (int)flen, "Failed to read snapshot table: %s",
                        strerror((int)-flen));
    s->snapshots = calloc(s->nb_snapshots, sizeof(*s->snapshots));
    if (!s->snapshots)
        return -ENOMEM;
    int ret = 0;
    for (uint32_t i = 0; i < s->nb_snapshots && ret == 0; i++)
        ret = snap_read_one(n, how, (uint64_t)flen, &off, &tlen, i, err);
    if (ret < 0) {
        qc_free_snapshots(s);
        return ret;
    }
    assert(off - s->snapshots_offset <= INT32_MAX);
    s->snapshots_size = off - s->snapshots_offset;
    return 0;
}

int qc_read_snapshots(bi_node *n, bi_error *err)
{
    struct qc_snap_read how = {.strict = true};
    return qc_read_snapshot_table(n, &how, err);
}

/* ------------------------------------------------ create, apply, delete */

/* Writes the snapshot table for s->snapshots[0..nb) to new clusters and
 * switches the header to it; the old table is freed. */
static int write_snapshot_table(bi_node *n, struct qcow2_snapshot *sns,
                                uint32_t nb)
{
    qcow2_state *s = n->opaque;
    uint64_t size = 0;
    int ret;
    /* QEMU's size: each entry 8-aligned, no padding after the last */
    for (uint32_t i = 0; i < nb; i++)
        size = bi_align_up(size, 8) + 40 + 24 + sns[i].unknown_extra_len +
               strlen(sns[i].id_str) + strlen(sns[i].name);
    if (size > QCOW2_MAX_SNAPSHOTS_SIZE)
        return -EFBIG;
    uint64_t off = 0;
    uint8_t *buf = NULL;
    /* QEMU allocates (nothing) for an empty table too: its event */
    if (!size)
        bi_debug_event(n->file, BI_DBG_CLUSTER_ALLOC);
    if (size) {
        int64_t a = qc_alloc_clusters(n, qc_size_to_clusters(s, size));
        if (a < 0)
            return (int)a;
        off = (uint64_t)a;
        buf = calloc(1, bi_align_up(size, s->cluster_size));
        if (!buf) {
            qc_update_refcount(n, off, size, -1);
            return -ENOMEM;
        }
        uint8_t *p = buf;
        for (uint32_t i = 0; i < nb; i++) {
            const struct qcow2_snapshot *sn = &sns[i];
            size_t il = strlen(sn->id_str), nl = strlen(sn->name);
            uint32_t ex = 24 + sn->unknown_extra_len;
            qc_put64(p, sn->l1_table_offset);
            qc_put32(p + 8, sn->l1_size);
            qc_put16(p + 12, (uint16_t)il);
            qc_put16(p + 14, (uint16_t)nl);
            qc_put32(p + 16, sn->date_sec);
            qc_put32(p + 20, sn->date_nsec);
            qc_put64(p + 24, sn->vm_clock_nsec);
            qc_put32(p + 32, sn->vm_state_size > UINT32_MAX
                                 ? 0
                                 : (uint32_t)sn->vm_state_size);
            qc_put32(p + 36, ex);
            qc_put64(p + 40, sn->vm_state_size);
            qc_put64(p + 48, sn->disk_size);
            qc_put64(p + 56, sn->has_icount ? sn->icount : UINT64_MAX);
            if (sn->unknown_extra_len)
                memcpy(p + 64, sn->unknown_extra, sn->unknown_extra_len);
            memcpy(p + 40 + ex, sn->id_str, il);
            memcpy(p + 40 + ex + il, sn->name, nl);
            p += bi_align_up(40 + ex + il + nl, 8);
        }
        ret = qc_flush_metadata(n);
        if (ret == 0)
            ret = qc_check_overlap(n, 0, off, size);
        if (ret == 0)
            ret = bi_co_pwrite(n->file, off, buf, size, 0);
        if (ret == 0)
            ret = bi_co_flush(n->file);
        free(buf);
        if (ret < 0) {
            qc_update_refcount(n, off, size, -1);
            return ret;
        }
    } else {
        ret = qc_flush_metadata(n);
        if (ret == 0)
            ret = bi_co_flush(n->file);
        if (ret < 0)
            return ret;
    }
    uint8_t h[12];
    qc_put32(h, nb);
    qc_put64(h + 4, off);
    ret = qc_write_header_field(n, QH_NB_SNAPSHOTS, h, 12);
    if (ret < 0) {
        if (size)
            qc_update_refcount(n, off, size, -1);
        return ret;
    }
    uint64_t old_off = s->snapshots_offset, old_size = s->snapshots_size;
    s->snapshots_offset = off;
    s->snapshots_size = size;
    /* the new table is in force: failing to free the old one only leaks
     * (QEMU's qcow2_free_clusters reports it and goes on) */
    if (old_size) {
        ret = qc_update_refcount(n, old_off, old_size, -1);
        if (ret < 0)
            bi_message(BI_MESSAGE_WARNING, "qcow2_free_clusters failed: %s",
                       strerror(-ret));
    }
    return 0;
}

/* Adds addend to the refcounts of everything an L1 table references and
 * sets the COPIED flags from the new counts (active: also in the L1 table,
 * which is written back). */
static int update_snapshot_refcount(bi_node *n, uint64_t *l1, uint32_t l1_size,
                                    int addend, bool active)
{
    qcow2_state *s = n->opaque;
    int ret;
    for (uint32_t i = 0; i < l1_size; i++) {
        uint64_t l2 = l1[i] & L1E_OFFSET_MASK;
        if (!l2)
            continue;
        if (l2 & (s->cluster_size - 1))
            return qc_signal_corruption(n,
                                        "L2 table offset %#" PRIx64
                                        " unaligned (L1 index: %#" PRIx32 ")",
                                        l2, i);
        void *t;
        ret = qc_cache_get(n, &s->l2_cache, l2, false, &t);
        if (ret < 0)
            return ret;
        bool dirty = false;
        for (uint64_t j = 0; j < s->l2_entries; j++) {
            uint64_t e, b, rc;
            qc_get_l2(s, t, j, &e, &b);
            if (e & QCOW_OFLAG_COMPRESSED) {
                if (addend) {
                    uint64_t coff = e & s->cluster_offset_mask;
                    uint64_t nsec = ((e >> s->csize_shift) & s->csize_mask) + 1;
                    ret = qc_update_refcount(n, coff & ~511ULL, nsec * 512,
                                             addend);
                    if (ret < 0)
                        goto fail;
                }
                continue;
            }
            uint64_t host = e & L2E_OFFSET_MASK;
            if (!host || qc_has_data_file(s))
                continue;
            if (addend) {
                ret = qc_update_refcount(n, host, s->cluster_size, addend);
                if (ret < 0)
                    goto fail;
            }
            ret = qc_get_refcount(n, host >> s->cluster_bits, &rc);
            if (ret < 0)
                goto fail;
            uint64_t ne =
                rc == 1 ? e | QCOW_OFLAG_COPIED : e & ~QCOW_OFLAG_COPIED;
            if (ne != e) {
                qc_set_l2(s, t, j, ne, b);
                dirty = true;
            }
        }
        if (dirty)
            qc_cache_mark_dirty(&s->l2_cache, t);
        qc_cache_put(&s->l2_cache, t);
        if (addend) {
            ret = qc_update_refcount(n, l2, s->cluster_size, addend);
            if (ret < 0)
                return ret;
        }
        uint64_t rc;
        ret = qc_get_refcount(n, l2 >> s->cluster_bits, &rc);
        if (ret < 0)
            return ret;
        l1[i] =
            rc == 1 ? l1[i] | QCOW_OFLAG_COPIED : l1[i] & ~QCOW_OFLAG_COPIED;
        continue;
    fail:
        qc_cache_put(&s->l2_cache, t);
        return ret;
    }
    if (!active)
        return 0;
    /* refcounts and L2 tables first, then the L1 table */
    ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0 || !s->l1_size)
        return ret;
    uint64_t bytes = (uint64_t)s->l1_size * 8;
    uint64_t *be = malloc(bytes);
    if (!be)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->l1_size; i++)
        be[i] = htobe64(s->l1_table[i]);
    ret = qc_check_overlap(n, QC_OL_L1, s->l1_table_offset, bytes);
    if (ret == 0)
        ret = bi_co_pwrite(n->file, s->l1_table_offset, be, bytes, 0);
    free(be);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    return ret;
}

static int find_snapshot(const qcow2_state *s, const char *name)
{
    for (uint32_t i = 0; i < s->nb_snapshots; i++)
        if (!strcmp(s->snapshots[i].id_str, name))
            return (int)i;
    for (uint32_t i = 0; i < s->nb_snapshots; i++)
        if (!strcmp(s->snapshots[i].name, name))
            return (int)i;
    return -1;
}

static int read_l1(bi_node *n, uint64_t off, uint32_t size, uint64_t **out)
{
    qcow2_state *s = n->opaque;
    *out = NULL;
    if ((uint64_t)size > QCOW2_MAX_L1_BYTES / 8)
        return -EFBIG;
    if (off & (s->cluster_size - 1))
        return -EINVAL;
    uint64_t *l1 = calloc(size ? size : 1, 8);
    if (!l1)
        return -ENOMEM;
    if (size) {
        int ret = bi_co_pread(n->file, off, l1, (uint64_t)size * 8);
        if (ret < 0) {
            free(l1);
            return ret;
        }
        for (uint32_t i = 0; i < size; i++)
            l1[i] = be64toh(l1[i]);
    }
    *out = l1;
    return 0;
}

static int snapshots_supported(bi_node *n, bi_error *err, const char *what,
                               const char *name)
{
    qcow2_state *s = n->opaque;
    if (s->read_only)
        return qc_error(err, -EROFS,
                        "Could not %s snapshot '%s': image is "
                        "read-only",
                        what, name);
    if (qc_has_data_file(s))
        return qc_error(err, -ENOTSUP,
                        "Could not %s snapshot '%s': -95 "
                        "(Operation not supported)",
                        what, name);
    return 0;
}

int qc_snapshot_create(bi_node *n, const char *name, bi_error *err)
{
    qcow2_state *s = n->opaque;
    int ret = snapshots_supported(n, err, "create", name);
    if (ret < 0)
        return ret;
    if (s->nb_snapshots >= QCOW2_MAX_SNAPSHOTS)
        return qc_error(err, -EFBIG,
                        "Could not create snapshot '%s': -27 (File "
                        "too large)",
                        name);
    if (strlen(name) > 65535)
        return qc_error(err, -EINVAL,
                        "Could not create snapshot '%s': name too "
                        "long",
                        name);
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret < 0) {
        bi_co_mutex_unlock(&s->lock);
        return ret;
    }
    /* new id: one more than the highest numeric id */
    unsigned long max_id = 0;
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        unsigned long v = strtoul(s->snapshots[i].id_str, NULL, 10);
        if (v > max_id)
            max_id = v;
    }
    struct qcow2_snapshot sn;
    memset(&sn, 0, sizeof(sn));
    char id[32];
    snprintf(id, sizeof(id), "%lu", max_id + 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    sn.date_sec = (uint32_t)ts.tv_sec;
    sn.date_nsec = (uint32_t)(ts.tv_nsec / 1000 * 1000);
    sn.disk_size = n->size;
    sn.has_icount = true;
    sn.icount = 0;
    sn.l1_size = s->l1_size;

    /* copy of the active L1 table */
    uint64_t l1_bytes = (uint64_t)s->l1_size * 8;
    uint64_t l1_off = 0;
    if (l1_bytes) {
        int64_t a = qc_alloc_clusters(n, qc_size_to_clusters(s, l1_bytes));
        if (a < 0) {
            ret = (int)a;
            goto out;
        }
        l1_off = (uint64_t)a;
        uint64_t *be = malloc(l1_bytes);
        if (!be) {
            ret = -ENOMEM;
            goto out;
        }
        for (uint32_t i = 0; i < s->l1_size; i++)
            be[i] = htobe64(s->l1_table[i]);
        ret = qc_check_overlap(n, 0, l1_off, l1_bytes);
        if (ret == 0)
            ret = bi_co_pwrite(n->file, l1_off, be, l1_bytes, 0);
        free(be);
        if (ret < 0)
            goto out;
    }
    sn.l1_table_offset = l1_off;
    ret = update_snapshot_refcount(n, s->l1_table, s->l1_size, 1, true);
    if (ret < 0)
        goto out;

    struct qcow2_snapshot *arr = calloc(s->nb_snapshots + 1, sizeof(*arr));
    if (!arr) {
        ret = -ENOMEM;
        goto out;
    }
    if (s->nb_snapshots)
        memcpy(arr, s->snapshots, s->nb_snapshots * sizeof(*arr));
    sn.id_str = bi_xstrdup(id);
    sn.name = bi_xstrdup(name);
    arr[s->nb_snapshots] = sn;
    ret = write_snapshot_table(n, arr, s->nb_snapshots + 1);
    if (ret < 0) {
        free(sn.id_str);
        free(sn.name);
        free(arr);
        goto out;
    }
    free(s->snapshots);
    s->snapshots = arr;
    s->nb_snapshots++;
    ret = qc_flush_metadata(n);
out:
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0 && err && !err->msg[0])
        qc_error(err, ret, "Could not create snapshot '%s': %d (%s)", name, ret,
                 strerror(-ret));
    return ret;
}

int qc_snapshot_apply(bi_node *n, const char *name, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t *snl1 = NULL, *old = NULL;
    if (qc_bitmaps_kept(s)) /* as QEMU: the bitmaps could not follow */
        return qc_error(err, -EBUSY,
                        "Could not apply snapshot '%s': Device has active "
                        "dirty bitmaps",
                        name);
    int ret = snapshots_supported(n, err, "apply", name);
    if (ret < 0)
        return ret;
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret < 0) {
        bi_co_mutex_unlock(&s->lock);
        return ret;
    }
    int idx = find_snapshot(s, name);
    if (idx < 0) {
        bi_co_mutex_unlock(&s->lock);
        return qc_error(err, -ENOENT,
                        "Could not apply snapshot '%s': Failed to "
                        "load snapshot: No such file or directory",
                        name);
    }
    struct qcow2_snapshot *sn = &s->snapshots[idx];
    ret = qc_flush_metadata(n);
    if (ret < 0)
        goto out;
    ret = read_l1(n, sn->l1_table_offset, sn->l1_size, &snl1);
    if (ret < 0)
        goto out;
    if (sn->l1_size > s->l1_size) {
        ret = qc_grow_l1(n, sn->l1_size);
        if (ret < 0)
            goto out;
    }
    /* the snapshot's clusters gain the active reference first */
    ret = update_snapshot_refcount(n, snl1, sn->l1_size, 1, false);
    if (ret < 0)
        goto out;
    old = malloc((size_t)s->l1_size * 8 + 8);
    if (!old) {
        ret = -ENOMEM;
        goto out;
    }
    uint32_t old_size = s->l1_size;
    memcpy(old, s->l1_table, (size_t)old_size * 8);
    for (uint32_t i = 0; i < s->l1_size; i++)
        s->l1_table[i] = i < sn->l1_size ? snl1[i] : 0;
    /* the L1 switch is written by this update (flags recomputed) */
    ret = update_snapshot_refcount(n, s->l1_table, s->l1_size, 0, true);
    if (ret < 0)
        goto out;
    ret = update_snapshot_refcount(n, old, old_size, -1, false);
    if (ret < 0)
        goto out;
    ret = update_snapshot_refcount(n, s->l1_table, s->l1_size, 0, true);
    if (ret < 0)
        goto out;
    if (sn->disk_size != n->size) {
        uint64_t v = htobe64(sn->disk_size);
        ret = qc_write_header_field(n, QH_SIZE, &v, 8);
        if (ret < 0)
            goto out;
        n->size = sn->disk_size;
    }
    ret = qc_flush_metadata(n);
out:
    bi_co_mutex_unlock(&s->lock);
    free(snl1);
    free(old);
    if (ret < 0 && err && !err->msg[0])
        qc_error(err, ret, "Could not apply snapshot '%s': %s", name,
                 strerror(-ret));
    return ret;
}

int qc_snapshot_delete(bi_node *n, const char *name, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t *snl1 = NULL;
    const char *what = NULL; /* the step that failed, in QEMU's words */
    int ret = snapshots_supported(n, err, "delete", name);
    if (ret < 0)
        return ret;
    bi_co_mutex_lock(&s->lock);
    ret = qc_before_write(n);
    if (ret < 0) {
        bi_co_mutex_unlock(&s->lock);
        return ret;
    }
    int idx = find_snapshot(s, name);
    if (idx < 0) {
        bi_co_mutex_unlock(&s->lock);
        return qc_error(err, -ENOENT,
                        "Could not delete snapshot '%s': snapshot not found",
                        name);
    }
    struct qcow2_snapshot sn = s->snapshots[idx];
    ret = read_l1(n, sn.l1_table_offset, sn.l1_size, &snl1);
    if (ret < 0)
        goto out;
    struct qcow2_snapshot *arr =
        calloc(s->nb_snapshots ? s->nb_snapshots : 1, sizeof(*arr));
    if (!arr) {
        ret = -ENOMEM;
        goto out;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->nb_snapshots; i++)
        if ((int)i != idx)
            arr[k++] = s->snapshots[i];
    ret = write_snapshot_table(n, arr, k);
    if (ret < 0) {
        free(arr);
        what = "Failed to remove snapshot from snapshot list";
        goto out;
    }
    free(s->snapshots);
    s->snapshots = arr;
    s->nb_snapshots = k;
    /* the snapshot is gone from the table: drop its references (a
     * failure from here on leaks clusters, as in QEMU; its words) */
    ret = update_snapshot_refcount(n, snl1, sn.l1_size, -1, false);
    if (ret == 0 && sn.l1_size)
        ret = qc_update_refcount(n, sn.l1_table_offset,
                                 (uint64_t)sn.l1_size * 8, -1);
    what = "Failed to free the cluster and L1 table";
    if (ret == 0) {
        ret = update_snapshot_refcount(n, s->l1_table, s->l1_size, 0, true);
        what = "Failed to update snapshot status in disk";
    }
    if (ret == 0) {
        ret = qc_flush_metadata(n);
        what = NULL;
    }
    free(sn.id_str);
    free(sn.name);
    free(sn.unknown_extra);
out:
    bi_co_mutex_unlock(&s->lock);
    free(snl1);
    if (ret < 0 && err && !err->msg[0] && what)
        qc_error(err, ret, "Could not delete snapshot '%s': %s: %s", name, what,
                 strerror(-ret));
    else if (ret < 0 && err && !err->msg[0])
        qc_error(err, ret, "Could not delete snapshot '%s': %s", name,
                 strerror(-ret));
    return ret;
}

/* ------------------------------------------------------------ public API */

/* qemu's bdrv_snapshot_load_tmp() for qcow2: a read-only image reads
 * through the snapshot's L1 table from now on (the virtual size stays the
 * image's, as in QEMU). id and name: either or both (both must match). */
static int qc_snapshot_load_tmp(bi_node *n, const char *id, const char *name,
                                bi_error *err)
{
    qcow2_state *s = n->opaque;
    if (!s->read_only)
        return qc_error(err, -EINVAL, "Device is not readonly");
    int idx = -1;
    for (uint32_t i = 0; (id || name) && i < s->nb_snapshots; i++) {
        if ((!id || !strcmp(s->snapshots[i].id_str, id)) &&
            (!name || !strcmp(s->snapshots[i].name, name))) {
            idx = (int)i;
            break;
        }
    }
    if (idx < 0)
        return qc_error(err, -ENOENT, "Can't find snapshot");
    const struct qcow2_snapshot *sn = &s->snapshots[idx];
    if ((uint64_t)sn->l1_size > QCOW2_MAX_L1_BYTES / 8)
        return qc_error(err, -EFBIG, "Snapshot L1 table too large");
    if (sn->l1_table_offset & (s->cluster_size - 1) ||
        sn->l1_table_offset > s->file_size ||
        (uint64_t)sn->l1_size * 8 > s->file_size - sn->l1_table_offset)
        return qc_error(err, -EINVAL, "Snapshot L1 table offset invalid");
    uint64_t *l1 = NULL;
    bi_co_mutex_lock(&s->lock);
    int ret = read_l1(n, sn->l1_table_offset, sn->l1_size, &l1);
    if (ret == 0) {
        free(s->l1_table);
        s->l1_table = l1;
        s->l1_size = sn->l1_size;
        s->l1_table_offset = sn->l1_table_offset;
    }
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        return qc_error(err, ret, "Could not read snapshot L1 table: %s",
                        strerror(-ret));
    return 0;
}

/* The snapshot table as the library lists it. */
static int qc_snapshot_list(bi_node *node, struct bi_snapshot_info ***out,
                            int *count)
{
    qcow2_state *s = node->opaque;
    *out = NULL;
    *count = 0;
    if (!s->nb_snapshots)
        return 0;
    struct bi_snapshot_info **v = bi_xzalloc(s->nb_snapshots * sizeof(*v));
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        const struct qcow2_snapshot *sn = &s->snapshots[i];
        v[i] = bi_xzalloc(sizeof(*v[i]));
        v[i]->id = bi_xstrdup(sn->id_str);
        v[i]->name = bi_xstrdup(sn->name);
        v[i]->vm_state_size = sn->vm_state_size;
        v[i]->date_sec = sn->date_sec;
        v[i]->date_nsec = sn->date_nsec;
        v[i]->vm_clock_nsec = sn->vm_clock_nsec;
        v[i]->icount = sn->has_icount ? sn->icount : UINT64_MAX;
    }
    *out = v;
    *count = (int)s->nb_snapshots;
    return 0;
}

const struct bi_snapshot_ops qc_snapshot_ops = {
    .co_create = qc_snapshot_create,
    .co_apply = qc_snapshot_apply,
    .co_delete = qc_snapshot_delete,
    .co_load_tmp = qc_snapshot_load_tmp,
    .list = qc_snapshot_list,
};

/* ------------------------------------------------- persistent bitmaps */

void qc_free_bitmaps(qcow2_state *s)
{
    if (!s->bitmaps)
        return;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++)
        free(s->bitmaps[i].name);
    free(s->bitmaps);
    s->bitmaps = NULL;
}

int qc_read_bitmaps(bi_node *n, bi_error *err)
{
    qcow2_state *s = n->opaque;
    if (!s->nb_bitmaps)
        return 0;
    if (s->nb_bitmaps > 65535)
        return snap_err(err, -EINVAL,
                        "bitmaps_ext: Image has too many bitmaps");
    if (s->bitmap_dir_size > (64u << 20) || s->bitmap_dir_size < 24 ||
        (s->bitmap_dir_offset & (s->cluster_size - 1)) ||
        s->bitmap_dir_offset > s->file_size ||
        s->file_size - s->bitmap_dir_offset < s->bitmap_dir_size)
        return snap_err(err, -EINVAL, "bitmaps_ext: Invalid bitmap directory");
    uint8_t *d = malloc(s->bitmap_dir_size);
    if (!d)
        return -ENOMEM;
    int ret = bi_co_pread(n->file, s->bitmap_dir_offset, d, s->bitmap_dir_size);
    if (ret < 0) {
        free(d);
        return snap_err(err, ret, "Failed to read bitmap directory");
    }
    s->bitmaps = calloc(s->nb_bitmaps, sizeof(*s->bitmaps));
    if (!s->bitmaps) {
        free(d);
        return -ENOMEM;
    }
    uint64_t pos = 0;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qcow2_bitmap *bm = &s->bitmaps[i];
        if (s->bitmap_dir_size - pos < 24)
            goto bad;
        const uint8_t *e = d + pos;
        bm->table_offset = qc_get64(e);
        bm->table_size = qc_get32(e + 8);
        bm->flags = qc_get32(e + 12);
        bm->granularity_bits = e[17];
        uint16_t nl = qc_get16(e + 18);
        uint32_t ex = qc_get32(e + 20);
        uint64_t len = 24 + (uint64_t)ex + nl;
        if (len > s->bitmap_dir_size - pos || bm->granularity_bits > 63 ||
            (bm->table_offset & (s->cluster_size - 1)) ||
            (uint64_t)bm->table_size * 8 > (64u << 20))
            goto bad;
        bm->name = malloc((size_t)nl + 1);
        if (!bm->name)
            goto bad;
        memcpy(bm->name, e + 24 + ex, nl);
        bm->name[nl] = 0;
        pos += bi_align_up(len, 8);
    }
    free(d);
    return 0;
bad:
    free(d);
    qc_free_bitmaps(s);
    return snap_err(err, -EINVAL,
                    "bitmaps_ext: Invalid bitmap directory entry");
}

int qc_rewrite_snapshot_table(bi_node *n)
{
    qcow2_state *s = n->opaque;
    int ret = write_snapshot_table(n, s->snapshots, s->nb_snapshots);
    for (uint32_t i = 0; ret == 0 && i < s->nb_snapshots; i++)
        s->snapshots[i].extra_data_size =
            24 + s->snapshots[i].unknown_extra_len;
    return ret;
}
