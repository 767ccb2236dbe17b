/* SPDX-License-Identifier: MIT */
/*
 * vmdk: VMware's virtual disk format as QEMU 7.2 reads and writes it.
 *
 * An image is a list of extents laid end to end in the guest's address
 * space. A hosted sparse extent (magic "KDMV", VMDK 4: monolithicSparse,
 * streamOptimized, the pieces of twoGbMaxExtentSparse) maps grains through
 * a grain directory (GD) of grain tables (GT) of 32-bit sector numbers; a
 * VMDK 3 ("COWD") sparse extent does the same with its own header; a flat
 * extent is a window of a raw file. The descriptor (text) names the
 * extents: embedded in a monolithic sparse file at sector 1, or a file of
 * its own whose extents are separate files.
 *
 * vmdk.c: probe, header and descriptor parsing, open/close, info, the
 * table. vmdk_map.c: mapping, block status, compressed grains, allocating
 * writes. vmdk_create.c: creation and its options.
 */
#ifndef BI_FORMAT_VMDK_H
#define BI_FORMAT_VMDK_H

#include "blkimg/qcow2.h"
#include "block/block.h"
#include <stdbool.h>
#include <stdint.h>

#define VMDK_SECTOR 512ULL
#define VMDK4_MAGIC_BE 0x4b444d56u /* "KDMV" */
#define VMDK3_MAGIC_BE 0x434f5744u /* "COWD" */
#define VMDK4_FLAG_NL_DETECT (1u << 0)
#define VMDK4_FLAG_RGD (1u << 1)
#define VMDK4_FLAG_ZERO_GRAIN (1u << 2)
#define VMDK4_FLAG_COMPRESS (1u << 16)
#define VMDK4_FLAG_MARKER (1u << 17)
#define VMDK4_GD_AT_END UINT64_MAX
#define VMDK_GTE_ZEROED 1u
/* QEMU's limits: grains of at most 1 GiB, at most 32 Mi GD entries, 512
 * entries a VMDK 4 grain table; grains are allocated below 2 TiB. */
#define VMDK_MAX_GRAIN_SECTORS 0x200000ULL
#define VMDK_MAX_GD_ENTRIES (32u * 1024 * 1024)
#define VMDK_MAX_EXTENT_SECTORS (1ULL << 32)
/* QEMU reads the descriptor's CIDs from the first 20 sectors. */
#define VMDK_DESC_SIZE (20 * 512)
#define VMDK_GT_CACHE 16

struct vmdk_gt_slot {
    uint32_t sector; /* where the table lives (0: slot empty) */
    uint64_t used;   /* LRU stamp */
    uint32_t *gt;    /* gt_entries entries, host order */
};

struct vmdk_extent {
    bi_node *file; /* n->file, or a child opened for a descriptor's extent */
    bool own_file; /* file is ours to flush and close */
    bool flat;
    bool compressed; /* deflate grains (streamOptimized) */
    bool has_marker; /* grains start with a 12-byte marker */
    bool zero_grain; /* GTE 1 reads as zeroes */
    int version;
    char type[16];        /* the descriptor's word (FLAT, SPARSE, ...); "" */
    uint64_t start, len;  /* guest bytes */
    uint64_t flat_offset; /* flat: bytes into file */
    uint64_t grain;       /* sparse: grain bytes */
    uint32_t gt_entries;
    uint32_t gd_entries;
    uint32_t *gd;  /* sector of each grain table (0: none) */
    uint32_t *rgd; /* the redundant GD, read only for writable images */
    uint64_t file_size;
    uint64_t data_start; /* bytes: first sector grains may use */
    uint64_t next_grain; /* bytes: where the next grain goes */
    struct vmdk_gt_slot cache[VMDK_GT_CACHE];
    uint64_t cache_clock;
};

typedef struct vmdk_state {
    bi_node *node;
    bi_co_mutex lock;
    struct vmdk_extent *ext;
    int n_ext;
    char create_type[128];
    uint32_t cid, parent_cid;
    bool cid_checked, cid_updated;
    uint64_t desc_offset; /* in n->file: where the descriptor text is */
    /* Compressed writes compress on worker threads, then append their
     * grains in the order they were called (tickets): the layout of a
     * stream does not depend on which compression finished first. */
    uint64_t comp_next, comp_turn;
    bi_co_queue comp_wait;
} vmdk_state;

/* vmdk_map.c */
/* The extent holding guest offset off, or NULL. */
struct vmdk_extent *vmdk_find_extent(vmdk_state *s, uint64_t off);
/* The grain table entry of the grain holding extent-relative offset rel
 * of sparse extent e (*no_gt: its table is missing, *gte 0). -EIO past
 * the directory, or a read error. In a coroutine, s->lock held. */
int vmdk_gte(struct vmdk_extent *e, uint64_t rel, uint32_t *gte, bool *no_gt);
int vmdk_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                struct bi_extent *ext);
int vmdk_co_write_done(bi_node *n, struct bi_extent *ext, int ret);
int vmdk_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                         struct bi_status *st);
int vmdk_co_read_compressed(bi_node *n, const struct bi_extent *ext,
                            uint64_t off, uint64_t len, const struct iovec *iov,
                            int iovcnt);
int vmdk_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                              uint64_t len);
int vmdk_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags);
void vmdk_gt_cache_free(struct vmdk_extent *e);

/* vmdk.c */
/* A random CID (QEMU's g_random_int). */
uint32_t vmdk_random_cid(void);
/* Writes a new random CID into the descriptor (first write after open). */
int vmdk_update_cid(bi_node *n);

/* vmdk_check.c */
int vmdk_check(bi_node *n, struct bi_check_result *res, int fix, bi_error *err);

/* vmdk_create.c */
extern const struct bi_opt_desc vmdk_create_opts[];
int vmdk_create(const char *filename, const struct bi_create_opts *o,
                bi_error *err);

#endif
