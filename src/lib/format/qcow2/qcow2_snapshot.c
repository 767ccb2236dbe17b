/* SPDX-License-Identifier: MIT */
/* qcow2 internal snapshots: reading the snapshot table (bounds-checked). */
#include "qcow2.h"
#include "util/util.h"
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define QCOW2_MAX_SNAPSHOTS_SIZE (1024ULL * QCOW2_MAX_SNAPSHOTS)

static uint64_t g64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}
static uint32_t g32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}
static uint16_t g16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return be16toh(v);
}

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

static int snap_err(bi_error *err, int code, const char *msg)
{
    bi_error_set(err, 0, "%s", msg);
    if (err && !err->code)
        err->code = code;
    return code;
}

int qc_read_snapshots(bi_node *n, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t off = s->snapshots_offset;
    int ret;

    s->snapshots_size = 0;
    if (!s->nb_snapshots)
        return 0;
    s->snapshots = calloc(s->nb_snapshots, sizeof(*s->snapshots));
    if (!s->snapshots)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->nb_snapshots; i++) {
        struct qcow2_snapshot *sn = &s->snapshots[i];
        uint8_t h[40];
        if (off > s->file_size || s->file_size - off < sizeof(h))
            return snap_err(err, -EINVAL, "Snapshot table exceeds the file");
        ret = bi_co_pread(n->file, off, h, sizeof(h));
        if (ret < 0)
            return snap_err(err, ret, "Failed to read snapshot table");
        off += sizeof(h);
        sn->l1_table_offset = g64(h);
        sn->l1_size = g32(h + 8);
        uint16_t id_len = g16(h + 12), name_len = g16(h + 14);
        sn->date_sec = g32(h + 16);
        sn->date_nsec = g32(h + 20);
        sn->vm_clock_nsec = g64(h + 24);
        sn->vm_state_size = g32(h + 32);
        sn->extra_data_size = g32(h + 36);
        if (sn->extra_data_size > QCOW2_MAX_SNAPSHOT_EXTRA)
            return snap_err(err, -EFBIG,
                            "Too much extra metadata in "
                            "snapshot table entry");
        uint64_t var = (uint64_t)sn->extra_data_size + id_len + name_len;
        if (off > s->file_size || s->file_size - off < var)
            return snap_err(err, -EINVAL, "Snapshot table exceeds the file");
        uint8_t *v = malloc(var + 1);
        if (!v)
            return -ENOMEM;
        ret = var ? bi_co_pread(n->file, off, v, var) : 0;
        if (ret < 0) {
            free(v);
            return snap_err(err, ret, "Failed to read snapshot table");
        }
        uint32_t ex = sn->extra_data_size;
        if (ex >= 8)
            sn->vm_state_size = g64(v);
        sn->disk_size = ex >= 16 ? g64(v + 8) : n->size;
        if (ex >= 24) {
            sn->has_icount = true;
            sn->icount = g64(v + 16);
            if (sn->icount == UINT64_MAX)
                sn->has_icount = false;
        }
        if (ex > 24) {
            sn->unknown_extra_len = ex - 24;
            sn->unknown_extra = malloc(ex - 24);
            if (sn->unknown_extra)
                memcpy(sn->unknown_extra, v + 24, ex - 24);
        }
        sn->id_str = malloc((size_t)id_len + 1);
        sn->name = malloc((size_t)name_len + 1);
        if (!sn->id_str || !sn->name) {
            free(v);
            return -ENOMEM;
        }
        memcpy(sn->id_str, v + ex, id_len);
        sn->id_str[id_len] = 0;
        memcpy(sn->name, v + ex + id_len, name_len);
        sn->name[name_len] = 0;
        free(v);
        off += var;
        off = bi_align_up(off, 8);
        if (off - s->snapshots_offset > QCOW2_MAX_SNAPSHOTS_SIZE)
            return snap_err(err, -EFBIG, "Snapshot table is too big");
        if ((uint64_t)sn->l1_size > QCOW2_MAX_L1_BYTES / 8)
            return snap_err(err, -EFBIG, "Snapshot L1 table too large");
    }
    s->snapshots_size = off - s->snapshots_offset;
    return 0;
}
