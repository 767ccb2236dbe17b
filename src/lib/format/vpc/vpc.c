/* SPDX-License-Identifier: MIT */
/*
 * vpc (VHD) driver: probing, open with QEMU 7.2's checks and size rules,
 * info, the driver table.
 *
 * Every field taken from the file is checked before it is used, in the
 * order QEMU checks them and with QEMU's words, so that a damaged or
 * crafted image fails the same way under both tools; where QEMU would
 * allocate what the file cannot hold (a BAT bigger than the file), the
 * image is refused before anything is allocated, with the message QEMU
 * gives once it has read it.
 */
#include "vpc.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* QEMU's largest request end (BDRV_MAX_LENGTH): reads reaching beyond it
 * fail instead of returning zeroes; and its largest request
 * (BDRV_REQUEST_MAX_BYTES), which bounds the BAT it reads in one go. */
#define VPC_MAX_IO_END 0x7fffffffc0000000ULL
#define VPC_MAX_REQUEST 0x7ffffe00ULL

uint32_t vpc_checksum(const uint8_t *buf, size_t len, size_t skip_off)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < len; i++)
        if (i < skip_off || i >= skip_off + 4)
            sum += buf[i];
    return ~sum;
}

/* The cookie "conectix" at offset 0: dynamic and differencing VHDs keep a
 * copy of their footer there. A fixed VHD has its footer only at the end
 * of the file, and QEMU probes it as raw: so does blkimg. */
static int vpc_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    return len >= 8 && !memcmp(buf, "conectix", 8) ? 100 : 0;
}

/* Reads len bytes at off of the file as QEMU's bdrv_pread would: zeroes
 * past the end of the file, an error for a range QEMU refuses. */
static int read_meta(bi_node *n, uint64_t off, void *buf, uint64_t len)
{
    if (off > VPC_MAX_IO_END || len > VPC_MAX_IO_END - off)
        return -EIO;
    return bi_co_pread(n->file, off, buf, len);
}

/* Finds the footer (offset 0, else the last sector for a fixed disk) and
 * checks its checksum. *fixed: found at the end. */
static int read_footer(bi_node *n, bool *fixed, bi_error *err)
{
    vpc_state *s = n->opaque;
    uint8_t *f = s->footer;
    *fixed = false;
    if (bi_co_pread(n->file, 0, f, VHD_FOOTER_SIZE) < 0) {
        bi_error_set(err, 0, "Unable to read VHD header");
        return -EIO;
    }
    if (memcmp(f + VF_COOKIE, "conectix", 8)) {
        if (s->file_len < VHD_FOOTER_SIZE) {
            bi_error_set(err, 0, "File too small for a VHD header");
            return -EINVAL;
        }
        int ret = bi_co_pread(n->file, s->file_len - VHD_FOOTER_SIZE, f,
                              VHD_FOOTER_SIZE);
        if (ret < 0) {
            bi_error_set(err, -ret, "Could not read the VHD footer");
            return ret;
        }
        if (memcmp(f + VF_COOKIE, "conectix", 8) ||
            bi_ld_be32(f + VF_TYPE) != VHD_FIXED) {
            bi_error_set(err, 0, "invalid VPC image");
            return -EINVAL;
        }
        *fixed = true;
    }
    if (vpc_checksum(f, VHD_FOOTER_SIZE, VF_CHECKSUM) !=
        bi_ld_be32(f + VF_CHECKSUM)) {
        bi_error_set(err, 0, "Incorrect header checksum");
        return -EINVAL;
    }
    return 0;
}

/* QEMU's table of creator applications whose images give their size in
 * current_size rather than by CHS geometry: Hyper-V ("win "), QEMU with
 * force_size ("qem2"), Disk2vhd ("d2v "), XenConverter ("CTXS") and
 * XenServer ("tap\0"). */
static bool uses_current_size(const uint8_t *app)
{
    static const char apps[][4] = {
        "win ", "qem2", "d2v ", "CTXS", {'t', 'a', 'p', 0}};
    for (size_t i = 0; i < BI_ARRAY_SIZE(apps); i++)
        if (!memcmp(app, apps[i], 4))
            return true;
    return false;
}

/* The force_size_calc runtime option: 0 none, 1 "chs", 2 "current_size";
 * -EINVAL (err set) for anything else. */
static int size_calc_opt(const struct bi_open_opts *o, bi_error *err)
{
    static const char key[] = "force_size_calc=";
    const char *v = NULL;
    for (const char *const *p = o ? o->driver_opts : NULL; p && *p; p++)
        if (!strncmp(*p, key, sizeof(key) - 1))
            v = *p + sizeof(key) - 1;
    if (!v)
        return 0;
    if (!strcmp(v, "chs"))
        return 1;
    if (!strcmp(v, "current_size"))
        return 2;
    bi_error_set(err, 0, "Invalid size calculation mode: '%s'", v);
    return -EINVAL;
}

