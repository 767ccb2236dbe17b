/* SPDX-License-Identifier: MIT */
/*
 * The POSIX file protocol driver ("file"): private interfaces shared by
 * file.c, file_limits.c and file_lock.c, plus the two calls the block layer
 * may make on a file node (image locking permissions).
 */
#ifndef BI_PROTOCOL_FILE_H
#define BI_PROTOCOL_FILE_H

#include "block/block.h"
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* Hints applied to a new image file before its driver creates it
 * (src/lib/protocol/file_hints.c). */
struct bi_file_create_hints {
    bool nocow;
    uint64_t extent_size_hint; /* bytes; 0 = none */
};
int bi_file_apply_create_hints(const char *filename,
                               const struct bi_file_create_hints *h);

/* ------------------------------------------------------------- limits */

/*
 * What each source of direct-I/O alignment said about one open file. The
 * detection (file_limits.c) gathers these; bi_file_limits_compute() turns
 * them into limits without touching the system, so that every rule is unit
 * tested. A value of 0 means "that source said nothing".
 */
struct bi_file_limit_facts {
    bool direct;      /* opened with O_DIRECT */
    bool is_blockdev; /* S_ISBLK */
    uint32_t page_size;

    /* statx(STATX_DIOALIGN) */
    uint32_t statx_offset_align;
    uint32_t statx_mem_align;
    /* BLKSSZGET (block devices): logical sector size */
    uint32_t blkssz;
    /* /sys/.../queue/dma_alignment + 1 (block devices) */
    uint32_t dma_align;
    /* XFS_IOC_DIOINFO: d_miniosz (d_mem is not trusted) */
    uint32_t xfs_miniosz;
    /* The filesystem passes O_DIRECT through without alignment rules
     * (NFS: requests go over the wire from any buffer). */
    bool byte_aligned_fs;

    /* O_DIRECT read probes at offset 0 into a page-aligned buffer.
     * probed: the probes ran. probe_request: smallest request length of
     * 1, 512, 1024, 2048, 4096 that was accepted (1 = accepted any size:
     * a hole or no alignment rule, which tells nothing); 0 = none was
     * accepted. probe_mem likewise for buffer offsets 1..4096. */
    bool probed;
    uint32_t probe_request;
    uint32_t probe_mem;

    uint64_t max_transfer; /* bytes, 0 = no limit */
    uint32_t max_iov;
};

/* Largest block size a probe or the first-block write tries. */
#define BI_FILE_MAX_PROBE 4096u

/* Fills *out from the facts. When nothing but probes could answer and
 * facts->probed is false, the affected source fields are BI_SRC_NONE (the
 * caller probes, then computes again); with probed set, an answerless
 * detection falls back to max(4096, page size), never to 1. */
void bi_file_limits_compute(const struct bi_file_limit_facts *f,
                            struct bi_limits *out);

/* Gathers the facts for fd (opened with or without O_DIRECT) and computes
 * the limits. Probes only when the kernel stated nothing. */
void bi_file_limits_detect(int fd, bool direct, const struct stat *st,
                           struct bi_limits *out,
                           struct bi_file_limit_facts *facts);

/* The largest power of two <= min(size, max(BI_FILE_MAX_PROBE, align)) that
 * is a multiple of align (align = request alignment, 1 for buffered), or 0
 * when no such write fits in size. The size of the first-block write. */
uint64_t bi_file_first_block_size(uint64_t size, uint32_t align);

/* statfs f_type -> "ext4", "xfs", ... ("unknown" if not known). */
const char *bi_file_fs_name(long f_type);

/* ------------------------------------------------------------ locking */

struct bi_file_lock {
    unsigned perm;            /* current permissions */
    unsigned shared;          /* current shared permissions */
    unsigned locked_perm;     /* bits whose 100+i byte we hold */
    unsigned locked_unshared; /* bits whose 200+i byte we hold */
};

/* Changes the permissions held on fd from lk->perm/lk->shared to
 * perm/shared: takes the new bytes, checks that no other opener conflicts,
 * then drops the bytes no longer needed. On conflict nothing changes and
 * err gets QEMU's two lines ("Failed to get \"write\" lock" +
 * "Is another process using the image [name]?"). Returns 0 or -errno. */
int bi_file_lock_set(int fd, struct bi_file_lock *lk, unsigned perm,
                     unsigned shared, const char *name, bi_error *err);
/* Drops every lock byte held. */
void bi_file_lock_release(int fd, struct bi_file_lock *lk);
/* "consistent read", "write", ... for one bit. */
const char *bi_file_perm_name(unsigned bit);

#endif
