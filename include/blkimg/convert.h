/* SPDX-License-Identifier: MIT */
/*
 * libblkimg copy engine: the machinery behind `blkimg convert` (and dd,
 * rebase, commit), and image size measurement.
 *
 * The engine copies the concatenation of one or more source nodes into a
 * target node with many requests in flight (or, for commit and rebase, the
 * ranges of one image's view those operations copy; see bi_copy_mode). It never
 * reads what block status reports as zero or unallocated, skips zero ranges
 * when the target already reads as zeroes, writes zeroes efficiently otherwise,
 * detects runs of zeroes in data (sparse output), can compress through the
 * target driver and can offload the copy with copy_file_range. Progress
 * reaches the caller through a callback (the tools print it).
 */
#ifndef BLKIMG_CONVERT_H
#define BLKIMG_CONVERT_H

#include "blkimg/blkimg.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Progress callback: done and total are the bytes the copy has to move
 * (allocated bytes); the qemu-img percentage is 100.0 * done / total. */
typedef void bi_convert_progress_cb(void *opaque, uint64_t done,
                                    uint64_t total);

/* What the engine copies (bi_convert_opts.mode). */
enum bi_copy_mode {
    /* convert: every byte of the concatenated sources */
    BI_COPY_CONVERT = 0,
    /* qemu-img commit (QEMU's commit job): src[0] is the top image, dst a
     * node of its backing chain opened read-write (the base, grown to the
     * top's size beforehand). Wherever anything above dst is allocated
     * (rounded out to copy_granularity), the top's view is written into
     * dst: data as read, zeroes as zero writes that may unmap. */
    BI_COPY_COMMIT,
    /* safe qemu-img rebase: src[0] is the image, which is also the target
     * (dst == src[0]). Where the image is unallocated (and, with
     * rebase_prefix, something between its backing file and the prefix is
     * allocated), the ranges where its current backing view (old_backing;
     * NULL: zeroes) reads differently from new_backing (NULL: zeroes) get
     * the old view written into the image, in qemu-img's 2 MiB steps. */
    BI_COPY_REBASE,
};

/* BI_COPY_REBASE progress: called once per qemu-img step that compared
 * data, in image order (qemu-img prints one progress step each). */
typedef void bi_copy_step_cb(void *opaque);

struct bi_convert_opts {
    size_t struct_size;  /* sizeof(struct bi_convert_opts): the _init macro */
    bi_node *const *src; /* sources, concatenated in order */
    int n_src;
    bi_node *dst;
    /* Target reads as zeroes everywhere (freshly created, or the user said
     * --target-is-zero): zero ranges are skipped. */
    bool target_is_zero;
    /* -B: the target has a backing file equal to each source's backing
     * file: what is unallocated above the sources' backing stays
     * unallocated in the target. */
    bool target_has_backing;
    /* Size of the target's backing file when target_has_backing (beyond it,
     * unallocated reads as zeroes anyway); -1 if unknown. */
    int64_t target_backing_size;
    bool compress;       /* -c: write compressed clusters */
    uint64_t min_sparse; /* -S in bytes; 0 = write every byte */
    int num_coroutines;  /* -m (1..16) */
    bool out_of_order;   /* -W */
    bool copy_range;     /* -C: copy_file_range where possible */
    uint64_t buf_size;   /* bytes per request; 0 = 2 MiB */
    uint64_t rate_limit; /* -r: data bytes per second; 0 = unlimited */
    bool flush;          /* flush the target at the end */
    bi_convert_progress_cb *progress; /* may be NULL */
    void *progress_opaque;
    /* If non-NULL and set non-zero (e.g. by a signal handler), the copy
     * stops as soon as the requests in flight finish: -ECANCELED. */
    volatile sig_atomic_t *cancel;

    enum bi_copy_mode mode;
    /* BI_COPY_COMMIT: the dirty granularity (QEMU: the base's cluster
     * size within [4 KiB, 64 KiB], 64 KiB without one); 0 = that. */
    uint64_t copy_granularity;
    /* BI_COPY_REBASE */
    bi_node *old_backing, *new_backing, *rebase_prefix;
    bi_copy_step_cb *step;
    void *step_opaque;
};

/* Sets the defaults and o->struct_size (use the macro). */
BI_EXPORT void bi_convert_opts_init_sized(struct bi_convert_opts *o,
                                          size_t size);
#define bi_convert_opts_init(o) bi_convert_opts_init_sized((o), sizeof(*(o)))

/* Runs the copy. On failure err gets one line such as "error while
 * writing at byte 1048576: No space left on device". */
BI_EXPORT int bi_convert(const struct bi_convert_opts *o, bi_error *err);

/* ----------------------------------------------------------- measure */

struct bi_measure {
    uint64_t required;
    uint64_t fully_allocated;
    bool has_bitmaps;
    uint64_t bitmaps;
};
/* Sizes a new image of format with creation options (-o,
 * NULL-terminated "key=value") would need: for the contents of src if
 * non-NULL, else for an empty image of the size in the options. */
BI_EXPORT int bi_measure_sized(const char *format, const char *const *options,
                               bi_node *src, struct bi_measure *out,
                               size_t size, bi_error *err);
#define bi_measure(format, options, src, out, err)                             \
    bi_measure_sized((format), (options), (src), (out), sizeof(*(out)), (err))

#ifdef __cplusplus
}
#endif
#endif