/* The guest size in sectors: CHS geometry, or current_size for the
 * creators that use it, for the maximum geometry and when forced. */
static uint64_t guest_sectors(const uint8_t *f, int calc)
{
    uint64_t chs = (uint64_t)bi_ld_be16(f + VF_CYLS) * f[VF_HEADS] * f[VF_SPT];
    bool use_chs = !uses_current_size(f + VF_CREATOR_APP) || calc == 1;
    if (!use_chs || chs == VHD_MAX_GEOMETRY || calc == 2)
        return bi_ld_be64(f + VF_CUR_SIZE) / VHD_SECTOR;
    return chs;
}

/* Checks the dynamic disk header's block size and table size against the
 * guest size, in QEMU's order and words. */
static int check_dyn_header(vpc_state *s, const uint8_t *h, uint64_t sectors,
                            bi_error *err)
{
    if (memcmp(h + VD_COOKIE, "cxsparse", 8)) {
        bi_error_set(err, 0, "Invalid header magic");
        return -EINVAL;
    }
    s->block_size = bi_ld_be32(h + VD_BLOCK_SIZE);
    if (!bi_is_pow2(s->block_size) || s->block_size < VHD_SECTOR) {
        bi_error_set(err, 0, "Invalid block size %" PRIu32, s->block_size);
        return -EINVAL;
    }
    s->bitmap_size = bi_align_up(s->block_size / (8 * VHD_SECTOR), 512);
    int32_t mte = (int32_t)bi_ld_be32(h + VD_MAX_ENTRIES);
    if (sectors * VHD_SECTOR / s->block_size > 0xffffffffULL) {
        bi_error_set(err, 0, "Too many blocks");
        return -EINVAL;
    }
    /* QEMU multiplies the entry count as a signed int widened to 64 bits */
    uint64_t covered = (uint64_t)(int64_t)mte * s->block_size;
    if (covered < sectors * VHD_SECTOR) {
        bi_error_set(err, 0, "Page table too small");
        return -EINVAL;
    }
    if (mte < 0 || mte > INT_MAX / 4) {
        bi_error_set(err, 0, "Max Table Entries too large (%" PRId32 ")", mte);
        return -EINVAL;
    }
    s->max_table_entries = (uint32_t)mte;
    s->bat_offset = bi_ld_be64(h + VD_TABLE_OFFSET);
    return 0;
}

static int truncated(bi_error *err)
{
    bi_error_set(err, 0,
                 "block-vpc: free_data_block_offset points after the end of "
                 "file. The image has been truncated.");
    return -EINVAL;
}

/* Reads the BAT and finds where the next block goes: past the BAT and
 * every allocated block, all of which must lie inside the file. */
static int read_bat(bi_node *n, bi_error *err)
{
    vpc_state *s = n->opaque;
    uint64_t bytes = (uint64_t)s->max_table_entries * 4;
    if (s->bat_offset > VPC_MAX_IO_END ||
        bytes > VPC_MAX_IO_END - s->bat_offset || bytes > VPC_MAX_REQUEST) {
        bi_error_set(err, 0, "Error reading pagetable");
        return -EIO;
    }
    s->free_offset = bi_align_up(s->bat_offset + bytes, VHD_SECTOR);
    if (s->free_offset > s->file_len)
        return truncated(err);
    s->bat = malloc(bytes ? bytes : 1);
    if (!s->bat) {
        bi_error_set(err, 0, "Unable to allocate memory for page table");
        return -ENOMEM;
    }
    if (bytes && bi_co_pread(n->file, s->bat_offset, s->bat, bytes) < 0) {
        bi_error_set(err, 0, "Error reading pagetable");
        return -EIO;
    }
    for (uint32_t i = 0; i < s->max_table_entries; i++) {
        s->bat[i] = be32toh(s->bat[i]);
        if (s->bat[i] == VHD_BAT_UNUSED)
            continue;
        uint64_t next =
            (uint64_t)s->bat[i] * VHD_SECTOR + s->bitmap_size + s->block_size;
        s->free_offset = BI_MAX(s->free_offset, next);
    }
    if (s->free_offset > s->file_len)
        return truncated(err);
    return 0;
}

/* What a writable dynamic image needs: a sector bitmap of ones (QEMU
 * marks every sector of a block it writes present) and which blocks have
 * had theirs written since open. */
