/* SPDX-License-Identifier: MIT */
/* Public wrappers for the image operations (blkimg/image_ops.h). */
#include "blkimg/image_ops.h"
#include "block/block.h"

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
    if (ret < 0)
        bi_error_set(err, -ret, "Could not empty '%s'", n->filename);
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
