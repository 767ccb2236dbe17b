/* SPDX-License-Identifier: MIT */
/*
 * vhdx creation as qemu-img 7.2 does it: file identifier, two headers
 * (random sequence number n and n + 1, empty log), the region table twice,
 * the BAT (after the log, a MiB multiple long), the metadata region (1 MiB
 * after the BAT) and the data area 5 MiB past the BAT's end. Dynamic
 * images end there; fixed ones are grown (sparse) over every block.
 * With block_state_zero (the default) every payload entry is ZERO, a
 * fixed image's too (as QEMU writes it); otherwise a fixed image's
 * entries point at their blocks and a dynamic one's are NOT_PRESENT.
 */
#include "format/vhdx/vhdx.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* QEMU 7.2's vhdx creation options, in its order. */
const struct bi_opt_desc vhdx_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size; max of 64TB.", NULL, 0},
    {"log_size", BI_OPT_SIZE, "Log size; min 1MB.", "1048576", 0},
    {"block_size", BI_OPT_SIZE,
     "Block Size; min 1MB, max 256MB. 0 means auto-calculate based on "
     "image size.",
     "0", 0},
    {"subformat", BI_OPT_STRING,
     "VHDX format type, can be either 'dynamic' or 'fixed'. Default is "
     "'dynamic'.",
     NULL, 0},
    {"block_state_zero", BI_OPT_BOOL,
     "Force use of payload blocks of type 'ZERO'. Non-standard, but "
     "default.  Do not set to 'off' when using 'qemu-img convert' with "
     "subformat=dynamic.",
     NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

struct vhdx_create_args {
    uint64_t size, log_size, block_size;
    bool fixed, zero_blocks;
};

/* Parses one option k=v into c; 0 or -EINVAL with err set. */
static int parse_one(const char *k, const char *v, struct vhdx_create_args *c,
                     bi_error *err)
{
    if (!strcmp(k, "subformat")) {
        if (v && (!strcmp(v, "dynamic") || !strcmp(v, "fixed"))) {
            c->fixed = !strcmp(v, "fixed");
            return 0;
        }
        bi_error_set(err, 0, "Parameter 'subformat' does not accept value '%s'",
                     v ? v : "");
        return -EINVAL;
    }
    if (!strcmp(k, "block_state_zero")) {
        if (v && (!strcmp(v, "on") || !strcmp(v, "off"))) {
            c->zero_blocks = !strcmp(v, "on");
            return 0;
        }
        bi_error_set(err, 0, "Parameter '%s' expects 'on' or 'off'", k);
        return -EINVAL;
    }
    uint64_t *dst = !strcmp(k, "log_size")     ? &c->log_size
                    : !strcmp(k, "block_size") ? &c->block_size
                                               : NULL;
    if (dst) {
        if (!v || bi_parse_size(v, dst) < 0) {
            bi_error_set(err, 0,
                         "Parameter '%s' expects a non-negative number below "
                         "2^64",
                         k);
            return -EINVAL;
        }
        return 0;
    }
    if (strcmp(k, "size") && strcmp(k, "preallocation")) {
        bi_error_set(err, 0, "Invalid parameter '%s'", k);
        return -EINVAL;
    }
    return 0;
}

/* The -o options, then QEMU's defaults, rounding and limits. */
static int parse_opts(const struct bi_create_opts *o,
                      struct vhdx_create_args *c, bi_error *err)
{
    struct bi_optlist l = {0, NULL};
    int ret = 0;
    *c = (struct vhdx_create_args){bi_align_up(o->size, 512), VHDX_MIB, 0,
                                   false, true};
    for (const char *const *p = o->options; p && *p && ret == 0; p++)
        ret = bi_optlist_parse(&l, *p);
    for (int i = 0; i < l.n && ret == 0; i++)
        ret = parse_one(l.v[i].key, l.v[i].value, c, err);
    bi_optlist_free(&l);
    if (ret < 0)
        return ret;
    if (c->size > VHDX_MAX_SIZE) {
        bi_error_set(err, 0, "Image size too large; max of 64TB");
        return -EINVAL;
    }
    if (c->block_size == 0)
        c->block_size = c->size > 32 * 1024 * 1024 * VHDX_MIB ? 64 * VHDX_MIB
                        : c->size > 100 * 1024 * VHDX_MIB     ? 32 * VHDX_MIB
                        : c->size > 1024 * VHDX_MIB           ? 16 * VHDX_MIB
                                                              : 8 * VHDX_MIB;
    if (c->log_size > UINT32_MAX) {
        bi_error_set(err, 0, "Log size must be smaller than 4 GB");
        return -EINVAL;
    }
    c->log_size = bi_align_up(c->log_size, VHDX_MIB);
    c->block_size =
        BI_MIN(bi_align_up(c->block_size, VHDX_MIB), VHDX_BLOCK_MAX);
    if (c->block_size & (c->block_size - 1)) {
        bi_error_set(err, 0, "Block size must be a power of two");
        return -EINVAL;
    }
    return 0;
}

/* The layout of a new image. */
struct layout {
    uint64_t bat_off, bat_len, meta_off, data_off, entries, chunk_ratio;
};

static void plan(const struct vhdx_create_args *c, struct layout *L)
{
    L->chunk_ratio = (1ull << 23) * 512 / c->block_size;
    L->entries =
        vhdx_calc_bat_entries(c->size, (uint32_t)c->block_size, L->chunk_ratio);
    L->bat_off = bi_align_up(VHDX_HEADER_SECTION_END + c->log_size, VHDX_MIB);
    L->bat_len = bi_align_up(L->entries * 8, VHDX_MIB);
    L->meta_off = bi_align_up(L->bat_off + L->bat_len, VHDX_MIB);
    L->data_off = L->bat_off + L->bat_len + 5 * VHDX_MIB;
}

/* File identifier, both headers and both region tables: the first
 * 320 KiB of the file, into buf (zeroed). */
static void build_front(uint8_t *buf, const struct vhdx_create_args *c,
                        const struct layout *L)
{
    static const char creator[] = "blkimg";
    memcpy(buf, "vhdxfile", 8);
    for (size_t i = 0; creator[i]; i++)
        buf[8 + 2 * i] = (uint8_t)creator[i]; /* UTF-16LE */
    uint32_t seq;
    if (getrandom(&seq, sizeof(seq), 0) != (ssize_t)sizeof(seq))
        seq = (uint32_t)rand();
    vhdx_guid fw, dw;
    vhdx_guid_generate(&fw);
    vhdx_guid_generate(&dw);
    for (int i = 0; i < 2; i++) {
        uint8_t *h = buf + (i ? VHDX_HEADER2_OFFSET : VHDX_HEADER1_OFFSET);
        memcpy(h, "head", 4);
        vhdx_st64(h + VHH_SEQUENCE, (uint64_t)seq + (uint64_t)i);
        memcpy(h + VHH_FILE_WRITE_GUID, fw.b, 16);
        memcpy(h + VHH_DATA_WRITE_GUID, dw.b, 16);
        vhdx_st16(h + VHH_VERSION, 1);
        vhdx_st32(h + VHH_LOG_LENGTH, (uint32_t)c->log_size);
        vhdx_st64(h + VHH_LOG_OFFSET, VHDX_HEADER_SECTION_END);
        vhdx_set_checksum(h, VHDX_HEADER_SIZE, VHH_CHECKSUM);
    }
    uint8_t *rt = buf + VHDX_RT1_OFFSET;
    memcpy(rt, "regi", 4);
    vhdx_st32(rt + 8, 2);
    memcpy(rt + 16, vhdx_bat_guid.b, 16);
    vhdx_st64(rt + 32, L->bat_off);
    vhdx_st32(rt + 40, (uint32_t)L->bat_len);
    memcpy(rt + 48, vhdx_metadata_guid.b, 16);
    vhdx_st64(rt + 64, L->meta_off);
    vhdx_st32(rt + 72, (uint32_t)VHDX_MIB);
    vhdx_set_checksum(rt, VHDX_RT_SIZE, 4);
    memcpy(buf + VHDX_RT2_OFFSET, rt, VHDX_RT_SIZE);
}

/* The metadata table and its five items (128 KiB, into buf, zeroed). */
static void build_metadata(uint8_t *buf, const struct vhdx_create_args *c)
{
    const vhdx_guid *ids[5] = {&vhdx_file_param_guid, &vhdx_vsize_guid,
                               &vhdx_page83_guid, &vhdx_lss_guid,
                               &vhdx_pss_guid};
    static const uint32_t len[5] = {8, 8, 16, 4, 4};
    memcpy(buf, "metadata", 8);
    vhdx_st16(buf + 10, 5);
    uint32_t off = VHDX_META_TABLE_SIZE;
    for (int i = 0; i < 5; i++) {
        uint8_t *e = buf + 32 + 32 * i;
        memcpy(e, ids[i]->b, 16);
        vhdx_st32(e + 16, off);
        vhdx_st32(e + 20, len[i]);
        vhdx_st32(e + 24, i == 0 ? 4 : 6); /* required (, virtual disk) */
        off += len[i];
    }
    uint8_t *it = buf + VHDX_META_TABLE_SIZE;
    vhdx_st32(it, (uint32_t)c->block_size);
    vhdx_st32(it + 4, c->fixed ? 1 : 0);
    vhdx_st64(it + 8, c->size);
    vhdx_guid p83;
    vhdx_guid_generate(&p83);
    memcpy(it + 16, p83.b, 16);
    vhdx_st32(it + 32, 512);
    vhdx_st32(it + 36, 512);
}

/* The BAT of a new image (L->bat_len bytes into buf, zeroed). */
static void build_bat(uint8_t *buf, const struct vhdx_create_args *c,
                      const struct layout *L)
{
    uint64_t blocks = (c->size + c->block_size - 1) / c->block_size;
    for (uint64_t b = 0; b < blocks; b++) {
        uint64_t e = 0;
        if (c->zero_blocks)
            e = VHDX_BAT_ZERO;
        else if (c->fixed)
            e = bi_align_up(L->data_off + b * c->block_size, VHDX_MIB) |
                VHDX_BAT_FULLY_PRESENT;
        vhdx_st64(buf + 8 * (b + b / L->chunk_ratio), e);
    }
}

/* Writes the whole image into the empty file f. */
static int write_image(bi_node *f, const struct vhdx_create_args *c,
                       bi_error *err)
{
    struct layout L;
    plan(c, &L);
    uint64_t front = VHDX_RT2_OFFSET + VHDX_RT_SIZE;
    uint64_t meta = 2 * VHDX_META_TABLE_SIZE;
    uint8_t *buf = bi_blockalign(f, front + meta + L.bat_len);
    if (!buf) {
        bi_error_set(err, -ENOMEM, "Could not allocate the VHDX metadata");
        return -ENOMEM;
    }
    memset(buf, 0, front + meta + L.bat_len);
    build_front(buf, c, &L);
    build_metadata(buf + front, c);
    build_bat(buf + front + meta, c, &L);
    uint64_t end = L.data_off + (c->fixed ? c->size : 0);
    int ret = bi_truncate(f, end, false, BI_PREALLOC_OFF, err);
    if (ret == 0)
        ret = bi_pwrite(f, 0, buf, front, 0);
    if (ret == 0 && L.bat_len)
        ret = bi_pwrite(f, L.bat_off, buf + front + meta, L.bat_len, 0);
    if (ret == 0)
        ret = bi_pwrite(f, L.meta_off, buf + front, meta, 0);
    if (ret == 0)
        ret = bi_flush(f);
    bi_free_aligned(buf);
    if (ret < 0 && err && !err->msg[0])
        bi_error_set(err, ret, "Could not write the VHDX image");
    return ret;
}

int vhdx_create(const char *filename, const struct bi_create_opts *o,
                bi_error *err)
{
    struct vhdx_create_args c;
    int ret = parse_opts(o, &c, err);
    if (ret < 0)
        return ret;
    if (o->backing_file) {
        bi_error_set(err, 0,
                     "Backing file not supported for file format 'vhdx'");
        return -ENOTSUP;
    }
    struct bi_create_opts fco = *o;
    fco.size = 0;
    fco.options = NULL;
    ret = bi_create_file(filename, &fco, err);
    if (ret < 0)
        return ret;
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.read_write = true;
    bi_node *f = bi_open_protocol(filename, &oo, err);
    if (!f)
        return err && err->code ? err->code : -EIO;
    ret = write_image(f, &c, err);
    bi_error e2;
    bi_error_init(&e2);
    int cret = bi_close(f, &e2);
    if (ret == 0 && cret < 0) {
        bi_error_set(err, cret, "Could not write the VHDX image");
        ret = cret;
    }
    return ret;
}
