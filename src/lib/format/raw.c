/* SPDX-License-Identifier: MIT */
/*
 * The raw format: guest offset X is host offset X of the file. Its map is
 * the identity, so raw images take exactly the generic path qcow2 takes.
 */
#include "blkimg/convert.h"
#include "block/block.h"
#include "format/raw_window.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int raw_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)buf;
    (void)len;
    (void)filename;
    return 1; /* anything is raw, at the lowest score */
}

/* The last "key=value" of opts for key, or NULL. */
static const char *opt_value(const char *const *opts, const char *key)
{
    return bi_opts_value(opts, key);
}

/* Opens raw: with offset or size among its options, its file becomes a
 * window on the file (raw_window.h) and the node is named as QEMU names
 * it. */
static int raw_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct raw_window_opts wo = {
        opt_value(o->driver_opts, "offset"),
        opt_value(o->driver_opts, "size"),
    };
    if (wo.offset || wo.size) {
        bi_node *file = n->file;
        bi_node *w = raw_window_open(file, &wo, o, err);
        if (!w)
            return -EINVAL; /* n->file is still the caller's to close */
        n->file = w;
        w->parent = n;
        free(n->filename);
        n->filename = bi_xstrdup(w->filename);
    }
    n->size = n->file->size;
    return 0;
}

/* Refuses the keys of raw's file ("k=v", NULL-terminated, "driver=NAME"
 * among them) that its driver does not take, in QEMU's words: a driver
 * with a table of run-time options checks its own; one without (file)
 * takes its name, locking and aio only (the latter two are not applied:
 * the image's own locking and engine stand). */
static int check_file_keys(const char *const *keys, bi_error *err)
{
    const char *name = opt_value(keys, "driver");
    const struct bi_driver *d = bi_driver_find(name ? name : "file");
    if (!d) {
        bi_error_set(err, 0, "Unknown driver '%s'", name);
        return -EINVAL;
    }
    if (d->runtime_opts)
        return 0; /* its open checks them */
    for (const char *const *p = keys; *p; p++) {
        size_t kl = strcspn(*p, "=");
        if ((kl == 6 && !strncmp(*p, "driver", 6)) ||
            (kl == 7 && !strncmp(*p, "locking", 7)) ||
            (kl == 3 && !strncmp(*p, "aio", 3)))
            continue;
        bi_error_set(err, 0,
                     "Block protocol '%s' doesn't support the option '%.*s'",
                     d->name, (int)kl, *p);
        return -EINVAL;
    }
    return 0;
}

/* raw as another format's file (bi_driver.open_as_file): its own keys
 * (offset, size) make the window, the "file.*" keys open its file. */
static bi_node *raw_open_as_file(const char *filename,
                                 const struct bi_open_opts *o, bi_error *err)
{
    struct raw_window_opts wo = {NULL, NULL};
    const char **keys = bi_xzalloc(sizeof(char *));
    size_t nk = 0;
    const char *fname = filename;

    for (const char *const *p = o->protocol_opts; p && *p; p++) {
        if (!strncmp(*p, "driver=", 7))
            continue;
        if (!strncmp(*p, "offset=", 7)) {
            wo.offset = *p + 7;
        } else if (!strncmp(*p, "size=", 5)) {
            wo.size = *p + 5;
        } else if (!strncmp(*p, "file.filename=", 14)) {
            fname = *p + 14;
        } else if (!strncmp(*p, "file.", 5)) {
            keys = realloc(keys, sizeof(char *) * (nk + 2));
            if (!keys)
                abort();
            keys[nk++] = *p + 5;
            keys[nk] = NULL;
        } else {
            bi_error_set(err, 0,
                         "Block format 'raw' does not support the option "
                         "'%.*s'",
                         (int)strcspn(*p, "="), *p);
            free(keys);
            return NULL;
        }
    }
    if (check_file_keys(keys, err) < 0) {
        free(keys);
        return NULL;
    }
    struct bi_open_opts co = *o;
    co.protocol_opts = keys;
    bi_node *file = bi_open_protocol(fname, &co, err);
    free(keys);
    if (!file)
        return NULL;
    bi_node *w = raw_window_open(file, &wo, o, err);
    if (!w) {
        if (file->drv->close)
            file->drv->close(file);
        bi_node_free(file);
    }
    return w;
}

static void raw_refresh_limits(bi_node *n)
{
    n->limits = n->file->limits;
}

static int raw_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                      struct bi_extent *ext)
{
    (void)flags;
    ext->kind = BI_EXT_DATA;
    ext->len = len;
    ext->host = n->file;
    ext->host_offset = off;
    return 0;
}

