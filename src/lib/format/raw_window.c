/* SPDX-License-Identifier: MIT */
/*
 * raw's window (raw_window.h): a filter that adds the offset to every
 * request and keeps a fixed-size window's requests inside it, as QEMU
 * 7.2's raw_adjust_offset does (reads outside: EINVAL; writes, zero
 * writes and discards: ENOSPC). Without a size the window ends where the
 * file ends and grows with it.
 */
#include "format/raw_window.h"
#include "filter/filter.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* QEMU sizes nodes in sectors: a fixed size must be a multiple of them. */
#define RW_SECTOR 512

struct rw_state {
    uint64_t offset;
    uint64_t size; /* has_size: fixed; else follows the file */
    bool has_size;
};

static const struct bi_driver raw_window_drv;

bool raw_is_window(const bi_node *n)
{
    return n && n->drv == &raw_window_drv;
}

/* The window's size once the file may have changed (QEMU's
 * raw_getlength): a fixed size shrinks with a file cut below it. */
static void rw_update_size(bi_node *n)
{
    struct rw_state *s = n->opaque;
    uint64_t len = n->file->size;
    if (len < s->offset)
        n->size = 0;
    else if (s->has_size)
        n->size = BI_MIN(s->size, len - s->offset);
    else
        n->size = len - s->offset;
}

/* Parses the option key's value v into *out; -EINVAL with QEMU's words. */
static int rw_parse(const char *key, const char *v, uint64_t *out,
                    bi_error *err)
{
    if (bi_parse_size(v, out) == 0)
        return 0;
    bi_error_set(err, 0,
                 "Parameter '%s' expects a non-negative number below 2^64\n"
                 "Optional suffix k, M, G, T, P or E means kilo-, mega-, "
                 "giga-, tera-, peta-\n"
                 "and exabytes, respectively.",
                 key);
    return -EINVAL;
}

/* Checks offset and size against the file, in QEMU's order and words
 * (raw_apply_options; its messages print the offset and size given). */
static int rw_apply(bi_node *n, bi_error *err)
{
    struct rw_state *s = n->opaque;
    uint64_t real = n->file->size;

    if (s->offset > real) {
        bi_error_set(err, 0,
                     "Offset (%" PRIu64 ") cannot be greater than size of "
                     "the containing file (%" PRIu64 ")",
                     s->offset, real);
        return -EINVAL;
    }
    if (s->has_size && real - s->offset < s->size) {
        bi_error_set(err, 0,
                     "The sum of offset (%" PRIu64 ") and size (%" PRIu64
                     ") has to be smaller or equal to the  actual size of "
                     "the containing file (%" PRIu64 ")",
                     s->offset, s->size, real);
        return -EINVAL;
    }
    if (s->has_size && s->size % RW_SECTOR) {
        bi_error_set(err, 0, "Specified size is not multiple of %d", RW_SECTOR);
        return -EINVAL;
    }
    rw_update_size(n);
    return 0;
}

static int rw_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct rw_state *s = n->opaque;
    const char *off = bi_filter_opt(o, "offset");
    const char *size = bi_filter_opt(o, "size");

    if (off && rw_parse("offset", off, &s->offset, err) < 0)
        return -EINVAL;
    if (size && rw_parse("size", size, &s->size, err) < 0)
        return -EINVAL;
    s->has_size = size != NULL;
    n->read_only = n->file->read_only;
    return rw_apply(n, err);
}

/* Any byte range and any buffer: the file's own path aligns and bounces
 * for it (an offset need not be a multiple of the file's alignment). */
static void rw_refresh_limits(bi_node *n)
{
    const struct bi_limits *fl = &n->file->limits;
    bi_limits_any_buffer(&n->limits, fl->max_transfer);
    n->limits.opt_mem_alignment = fl->opt_mem_alignment;
    n->limits.max_iov = fl->max_iov;
    n->limits.opt_transfer = fl->opt_transfer;
}

/* QEMU's raw_adjust_offset: *off moved into the file, or -EINVAL (reads)
 * / -ENOSPC (writes) for a request leaving a fixed-size window. */
static int rw_adjust(bi_node *n, uint64_t *off, uint64_t len, bool write)
{
    struct rw_state *s = n->opaque;
    if (s->has_size && (*off > s->size || len > s->size - *off))
        return write ? -ENOSPC : -EINVAL;
    if (*off > INT64_MAX - s->offset)
        return -EINVAL;
    *off += s->offset;
    return 0;
}

static int rw_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                        const struct iovec *iov, int iovcnt)
{
    int ret = rw_adjust(n, &off, len, false);
    return ret ? ret : bi_co_preadv(n->file, off, len, iov, iovcnt);
}

static int rw_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                         const struct iovec *iov, int iovcnt, int flags)
{
    int ret = rw_adjust(n, &off, len, true);
    if (ret == 0)
        ret = bi_co_pwritev(n->file, off, len, iov, iovcnt, flags);
    rw_update_size(n);
    return ret;
}

