/* SPDX-License-Identifier: MIT */
/* Public wrappers for the image operations (blkimg/image_ops.h). */
#include "blkimg/image_ops.h"
#include "blkimg/qcow2.h"
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int bi_change_backing_file(bi_node *n, const char *backing_file,
                           const char *backing_fmt, bool require, bi_error *err)
{
    if (!n->drv)
        return -ENOMEDIUM;
    /* a backing format makes no sense without a backing file */
    if (backing_fmt && !backing_file)
        return -EINVAL;
    if (require && backing_file && !backing_fmt)
        return -EINVAL;
    if (!n->drv->change_backing_file)
        return -ENOTSUP;
    if (n->read_only)
        return -EACCES;
    int ret = n->drv->change_backing_file(n, backing_file, backing_fmt, err);
    if (ret < 0)
        return ret;
    char *bf = backing_file ? strdup(backing_file) : NULL;
    char *bfmt = backing_fmt ? strdup(backing_fmt) : NULL;
    if ((backing_file && !bf) || (backing_fmt && !bfmt)) {
        free(bf);
        free(bfmt);
        return -ENOMEM;
    }
    free(n->backing_filename);
    free(n->backing_format);
    n->backing_filename = bf;
    n->backing_format = bfmt;
    return 0;
}

bi_node *bi_reopen_backing_rw(bi_node *n, bi_node **restored, bi_error *err)
{
    bi_node *parent = n->parent;
    *restored = n;
    if (!parent || parent->backing != n || n->drv->is_protocol) {
        bi_error_set(err, EINVAL, "Could not reopen '%s'", n->filename);
        return NULL;
    }
    if (!n->read_only)
        return n;
    char *filename = strdup(n->filename);
    /* the driver's name outlives the node: the new node keeps a pointer */
    const char *format = n->drv->name;
    if (!filename) {
        bi_error_set(err, ENOMEM, "Could not reopen '%s'", n->filename);
        return NULL;
    }
    struct bi_open_opts o = n->opts;
    o.format = format;
    o.read_write = true;
    o.quiet_probe = true;
    o.driver_opts = NULL;
    bi_error e;
    bi_error_init(&e);
    parent->backing = NULL;
    bi_close(n, &e);
    bi_node *nn = bi_open_node(filename, format, &o, &e);
    if (!nn) {
        bi_error_set(err, 0, "Could not reopen file: %s", e.msg);
        o.read_write = false;
        bi_error_init(&e);
        nn = bi_open_node(filename, format, &o, &e);
        *restored = nn;
        if (nn) {
            parent->backing = nn;
            nn->parent = parent;
        }
        nn = NULL;
    } else {
        parent->backing = nn;
        nn->parent = parent;
        *restored = nn;
    }
    free(filename);
    return nn;
}

static int make_empty_co(void *arg)
{
    bi_node *n = arg;
    return n->drv->co_make_empty(n);
}

int bi_make_empty(bi_node *n, bi_error *err)
{
    if (!n->drv || !n->drv->co_make_empty) {
        bi_error_set(err, 0, "Operation not supported");
        return -ENOTSUP;
    }
    if (n->read_only) {
        bi_error_set(err, EACCES, "Could not empty '%s'", n->filename);
        return -EACCES;
    }
    int ret = bi_run_co(make_empty_co, n);
    if (ret < 0) /* QEMU's bdrv_make_empty */
        bi_error_set(err, -ret, "Failed to empty %s", n->filename);
    return ret;
}

int bi_amend(bi_node *n, const char *const *options, bool force,
             bi_amend_status_cb *cb, void *opaque, bi_error *err)
{
    if (!n->drv || !n->drv->amend) {
        bi_error_set(err, 0,
                     "Format driver '%s' does not support option amendment",
                     n->drv ? n->drv->name : "");
        return -ENOTSUP;
    }
    if (n->read_only) {
        bi_error_set(err, EACCES, "Could not amend '%s'", n->filename);
        return -EACCES;
    }
    return n->drv->amend(n, options, force, cb, opaque, err);
}

/* ------------------------------------------------------------ snapshots */

enum snap_op { SNAP_CREATE, SNAP_APPLY, SNAP_DELETE };

struct snap_args {
    bi_node *n;
    enum snap_op op;
    const char *name, *id; /* load_tmp: id and name; others: name */
    bi_error *err;
};

static int snap_co(void *opaque)
{
    struct snap_args *a = opaque;
    const struct bi_snapshot_ops *ops = a->n->drv->snapshot;
    switch (a->op) {
    case SNAP_CREATE:
        return ops->co_create(a->n, a->name, a->err);
    case SNAP_APPLY:
        return ops->co_apply(a->n, a->name, a->err);
    default:
        return ops->co_delete(a->n, a->name, a->err);
    }
}

/* Runs one snapshot operation on the node that holds the snapshots (a
 * raw image's protocol, as in QEMU), or refuses it as QEMU does for a
 * format without snapshots. */
static int snap_op(bi_node *n, const char *name, enum snap_op op, bi_error *err)
{
    static const char *const what[] = {"create", "apply", "delete"};
    n = bi_snapshot_node(n);
    const struct bi_snapshot_ops *ops = n->drv->snapshot;
    if (!ops || !(op == SNAP_CREATE  ? ops->co_create
                  : op == SNAP_APPLY ? ops->co_apply
                                     : ops->co_delete)) {
        bi_error_set(err, 0,
                     "Could not %s snapshot '%s': -95 (Operation not "
                     "supported)",
                     what[op], name);
        return -ENOTSUP;
    }
    struct snap_args a = {n, op, name, NULL, err};
    return bi_run_co(snap_co, &a);
}

int bi_snapshot_create(bi_node *node, const char *name, bi_error *err)
{
    return snap_op(node, name, SNAP_CREATE, err);
}

