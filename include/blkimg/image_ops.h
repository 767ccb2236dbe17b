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

/* Amends format options ("key=value", NULL-terminated, in order) of n,
 * opened read-write. err receives qemu-img's message on failure;
 * -ENOTSUP for formats without amend support. */
BI_EXPORT int bi_amend(bi_node *n, const char *const *options, bool force,
                       bi_error *err);

#ifdef __cplusplus
}
#endif
#endif
