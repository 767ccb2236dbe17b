/* SPDX-License-Identifier: MIT */
/*
 * libblkimg: image consistency check (qemu-img check). Snapshots and
 * bitmaps moved to blkimg/image_ops.h (included here for old users).
 */
#ifndef BLKIMG_QCOW2_H
#define BLKIMG_QCOW2_H

#include "blkimg/blkimg.h"
#include "blkimg/image_ops.h"

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
 * opened read-write to fix. Messages about individual problems go to the
 * message handler (BI_MESSAGE_CHECK) in qemu-img's words. Returns 0 when
 * the check ran (whatever it found; see result), -ENOTSUP if the format
 * has no check, or another negative errno if the check itself failed (err
 * set). */
BI_EXPORT int bi_check_sized(bi_node *node, int fix,
                             struct bi_check_result *result, size_t size,
                             bi_error *err);
#define bi_check(node, fix, result, err)                                       \
    bi_check_sized((node), (fix), (result), sizeof(*(result)), (err))

#ifdef __cplusplus
}
#endif
#endif
