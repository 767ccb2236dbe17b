/* SPDX-License-Identifier: MIT */
/*
 * vpc format driver (Microsoft Virtual PC / Hyper-V / Azure VHD): state
 * shared by the driver's files.
 *
 * Files: vpc.c (footer, dynamic disk header, BAT, QEMU 7.2's size rules,
 * open, info, the driver table), vpc_map.c (mapping, block status,
 * allocating writes), vpc_create.c (CHS geometry, image creation and its
 * option table).
 *
 * Layout (big-endian): a 512-byte footer at the end of the file; dynamic
 * and differencing disks also keep a copy at offset 0, followed by the
 * 1024-byte dynamic disk header ("cxsparse") that locates the BAT, one
 * 32-bit entry per block: the block's sector (its bitmap comes first, then
 * block_size bytes of data), 0xffffffff for a block never written.
 *
 * Locking: requests run in coroutines of one thread. A new block is
 * reserved without yielding (blocks are laid out in request order);
 * s->lock serialises the writes near the end of the file (the footer, a
 * new block's bitmap) and the BAT updates; data I/O runs without it.
 */
#ifndef BI_VPC_H
#define BI_VPC_H

#include "block/block.h"
#include "util/coroutine.h"
#include <stdbool.h>
#include <stdint.h>

struct vpc_alloc; /* vpc_map.c */

#define VHD_SECTOR 512
#define VHD_FOOTER_SIZE 512
#define VHD_DYN_HEADER_SIZE 1024
#define VHD_BAT_UNUSED 0xffffffffU

enum vhd_type { VHD_FIXED = 2, VHD_DYNAMIC = 3, VHD_DIFFERENCING = 4 };

/* Footer field offsets */
#define VF_COOKIE 0
#define VF_FEATURES 8
#define VF_VERSION 12
#define VF_DATA_OFFSET 16
#define VF_TIMESTAMP 24
#define VF_CREATOR_APP 28
#define VF_CREATOR_VER 32
#define VF_CREATOR_OS 36
#define VF_ORIG_SIZE 40
#define VF_CUR_SIZE 48
#define VF_CYLS 56
#define VF_HEADS 58
#define VF_SPT 59
#define VF_TYPE 60
#define VF_CHECKSUM 64
#define VF_UUID 68

/* Dynamic disk header field offsets */
#define VD_COOKIE 0
#define VD_DATA_OFFSET 8
#define VD_TABLE_OFFSET 16
#define VD_VERSION 24
#define VD_MAX_ENTRIES 28
#define VD_BLOCK_SIZE 32
#define VD_CHECKSUM 36

/* CHS limits and QEMU's size limit (2040 GiB) */
#define VHD_CHS_MAX_C 65535ULL
#define VHD_CHS_MAX_H 16ULL
#define VHD_CHS_MAX_S 255ULL
#define VHD_MAX_GEOMETRY (VHD_CHS_MAX_C * VHD_CHS_MAX_H * VHD_CHS_MAX_S)
#define VHD_MAX_SECTORS 0xff000000ULL

/* Seconds from the Unix epoch to 2000-01-01 00:00:00 UTC */
#define VHD_TIMESTAMP_BASE 946684800

typedef struct vpc_state {
    uint8_t footer[VHD_FOOTER_SIZE]; /* as read (and as rewritten) */
    bool fixed;         /* the footer's type says fixed: data at offset X */
    uint64_t fixed_end; /* fixed: where the trailing footer starts */
    /* Dynamic disks */
    uint32_t block_size;
    uint32_t bitmap_size;
    uint32_t max_table_entries;
    uint32_t *bat; /* host byte order */
    uint64_t bat_offset;
    uint64_t header_offset;    /* the dynamic disk header */
    uint64_t free_offset;      /* where the next block goes (the end footer) */
    uint64_t file_len;         /* bytes of the file as far as we know */
    uint8_t *bitmap_set;       /* per block: its bitmap was set by us */
    uint8_t *ones;             /* bitmap_size bytes of 0xff, aligned */
    struct vpc_alloc *pending; /* blocks reserved, not yet mapped */
    bi_co_mutex lock;
} vpc_state;

/* The footer checksum: the one's complement of the byte sum with the
 * checksum field counted as zero. */
uint32_t vpc_checksum(const uint8_t *buf, size_t len, size_t skip_off);

/* vpc_map.c */
int vpc_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
               struct bi_extent *ext);
int vpc_co_write_done(bi_node *n, struct bi_extent *ext, int ret);
int vpc_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                        struct bi_status *st);
/* Frees the reservations no write came to use (close). */
void vpc_free_pending(vpc_state *s);

/* vpc_create.c */
/* QEMU's geometry search for a new image of size bytes (a multiple of
 * 512): the CHS triple and the sectors the image will have. Returns 0 or
 * -EFBIG (beyond 2040 GiB). */
int vpc_rounded_size(uint64_t size, bool force_size, uint16_t *cyls,
                     uint8_t *heads, uint8_t *spt, uint64_t *sectors);
int vpc_create(const char *filename, const struct bi_create_opts *o,
               bi_error *err);
extern const struct bi_opt_desc vpc_create_opts[];

#endif
