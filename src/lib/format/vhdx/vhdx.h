/* SPDX-License-Identifier: MIT */
/*
 * vhdx (Hyper-V virtual hard disk v2, MS-VHDX), as QEMU 7.2 reads and
 * writes it: dynamic and fixed images, no differencing ones.
 *
 * Layout (little-endian): the file identifier ("vhdxfile") at 0, two
 * 4 KiB headers at 64 KiB and 128 KiB (the valid one with the higher
 * sequence number is current; CRC-32C over the 4 KiB), two copies of the
 * 64 KiB region table at 192 KiB and 256 KiB (locating the BAT and the
 * metadata region), the log (a circular journal of metadata writes,
 * replayed before use), the BAT: one 64-bit entry per payload block (state
 * in bits 0-2, file offset in MiB in bits 20-63) with a sector-bitmap
 * entry after every chunk_ratio of them, and the metadata region (block
 * size, virtual disk size, sector sizes, page 83 data).
 *
 *   vhdx.c         headers, region table, metadata, BAT, open, the table
 *   vhdx_log.c     finding and replaying the log
 *   vhdx_map.c     mapping, allocating writes, header updates
 *   vhdx_create.c  creation and its options
 *   vhdx_check.c   check
 */
#ifndef BI_FORMAT_VHDX_H
#define BI_FORMAT_VHDX_H

#include "block/block.h"
#include "util/coroutine.h"

#include <stdbool.h>
#include <stdint.h>

#define VHDX_KIB 1024ull
#define VHDX_MIB (1024ull * 1024)

enum {
    VHDX_HEADER1_OFFSET = 64 * 1024,
    VHDX_HEADER2_OFFSET = 128 * 1024,
    VHDX_HEADER_SIZE = 4096,      /* the part of a header the CRC covers */
    VHDX_RT1_OFFSET = 192 * 1024, /* region tables */
    VHDX_RT2_OFFSET = 256 * 1024,
    VHDX_RT_SIZE = 64 * 1024,
    VHDX_RT_MAX_ENTRIES = 2047,
    VHDX_META_TABLE_SIZE = 64 * 1024,
    VHDX_META_MAX_ENTRIES = 2047,
    VHDX_LOG_SECTOR = 4096,
};

#define VHDX_HEADER_SECTION_END VHDX_MIB
#define VHDX_BLOCK_MIN VHDX_MIB
#define VHDX_BLOCK_MAX (256 * VHDX_MIB)
#define VHDX_MAX_SIZE (64ull * 1024 * 1024 * VHDX_MIB) /* 64 TiB */
/* The BAT and the log are read into memory: bounds on hostile sizes. */
#define VHDX_LOG_MAX (256 * VHDX_MIB)

/* BAT entry states (payload blocks; sector bitmaps use 0 and 6). */
enum {
    VHDX_BAT_NOT_PRESENT = 0,
    VHDX_BAT_UNDEFINED = 1,
    VHDX_BAT_ZERO = 2,
    VHDX_BAT_UNMAPPED = 3,
    VHDX_BAT_UNMAPPED_V095 = 5,
    VHDX_BAT_FULLY_PRESENT = 6,
    VHDX_BAT_PARTIALLY_PRESENT = 7,
};
#define VHDX_BAT_STATE_MASK 7ull
#define VHDX_BAT_OFFSET_MASK (~0xfffffull)

/* Header field offsets */
enum {
    VHH_SIGNATURE = 0,
    VHH_CHECKSUM = 4,
    VHH_SEQUENCE = 8,
    VHH_FILE_WRITE_GUID = 16,
    VHH_DATA_WRITE_GUID = 32,
    VHH_LOG_GUID = 48,
    VHH_LOG_VERSION = 64,
    VHH_VERSION = 66,
    VHH_LOG_LENGTH = 68,
    VHH_LOG_OFFSET = 72,
};

/* A GUID in its on-disk (Microsoft, mixed-endian) byte order. */
typedef struct vhdx_guid {
    uint8_t b[16];
} vhdx_guid;

