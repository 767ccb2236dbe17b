/* SPDX-License-Identifier: MIT */
/*
 * libblkimg: image consistency check (qemu-img check) and qcow2 internal
 * snapshots (qemu-img snapshot).
 */
#ifndef BLKIMG_QCOW2_H
#define BLKIMG_QCOW2_H

#include "blkimg/blkimg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What `check` found, with qemu-img's fields and meaning. */
struct bi_check_result {
    int corruptions;
    int leaks;
    int check_errors;
    int corruptions_fixed;
    int leaks_fixed;
    int64_t image_end_offset; /* 0 if unknown */
    /* qemu's BlockFragInfo: guest clusters */
    uint64_t total_clusters;
    uint64_t allocated_clusters;
    uint64_t fragmented_clusters;
    uint64_t compressed_clusters;
    bool has_frag_info; /* the fields above are valid */
};

enum bi_check_fix {
    BI_CHECK_FIX_LEAKS = 1 << 0,
    BI_CHECK_FIX_ERRORS = 1 << 1,
    BI_CHECK_FIX_ALL = BI_CHECK_FIX_LEAKS | BI_CHECK_FIX_ERRORS,
};

/* Checks (and with fix, repairs) the image of node, which must have been
 * opened read-write to fix. Messages about individual problems go to
 * stderr in qemu-img's words. Returns 0 when the check ran (whatever it
 * found; see result), -ENOTSUP if the format has no check, or another
 * negative errno if the check itself failed (err set). */
BI_EXPORT int bi_check(bi_node *node, int fix, struct bi_check_result *result,
                       bi_error *err);

/* Internal snapshots (qcow2). */
struct bi_snapshot_info; /* blkimg.h */
/* Lists the snapshots: *out is malloc'd (free() it), *count entries. */
BI_EXPORT int bi_snapshot_list(bi_node *node, struct bi_snapshot_info **out,
                               int *count, bi_error *err);
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

/* Persistent dirty bitmaps (qcow2 v3; qemu-img bitmap). Each call is
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

/* The image can hold persistent bitmaps (qcow2 v3). */
BI_EXPORT bool bi_bitmap_supported(bi_node *node);
/* The persistent bitmaps in directory order (qcow2; else -ENOTSUP). */
struct bi_bitmap_info {
    char *name;
    uint64_t granularity;
    bool enabled; /* tracks guest writes ("auto") */
    bool in_use;  /* inconsistent: not saved after use */
};
BI_EXPORT int bi_bitmap_list(bi_node *node, struct bi_bitmap_info **out,
                             int *count);
BI_EXPORT void bi_bitmap_list_free(struct bi_bitmap_info *v, int count);

#ifdef __cplusplus
}
#endif
#endif