int bi_snapshot_apply(bi_node *node, const char *name, bi_error *err)
{
    return snap_op(node, name, SNAP_APPLY, err);
}

int bi_snapshot_delete(bi_node *node, const char *name, bi_error *err)
{
    return snap_op(node, name, SNAP_DELETE, err);
}

static int load_tmp_co(void *opaque)
{
    struct snap_args *a = opaque;
    return a->n->drv->snapshot->co_load_tmp(a->n, a->id, a->name, a->err);
}

int bi_snapshot_load_tmp(bi_node *node, const char *id, const char *name,
                         bi_error *err)
{
    if (!node->drv->snapshot || !node->drv->snapshot->co_load_tmp) {
        bi_error_set(err, 0,
                     "Block format '%s' used by device '' does not support "
                     "temporarily loading internal snapshots",
                     node->drv->name);
        return -ENOTSUP;
    }
    struct snap_args a = {node, SNAP_APPLY, name, id, err};
    return bi_run_co(load_tmp_co, &a);
}

int bi_snapshot_list(bi_node *node, struct bi_snapshot_info ***out, int *count,
                     bi_error *err)
{
    (void)err;
    *out = NULL;
    *count = 0;
    node = bi_snapshot_node(node);
    return node->drv->snapshot ? node->drv->snapshot->list(node, out, count)
                               : 0;
}

/* -------------------------------------------------------------- bitmaps */

struct bitmap_args {
    bi_node *n;
    const struct bi_bitmap_req *r;
    bi_error *err;
};

static int bitmap_co(void *opaque)
{
    struct bitmap_args *a = opaque;
    return a->n->drv->bitmap->co_change(a->n, a->r, a->err);
}

/* Runs one bitmap change, or refuses it with QEMU's words where the node
 * (or the merge source) has no bitmaps: nothing to store to, nothing
 * found. */
static int bitmap_change(bi_node *n, struct bi_bitmap_req *r, bi_error *err)
{
    if (!n->drv->bitmap) {
        if (r->op == BI_BITMAP_ADD) {
            bi_error_set(err, 0, "Can't store persistent bitmaps to %s: %s",
                         n->filename, strerror(ENOTSUP));
            return -ENOTSUP;
        }
        bi_error_set(err, 0, "Dirty bitmap '%s' not found", r->name);
        return -ENOENT;
    }
    if (r->op == BI_BITMAP_MERGE && !r->src->drv->bitmap) {
        bi_error_set(err, 0, "Dirty bitmap '%s' not found", r->src_name);
        return -ENXIO;
    }
    struct bitmap_args a = {n, r, err};
    return bi_run_co(bitmap_co, &a);
}

int bi_bitmap_add(bi_node *node, const char *name, uint64_t granularity,
                  bool disabled, bi_error *err)
{
    struct bi_bitmap_req r = {.op = BI_BITMAP_ADD,
                              .name = name,
                              .granularity = granularity,
                              .flag = disabled};
    return bitmap_change(node, &r, err);
}

int bi_bitmap_remove(bi_node *node, const char *name, bi_error *err)
{
    struct bi_bitmap_req r = {.op = BI_BITMAP_REMOVE, .name = name};
    return bitmap_change(node, &r, err);
}

int bi_bitmap_clear(bi_node *node, const char *name, bi_error *err)
{
    struct bi_bitmap_req r = {.op = BI_BITMAP_CLEAR, .name = name};
    return bitmap_change(node, &r, err);
}

int bi_bitmap_enable(bi_node *node, const char *name, bool enable,
                     bi_error *err)
{
    struct bi_bitmap_req r = {
        .op = BI_BITMAP_ENABLE, .name = name, .flag = enable};
    return bitmap_change(node, &r, err);
}

int bi_bitmap_merge(bi_node *node, const char *name, bi_node *src,
                    const char *src_name, bi_error *err)
{
    struct bi_bitmap_req r = {.op = BI_BITMAP_MERGE,
                              .name = name,
                              .src = src ? src : node,
                              .src_name = src_name};
    return bitmap_change(node, &r, err);
}

bool bi_bitmap_supported(bi_node *node)
{
    return node->drv->bitmap && node->drv->bitmap->supported(node);
}

void bi_snapshot_list_free(struct bi_snapshot_info **v, int count)
{
    for (int i = 0; v && i < count; i++) {
        if (v[i]) {
            free(v[i]->id);
            free(v[i]->name);
            free(v[i]);
        }
    }
    free(v);
}

int bi_bitmap_list(bi_node *node, struct bi_bitmap_info ***out, int *count)
{
    *out = NULL;
    *count = 0;
    if (!node->drv->bitmap)
        return -ENOTSUP;
    return node->drv->bitmap->list(node, out, count);
}

void bi_bitmap_list_free(struct bi_bitmap_info **v, int count)
{
    for (int i = 0; v && i < count; i++) {
        if (v[i]) {
            free(v[i]->name);
            free(v[i]);
        }
    }
    free(v);
}

struct check_args {
    bi_node *n;
    int fix;
    struct bi_check_result *res;
    bi_error *err;
};

static int check_co(void *opaque)
{
    struct check_args *a = opaque;
    return a->n->drv->check(a->n, a->res, a->fix, a->err);
}

int bi_check_sized(bi_node *node, int fix, struct bi_check_result *result,
                   size_t size, bi_error *err)
{
    struct bi_check_result full;
    int ret = -ENOTSUP;

    memset(&full, 0, sizeof(full));
    if (node->drv->check) {
        struct check_args a = {node, fix, &full, err};
        ret = bi_run_co(check_co, &a);
    }
    bi_struct_out(result, size, &full, sizeof(full));
    return ret;
}