static int prepare_writes(bi_node *n)
{
    vpc_state *s = n->opaque;
    s->ones = bi_blockalign(n->file, s->bitmap_size);
    s->bitmap_set = calloc((size_t)s->max_table_entries / 8 + 1, 1);
    if (!s->ones || !s->bitmap_set)
        return -ENOMEM;
    memset(s->ones, 0xff, s->bitmap_size);
    return 0;
}

static int open_dynamic(bi_node *n, uint64_t sectors, bi_error *err)
{
    vpc_state *s = n->opaque;
    uint8_t h[VHD_DYN_HEADER_SIZE];
    s->header_offset = bi_ld_be64(s->footer + VF_DATA_OFFSET);
    if (read_meta(n, s->header_offset, h, sizeof(h)) < 0) {
        bi_error_set(err, 0, "Error reading dynamic VHD header");
        return -EIO;
    }
    int ret = check_dyn_header(s, h, sectors, err);
    if (ret == 0)
        ret = read_bat(n, err);
    if (ret == 0 && !n->read_only && prepare_writes(n) < 0) {
        bi_error_set(err, 0, "Unable to allocate memory for page table");
        ret = -ENOMEM;
    }
    return ret;
}

/* The open body, in a coroutine: footer, size rule, dynamic header and
 * BAT, each checked before use. */
static int vpc_do_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    vpc_state *s = n->opaque;
    bool at_end;
    int calc = size_calc_opt(o, err);
    if (calc < 0)
        return calc;
    int64_t flen = bi_getlength(n->file);
    if (flen < 0) {
        bi_error_set(err, 0, "Invalid file size");
        return (int)flen;
    }
    s->file_len = (uint64_t)flen;
    bi_co_mutex_init(&s->lock);
    int ret = read_footer(n, &at_end, err);
    if (ret < 0)
        return ret;
    uint64_t sectors = guest_sectors(s->footer, calc);
    if (sectors > VHD_MAX_SECTORS) {
        bi_error_set(err, EFBIG, "Could not open '%s'", n->filename);
        return -EFBIG;
    }
    s->fixed = bi_ld_be32(s->footer + VF_TYPE) == VHD_FIXED;
    s->fixed_end = at_end ? s->file_len - VHD_FOOTER_SIZE : UINT64_MAX;
    if (!at_end) {
        ret = open_dynamic(n, sectors, err);
        if (ret < 0)
            return ret;
    }
    n->size = sectors * VHD_SECTOR;
    return 0;
}

static void vpc_free_state(bi_node *n)
{
    vpc_state *s = n->opaque;
    if (!s)
        return;
    vpc_free_pending(s);
    free(s->bat);
    free(s->bitmap_set);
    bi_free_aligned(s->ones);
    s->bat = NULL;
    s->bitmap_set = NULL;
    s->ones = NULL;
}

static int vpc_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    return bi_run_co_open(vpc_do_open, vpc_free_state, n, o, err);
}

static void vpc_close(bi_node *n)
{
    vpc_free_state(n);
}

static void vpc_refresh_limits(bi_node *n)
{
    n->limits = n->file->limits;
    /* The driver maps any byte range; the file aligns its own I/O. */
    bi_limits_any_range(&n->limits, 0);
}

/* Dynamic disks allocate in blocks (qemu-img info's cluster_size); fixed
 * ones have no allocation unit. */
static void vpc_get_geometry(bi_node *n, struct bi_geometry *g)
{
    vpc_state *s = n->opaque;
    if (!s->fixed)
        g->cluster_size = s->block_size;
}

/* QEMU's vpc answers bdrv_get_info (so info shows the dirty flag) and has
 * no format-specific data. */
static int vpc_get_info(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    (void)n;
    (void)info;
    (void)err;
    return 0;
}

static int64_t vpc_allocated_file_size(bi_node *n)
{
    return bi_allocated_file_size(n->file);
}

/* qemu 7.2's vpc runtime options. */
static const struct bi_opt_desc vpc_runtime_opts[] = {
    {"force_size_calc", BI_OPT_STRING,
     "Force disk size calculation to use either CHS geometry, or use the "
     "disk current_size specified in the VHD footer. {chs, current_size}",
     NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

const struct bi_driver bi_drv_vpc = {
    .name = "vpc",
    .state_size = sizeof(vpc_state),
    .probe = vpc_probe,
    .open = vpc_open,
    .close = vpc_close,
    .create = vpc_create,
    .create_opts = vpc_create_opts,
    .runtime_opts = vpc_runtime_opts,
    .refresh_limits = vpc_refresh_limits,
    .co_map = vpc_co_map,
    .co_write_done = vpc_co_write_done,
    .get_geometry = vpc_get_geometry,
    .co_block_status = vpc_co_block_status,
    .get_allocated_file_size = vpc_allocated_file_size,
    .get_info = vpc_get_info,
};