static int rw_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                               int flags)
{
    int ret = rw_adjust(n, &off, len, true);
    if (ret == 0)
        ret = bi_co_pwrite_zeroes(n->file, off, len, flags);
    rw_update_size(n);
    return ret;
}

static int rw_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    int ret = rw_adjust(n, &off, len, true);
    return ret ? ret : bi_co_pdiscard(n->file, off, len);
}

/* The file's status at the shifted offset, cut at the window's end; the
 * offset it reports is the file's (qemu-img map shows it so). */
static int rw_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                              struct bi_status *st)
{
    struct rw_state *s = n->opaque;
    uint64_t foff = off;
    if (s->has_size) {
        if (off >= n->size) {
            memset(st, 0, sizeof(*st));
            st->len = len;
            st->flags = BI_BS_ZERO | BI_BS_EOF;
            return 0;
        }
        len = BI_MIN(len, n->size - off);
    }
    int ret = rw_adjust(n, &foff, len, false);
    if (ret == 0)
        ret = bi_co_block_status(n->file, foff, len, st);
    if (ret < 0)
        return ret;
    if (s->has_size) {
        st->len = BI_MIN(st->len, len);
        st->flags &= ~(unsigned)BI_BS_EOF;
        if (off + st->len >= n->size)
            st->flags |= BI_BS_EOF;
    }
    return 0;
}

/* QEMU's raw_co_truncate: a fixed-size window cannot be resized. */
static int rw_co_truncate(bi_node *n, uint64_t size, bool exact,
                          enum bi_prealloc prealloc, bi_error *err)
{
    struct rw_state *s = n->opaque;
    if (s->has_size) {
        bi_error_set(err, 0, "Cannot resize fixed-size raw disks");
        return -ENOTSUP;
    }
    if (size > INT64_MAX - s->offset) {
        bi_error_set(err, 0, "Disk size too large for the chosen offset");
        return -EINVAL;
    }
    const struct bi_driver *d = n->file->drv;
    if (!d->co_truncate) {
        bi_error_set(err, 0, "Image format driver does not support resize");
        return -ENOTSUP;
    }
    int ret = d->co_truncate(n->file, size + s->offset, exact, prealloc, err);
    rw_update_size(n);
    return ret;
}

static int rw_storage_info(bi_node *n, struct bi_storage_info *out)
{
    return bi_storage_info(n->file, out);
}

static const struct bi_driver raw_window_drv = {
    .name = "raw",
    .is_protocol = true,
    .state_size = sizeof(struct rw_state),
    .open = rw_open,
    .refresh_limits = rw_refresh_limits,
    .co_preadv = rw_co_preadv,
    .co_pwritev = rw_co_pwritev,
    .co_pwrite_zeroes = rw_co_pwrite_zeroes,
    .co_pdiscard = rw_co_pdiscard,
    .co_truncate = rw_co_truncate,
    .co_block_status = rw_co_block_status,
    .get_allocated_file_size = bi_filter_allocated_size,
    .storage_info = rw_storage_info,
    .set_perm = bi_filter_set_perm,
};

/* An option's value in the node's name: a number where it is all digits
 * (a json: name's integer), else the string given ("1M"). */
static bi_value *name_value(const char *v)
{
    uint64_t x;
    bool digits = v[0] && strspn(v, "0123456789") == strlen(v);
    return digits && bi_parse_size(v, &x) == 0 ? bi_value_uint(x)
                                               : bi_value_string(v);
}

/* The raw node's name as QEMU builds it, owned by the caller. */
static bi_value *window_name(const bi_node *child,
                             const struct raw_window_opts *wo)
{
    bi_value *v = bi_value_object();
    if (wo->offset)
        bi_value_set(v, "offset", name_value(wo->offset));
    bi_value_set_string(v, "driver", "raw");
    if (wo->size)
        bi_value_set(v, "size", name_value(wo->size));
    bi_value *f;
    if (child->name_opts) {
        f = bi_value_copy(child->name_opts);
    } else {
        f = bi_value_object();
        bi_value_set_string(f, "driver", child->drv->name);
        bi_value_set_string(f, "filename", child->filename);
    }
    bi_value_set(v, "file", f);
    return v;
}

bi_node *raw_window_open(bi_node *child, const struct raw_window_opts *wo,
                         const struct bi_open_opts *o, bi_error *err)
{
    char *keys[3] = {NULL, NULL, NULL};
    int k = 0;
    if (wo->offset)
        keys[k++] = bi_xasprintf("offset=%s", wo->offset);
    if (wo->size)
        keys[k++] = bi_xasprintf("size=%s", wo->size);
    struct bi_open_opts wopts = *o;
    wopts.protocol_opts = (const char *const *)keys;
    bi_value *name = window_name(child, wo);
    char *fname = bi_json_name(name);
    bi_node *n =
        bi_open_filter_over(&raw_window_drv, child, fname, &wopts, err);
    if (n)
        n->name_opts = name;
    else
        bi_value_free(name);
    free(fname);
    for (int i = 0; i < k; i++)
        free(keys[i]);
    return n;
}