extern const vhdx_guid vhdx_bat_guid, vhdx_metadata_guid;
extern const vhdx_guid vhdx_file_param_guid, vhdx_vsize_guid, vhdx_page83_guid,
    vhdx_lss_guid, vhdx_pss_guid, vhdx_parent_guid;

typedef struct vhdx_state {
    uint8_t *hdr[2]; /* the two 4 KiB headers as read (aligned) */
    int cur;         /* the current header */
    uint64_t log_offset;
    uint32_t log_length;
    uint64_t bat_offset;
    uint32_t bat_length; /* region length */
    uint64_t meta_offset;
    uint32_t meta_length;
    uint32_t block_size, lss, pss;
    uint64_t vsize;
    uint64_t chunk_ratio;
    uint64_t bat_entries;
    bool fixed;    /* leave_blocks_allocated */
    uint64_t *bat; /* bat_entries entries, little-endian, rounded to 4 KiB */
    uint64_t bat_bytes;
    uint64_t file_end;      /* the end of the file: where blocks go */
    bool data_guid_changed; /* the first guest write happened */
    vhdx_guid session_guid; /* file_write_guid of this session */
    bool log_replayed;
    bi_co_mutex lock; /* header and BAT writes, allocation */
} vhdx_state;

/* CRC-32C (Castagnoli) of len bytes, as MS-VHDX checksums are. */
uint32_t vhdx_crc32c(uint32_t crc, const void *buf, size_t len);
/* CRC-32C of a structure of len bytes whose 4-byte checksum field at
 * csum_off counts as zero. */
uint32_t vhdx_checksum(const uint8_t *buf, size_t len, size_t csum_off);
/* Stores the checksum of buf at csum_off (see vhdx_checksum). */
void vhdx_set_checksum(uint8_t *buf, size_t len, size_t csum_off);
void vhdx_guid_generate(vhdx_guid *g);
bool vhdx_guid_is_zero(const uint8_t *p);

uint64_t vhdx_ld64(const uint8_t *p);
uint16_t vhdx_ld16(const uint8_t *p);
void vhdx_st64(uint8_t *p, uint64_t v);
void vhdx_st32(uint8_t *p, uint32_t v);
void vhdx_st16(uint8_t *p, uint16_t v);

/* The BAT index of payload block b. */
static inline uint64_t vhdx_bat_index(const vhdx_state *s, uint64_t b)
{
    return b + b / s->chunk_ratio;
}
/* The BAT entry at index i, host order. */
uint64_t vhdx_bat_get(const vhdx_state *s, uint64_t i);
/* The number of BAT entries (sector bitmaps included) of an image without
 * a parent with this geometry. */
uint64_t vhdx_calc_bat_entries(uint64_t vsize, uint32_t block_size,
                               uint64_t chunk_ratio);

/* Replays the log of the current header if it holds a valid sequence of
 * entries: refused on a read-only node (QEMU's words, -EPERM); on a
 * writable one every entry is written to its place, the file is flushed,
 * then the log is marked empty in both headers. Sets *replayed. */
int vhdx_co_replay_log(bi_node *n, bool *replayed, bi_error *err);
/* Writes a new header (sequence + 1, file write GUID of this session; a
 * new data write GUID if data_guid; log_guid if not NULL) into the slot
 * that is not current, flushes, and makes it current: a crash leaves the
 * old current header valid and newest. Done twice, as QEMU does, so that
 * both headers hold the update. Under s->lock. */
int vhdx_co_update_headers(bi_node *n, bool data_guid,
                           const vhdx_guid *log_guid);

int vhdx_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                struct bi_extent *ext);
int vhdx_co_write_done(bi_node *n, struct bi_extent *ext, int ret);

int vhdx_create(const char *filename, const struct bi_create_opts *o,
                bi_error *err);
extern const struct bi_opt_desc vhdx_create_opts[];

int vhdx_check(bi_node *n, struct bi_check_result *res, int fix, bi_error *err);

#endif
