/* SPDX-License-Identifier: MIT */
/*
 * libblkimg image operations behind `blkimg rebase`, `commit`, `amend`,
 * `snapshot` and `bitmap`: changing the backing file recorded in an image,
 * emptying an image (every cluster unallocated, as QEMU's make_empty),
 * amending format options, internal snapshots and persistent dirty bitmaps.
 * Each reaches the format through its driver; formats without the
 * operation refuse it with QEMU's words.
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

/* Internal snapshots (qemu-img snapshot; formats that have them). */
struct bi_snapshot_info; /* blkimg.h */
/* Lists the snapshots: *out is a malloc'd array of *count malloc'd
 * entries; bi_snapshot_list_free releases it. */
BI_EXPORT int bi_snapshot_list(bi_node *node, struct bi_snapshot_info ***out,
                               int *count, bi_error *err);
BI_EXPORT void bi_snapshot_list_free(struct bi_snapshot_info **v, int count);
/* Creates a snapshot of the current state named name (the id is the next
 * free number). The node must be open read-write. */
BI_EXPORT int bi_snapshot_create(bi_node *node, const char *name,
                                 bi_error *err);
/* Reverts the image to the snapshot with that id or name. */
BI_EXPORT int bi_snapshot_apply(bi_node *node, const char *name_or_id,
                                bi_error *err);
/* Makes a read-only image read the snapshot with that id and/or name (one
 * may be NULL) until it is closed (qemu-img convert -l). */
BI_EXPORT int bi_snapshot_load_tmp(bi_node *node, const char *id,
                                   const char *name, bi_error *err);
/* Deletes the snapshot with that id or name. */
BI_EXPORT int bi_snapshot_delete(bi_node *node, const char *name_or_id,
                                 bi_error *err);

/* Persistent dirty bitmaps (qemu-img bitmap; formats that have them, such
 * as qcow2 v3). Each call is
 * one crash-safe update of the image (node open read-write); errors carry
 * QEMU's text for the action. Errors that name a bitmap (the message may
 * be cut for long names) have their own code: -ENOENT bitmap name not
 * found, -ENXIO merge source not found, -EEXIST name exists, -ENAMETOOLONG
 * name over 1023 bytes, -EBUSY bitmap name in use (inconsistent), -ESTALE
 * merge source in use. */
/* Adds an empty bitmap; granularity 0: the default (cluster size, within
 * 4 KiB..64 KiB); disabled: not tracking guest writes. */
BI_EXPORT int bi_bitmap_add(bi_node *node, const char *name,
                            uint64_t granularity, bool disabled, bi_error *err);
BI_EXPORT int bi_bitmap_remove(bi_node *node, const char *name, bi_error *err);
BI_EXPORT int bi_bitmap_clear(bi_node *node, const char *name, bi_error *err);
/* Enables (enable) or disables the bitmap. */
BI_EXPORT int bi_bitmap_enable(bi_node *node, const char *name, bool enable,
                               bi_error *err);
/* Sets in bitmap name every bit set in bitmap src_name of src (NULL: the
 * same node; any granularity; same image size). */
BI_EXPORT int bi_bitmap_merge(bi_node *node, const char *name, bi_node *src,
                              const char *src_name, bi_error *err);

/* The image can hold persistent bitmaps. */
BI_EXPORT bool bi_bitmap_supported(bi_node *node);
/* The persistent bitmaps in directory order (-ENOTSUP for formats
 * without bitmaps). */
struct bi_bitmap_info {
    char *name;
    uint64_t granularity;
    bool enabled; /* tracks guest writes ("auto") */
    bool in_use;  /* inconsistent: not saved after use */
};
/* *out is a malloc'd array of *count malloc'd entries;
 * bi_bitmap_list_free releases it. */
BI_EXPORT int bi_bitmap_list(bi_node *node, struct bi_bitmap_info ***out,
                             int *count);
BI_EXPORT void bi_bitmap_list_free(struct bi_bitmap_info **v, int count);

#ifdef __cplusplus
}
#endif
#endif
