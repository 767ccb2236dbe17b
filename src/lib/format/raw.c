/* SPDX-License-Identifier: MIT */
/*
 * The raw format: guest offset X is host offset X of the file. Its map is
 * the identity, so raw images take exactly the generic path qcow2 takes.
 */
#include "blkimg/convert.h"
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int raw_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)buf;
    (void)len;
    (void)filename;
    return 1; /* anything is raw, at the lowest score */
}

static int raw_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    (void)o;
    (void)err;
    n->size = n->file->size;
    return 0;
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
    st->flags |= BI_BS_ALLOCATED | BI_BS_OFFSET_VALID;
    st->offset = off;
    st->file = n->file;
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
 * into the file, which blkimg does not do (refusing beats reading or
 * writing outside the window). */
static const struct bi_opt_desc raw_runtime_opts[] = {
    {"offset", BI_OPT_SIZE, NULL, NULL, BI_OPT_REFUSED},
    {"size", BI_OPT_SIZE, NULL, NULL, BI_OPT_REFUSED},
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
    .refresh_limits = raw_refresh_limits,
    .co_map = raw_co_map,
    .co_pwrite_zeroes = raw_co_pwrite_zeroes,
    .co_pdiscard = raw_co_pdiscard,
    .co_truncate = raw_co_truncate,
    .co_block_status = raw_co_block_status,
    .get_allocated_file_size = raw_allocated_size,
    .get_geometry = raw_get_geometry,
};
