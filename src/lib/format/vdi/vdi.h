/* SPDX-License-Identifier: MIT */
/*
 * vdi (VirtualBox Disk Image), as QEMU 7.2 reads and writes it.
 *
 * Layout: a 512-byte header (64 bytes of free text, then the signature
 * 0xbeda107f and the version 1.1 fields, all little-endian), the block
 * map (one 32-bit entry per 1 MiB guest block: the index of its host
 * block in the data area, or UNALLOCATED / DISCARDED, both read as
 * zeroes) and the data area, host block i at offset_data + i MiB. A new
 * block is appended at index blocks_allocated.
 *
 *   vdi.c         header parsing and validation, open, info, block status,
 *                 the driver table
 *   vdi_map.c     mapping, allocating writes and their commit
 *   vdi_create.c  creation and its option table
 *   vdi_check.c   check (QEMU's: map entries out of range, duplicates,
 *                 the allocated count)
 */
#ifndef BI_FORMAT_VDI_H
#define BI_FORMAT_VDI_H

#include "block/block.h"
#include "util/coroutine.h"

#include <stdbool.h>
#include <stdint.h>

enum {
    VDI_HEADER_SIZE = 512, /* the header sector as QEMU reads and writes it */
    VDI_SECTOR = 512,
    VDI_BLOCK = 1 << 20, /* the only block size QEMU opens and creates */
};

#define VDI_SIGNATURE 0xbeda107fu
#define VDI_VERSION_1_1 0x00010001u
#define VDI_TYPE_DYNAMIC 1u
#define VDI_TYPE_STATIC 2u
/* Map entries: never written (arbitrary content, read as zeroes by QEMU)
 * and discarded (zeroes). Anything below is a host block index. */
#define VDI_UNALLOCATED 0xffffffffu
#define VDI_DISCARDED 0xfffffffeu
/* QEMU's limit: the map, rounded up to a sector, fits in INT_MAX bytes. */
#define VDI_BLOCKS_MAX ((uint32_t)((0x80000000u - VDI_SECTOR) / 4))
#define VDI_DISK_SIZE_MAX ((uint64_t)VDI_BLOCKS_MAX * VDI_BLOCK)

/* Byte offsets of the header fields QEMU uses. */
enum {
    VH_SIGNATURE = 0x40,
    VH_VERSION = 0x44,
    VH_HEADER_SIZE = 0x48,
    VH_IMAGE_TYPE = 0x4c,
    VH_OFFSET_BMAP = 0x154,
    VH_OFFSET_DATA = 0x158,
    VH_SECTOR_SIZE = 0x168,
    VH_DISK_SIZE = 0x170,
    VH_BLOCK_SIZE = 0x178,
    VH_BLOCKS = 0x180,
    VH_ALLOCATED = 0x184,
    VH_UUID_IMAGE = 0x188,
    VH_UUID_SNAP = 0x198,
    VH_UUID_LINK = 0x1a8,
    VH_UUID_PARENT = 0x1b8,
};

static inline bool vdi_is_allocated(uint32_t entry)
{
    return entry < VDI_DISCARDED;
}

/* The header fields, host byte order. */
struct vdi_header {
    uint32_t signature, version, image_type;
    uint32_t offset_bmap, offset_data, sector_size, block_size;
    uint64_t disk_size; /* as stored */
    uint32_t blocks, allocated;
    bool link_uuid_set, parent_uuid_set;
};

typedef struct vdi_state {
    struct vdi_header h;
    uint8_t *raw;          /* the header sector as read (aligned) */
    uint32_t *bmap;        /* h.blocks entries, little-endian */
    uint64_t bmap_bytes;   /* the map rounded up to a sector */
    uint32_t next_index;   /* next host block: blocks_allocated in memory */
    bool inconsistent;     /* the map is unsafe to allocate in: no writes */
    void *zeroes;          /* VDI_BLOCK zero bytes for partial new blocks */
    bi_co_mutex meta_lock; /* header and map writes, in order */
} vdi_state;

/* Sets err (if not set yet) to the message without an errno text and
 * err->code to code; returns code. */
int vdi_error(bi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses and validates the header sector p as QEMU 7.2 does (its checks,
 * its order, its words, including the rounding of the disk size up to a
 * sector). 0 or -errno with err set. Pure: unit-tested. */
int vdi_parse_header(const uint8_t *p, struct vdi_header *h, bi_error *err);
/* The guest size QEMU gives an image with this header. */
uint64_t vdi_guest_size(const struct vdi_header *h);

int vdi_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
               struct bi_extent *ext);
int vdi_co_write_done(bi_node *n, struct bi_extent *ext, int ret);
int vdi_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                        struct bi_status *st);
/* Whether new blocks can be appended safely (every allocated entry below
 * blocks_allocated and none shared, blocks_allocated within the map). */
bool vdi_map_consistent(const vdi_state *s);

int vdi_create(const char *filename, const struct bi_create_opts *o,
               bi_error *err);
extern const struct bi_opt_desc vdi_create_opts[];

int vdi_check(bi_node *n, struct bi_check_result *res, int fix, bi_error *err);

#endif
