/* SPDX-License-Identifier: MIT */
/*
 * libblkimg image operations behind `blkimg rebase`, `commit` and `amend`:
 * changing the backing file recorded in an image, emptying an image (every
 * cluster unallocated, as QEMU's make_empty) and amending format options.
 */
#ifndef BLKIMG_IMAGE_OPS_H
#define BLKIMG_IMAGE_OPS_H

#include "blkimg/blkimg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records backing_file (NULL: none) and backing_fmt (NULL: none) in the
 * image header of n (opened read-write). As QEMU's
 * bdrv_change_backing_file(): a format without a backing file is -EINVAL,
 * with require a backing file without format is -EINVAL, formats that have
 * no backing files give -ENOTSUP, a header without room -ENOSPC. The
 * backing node that is open stays as it is. */
BI_EXPORT int bi_change_backing_file(bi_node *n, const char *backing_file,
                                     const char *backing_fmt, bool require,
                                     bi_error *err);

/* Makes every cluster of n unallocated (reads go to the backing file),
 * freeing the clusters. -ENOTSUP for formats that cannot. */
BI_EXPORT int bi_make_empty(bi_node *n, bi_error *err);

/* Reopens n, a backing node of an open image (its parent's backing file),
 * read-write in place, as QEMU's commit reopens its base: n is closed and
 * the returned node, which takes its place in the chain, is opened with
 * the same format and cache mode (and its own backing chain). On failure
 * NULL, with n reopened read-only in place (*restored set to the node, or
 * NULL if even that failed). */
BI_EXPORT bi_node *bi_reopen_backing_rw(bi_node *n, bi_node **restored,
                                        bi_error *err);

/* Progress of an amendment: offset out of total units of work done.
 * Called once with total == 0 when the options are accepted, before
 * anything changes (qemu-img prints 0% there). */
typedef void bi_amend_status_cb(void *opaque, int64_t offset, int64_t total);

/* Amends format options ("key=value", NULL-terminated, in order) of n,
 * opened read-write, as qemu-img amend: unknown keys, bad values and
 * impossible changes fail with qemu's message in err (may span two lines).
 * cb (may be NULL) reports progress. -ENOTSUP with "Format driver 'x' does
 * not support option amendment" for formats without amend support. */
BI_EXPORT int bi_amend(bi_node *n, const char *const *options, bool force,
                       bi_amend_status_cb *cb, void *opaque, bi_error *err);

#ifdef __cplusplus
}
#endif
#endif