static int raw_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                                int flags)
{
    return bi_co_pwrite_zeroes(n->file, off, len, flags);
}

static int raw_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    return bi_co_pdiscard(n->file, off, len);
}

static int raw_co_truncate(bi_node *n, uint64_t size, bool exact,
                           enum bi_prealloc prealloc, bi_error *err)
{
    int ret = n->file->drv->co_truncate(n->file, size, exact, prealloc, err);
    if (ret == 0) {
        n->size = n->file->size;
    }
    return ret;
}

static int raw_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                               struct bi_status *st)
{
    int ret = bi_co_block_status(n->file, off, len, st);
    if (ret < 0)
        return ret;
    /* a window answers with its file's offsets */
    if (!(st->flags & BI_BS_OFFSET_VALID) || !st->file) {
        st->offset = off;
        st->file = n->file;
    }
    st->flags |= BI_BS_ALLOCATED | BI_BS_OFFSET_VALID;
    return 0;
}

static int64_t raw_allocated_size(bi_node *n)
{
    return n->file->drv->get_allocated_file_size
               ? n->file->drv->get_allocated_file_size(n->file)
               : -ENOTSUP;
}

static int raw_create(const char *filename, const struct bi_create_opts *o,
                      bi_error *err)
{
    const struct bi_driver *proto = bi_protocol_for(filename);

    for (const char *const *p = o->options; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        int klen = eq ? (int)(eq - *p) : (int)strlen(*p);
        char key[64];
        snprintf(key, sizeof(key), "%.*s", klen, *p);
        /* the protocol's own (rbd's cluster_size) go through to it */
        if (strcmp(key, "size") && strcmp(key, "preallocation") &&
            !bi_opt_lookup(proto->create_opts, key)) {
            bi_error_set(err, 0, "Invalid parameter '%s'", key);
            return -EINVAL;
        }
    }
    if (o->backing_file) {
        bi_error_set(err, 0,
                     "Backing file not supported for file format "
                     "'raw'");
        return -ENOTSUP;
    }
    return bi_create_file(filename, o, err);
}

/* qemu-img measure: the virtual size, required and fully allocated alike
 * (src's length, or the size option aligned to sectors). */
static int raw_measure(const char *const *opts, bi_node *src,
                       struct bi_measure *out, bi_error *err)
{
    if (src) {
        int64_t len = bi_getlength(src);
        if (len < 0) {
            bi_error_set(err, (int)-len, "Unable to get image size");
            return (int)len;
        }
        out->required = (uint64_t)len;
    } else {
        const char *v = NULL;
        for (const char *const *p = opts; p && *p; p++)
            if (!strncmp(*p, "size=", 5))
                v = *p + 5;
        uint64_t sz = 0;
        if (v && bi_parse_size(v, &sz) < 0) {
            bi_error_set(err, 0, "Parameter 'size' expects a size");
            return -EINVAL;
        }
        out->required = bi_align_up(sz, 512);
    }
    out->fully_allocated = out->required;
    return 0;
}

/* qemu 7.2's raw creation options (the file protocol adds its own). */
static const struct bi_opt_desc raw_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

/* qemu 7.2's raw runtime options: offset and size make the node a window
 * into the file (raw_window.c). */
static const struct bi_opt_desc raw_runtime_opts[] = {
    {"offset", BI_OPT_SIZE, "offset in the disk where the image starts", NULL,
     0},
    {"size", BI_OPT_SIZE, "virtual disk size", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

/* QEMU's raw answers bdrv_get_info with its file's: the cluster size of a
 * protocol that has one (an RBD object). */
static void raw_get_geometry(bi_node *n, struct bi_geometry *g)
{
    struct bi_geometry fg;

    bi_node_geometry(n->file, &fg);
    g->cluster_size = fg.cluster_size;
}

const struct bi_driver bi_drv_raw = {
    .name = "raw",
    .identity_map = true,
    .probe = raw_probe,
    .open = raw_open,
    .create = raw_create,
    .create_opts = raw_create_opts,
    .measure = raw_measure,
    .runtime_opts = raw_runtime_opts,
    .open_as_file = raw_open_as_file,
    .refresh_limits = raw_refresh_limits,
    .co_map = raw_co_map,
    .co_pwrite_zeroes = raw_co_pwrite_zeroes,
    .co_pdiscard = raw_co_pdiscard,
    .co_truncate = raw_co_truncate,
    .co_block_status = raw_co_block_status,
    .get_allocated_file_size = raw_allocated_size,
    .get_geometry = raw_get_geometry,
};
