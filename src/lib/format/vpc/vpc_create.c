/* SPDX-License-Identifier: MIT */
/*
 * vpc image creation as qemu-img 7.2 does it: the size rounded up to what
 * a CHS geometry can express (unless force_size), a dynamic disk (footer,
 * dynamic disk header, a BAT of unused entries, the footer again) with
 * 2 MiB blocks, or a fixed disk (the data, then the footer).
 */
#include "util/util.h"
#include "vpc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define VPC_BLOCK_SIZE (2u << 20)
#define VPC_BAT_OFFSET (3 * VHD_SECTOR)

/* qemu 7.2's vpc creation options, in its order (the Formatting line's);
 * the file protocol's follow. */
const struct bi_opt_desc vpc_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"subformat", BI_OPT_STRING,
     "Type of virtual hard disk format. Supported formats are "
     "{dynamic (default) | fixed} ",
     NULL, 0},
    {"force_size", BI_OPT_BOOL,
     "Force disk size calculation to use the actual size specified, rather "
     "than using the nearest CHS-based calculation",
     NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

/* The VHD specification's CHS algorithm for total sectors, with QEMU's
 * arithmetic (8-bit heads, 16-bit cylinders). It may round down. */
static void chs_of(uint64_t total, uint16_t *cyls, uint8_t *heads, uint8_t *spt)
{
    uint32_t cth;
    total = BI_MIN(total, VHD_MAX_GEOMETRY);
    if (total >= 65535ULL * 16 * 63) {
        *spt = 255;
        *heads = 16;
        cth = (uint32_t)(total / *spt);
    } else {
        *spt = 17;
        cth = (uint32_t)(total / *spt);
        *heads = (uint8_t)((cth + 1023) / 1024);
        if (*heads < 4)
            *heads = 4;
        if (cth >= (uint32_t)*heads * 1024 || *heads > 16) {
            *spt = 31;
            *heads = 16;
            cth = (uint32_t)(total / *spt);
        }
        if (cth >= (uint32_t)*heads * 1024) {
            *spt = 63;
            *heads = 16;
            cth = (uint32_t)(total / *spt);
        }
    }
    *cyls = (uint16_t)(cth / *heads);
}

int vpc_rounded_size(uint64_t size, bool force_size, uint16_t *cyls,
                     uint8_t *heads, uint8_t *spt, uint64_t *sectors)
{
    uint16_t c = 0;
    uint8_t h = 0, s = 0;
    if (force_size) {
        c = VHD_CHS_MAX_C;
        h = VHD_CHS_MAX_H;
        s = VHD_CHS_MAX_S;
    } else {
        /* the first geometry from size up that holds size */
        uint64_t want = BI_MIN(VHD_MAX_GEOMETRY, size / VHD_SECTOR);
        for (uint64_t i = 0; want > (uint64_t)c * h * s; i++)
            chs_of(want + i, &c, &h, &s);
    }
    if ((uint64_t)c * h * s == VHD_MAX_GEOMETRY) {
        *sectors = size / VHD_SECTOR;
        if (*sectors > VHD_MAX_SECTORS)
            return -EFBIG;
    } else {
        *sectors = (uint64_t)c * h * s;
    }
    *cyls = c;
    *heads = h;
    *spt = s;
    return 0;
}

struct vpc_create_args {
    uint64_t size;
    bool fixed;
    bool force_size;
};

static int parse_bool(const char *key, const char *v, bool *out, bi_error *err)
{
    if (v && !strcmp(v, "on"))
        *out = true;
    else if (v && !strcmp(v, "off"))
        *out = false;
    else {
        bi_error_set(err, 0, "Parameter '%s' expects 'on' or 'off'", key);
        return -EINVAL;
    }
    return 0;
}

/* The -o options (the generic layer has checked size and preallocation
 * and made booleans "on"/"off"). */
static int parse_opts(const struct bi_create_opts *o, struct vpc_create_args *c,
                      bi_error *err)
{
    struct bi_optlist l = {0, NULL};
    int ret = 0;
    for (const char *const *p = o->options; p && *p && ret == 0; p++)
        ret = bi_optlist_parse(&l, *p);
    for (int i = 0; i < l.n && ret == 0; i++) {
        const char *k = l.v[i].key, *v = l.v[i].value;
        if (!strcmp(k, "subformat")) {
            if (v && !strcmp(v, "dynamic"))
                c->fixed = false;
            else if (v && !strcmp(v, "fixed"))
                c->fixed = true;
            else {
                bi_error_set(err, 0,
                             "Parameter 'subformat' does not accept value "
                             "'%s'",
                             v ? v : "");
                ret = -EINVAL;
            }
        } else if (!strcmp(k, "force_size")) {
            ret = parse_bool(k, v, &c->force_size, err);
        } else if (strcmp(k, "size") && strcmp(k, "preallocation")) {
            bi_error_set(err, 0, "Invalid parameter '%s'", k);
            ret = -EINVAL;
        }
    }
    bi_optlist_free(&l);
    return ret;
}

/* A version 4 UUID, as QEMU's qemu_uuid_generate makes. */
static void make_uuid(uint8_t *u)
{
    if (getrandom(u, 16, 0) != 16) {
        for (int i = 0; i < 16; i++)
            u[i] = (uint8_t)rand();
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
}

/* The footer of a new image of sectors sectors with geometry chs. */
static void build_footer(uint8_t *f, const struct vpc_create_args *c,
                         uint64_t sectors, uint16_t cyls, uint8_t heads,
                         uint8_t spt)
{
    memset(f, 0, VHD_FOOTER_SIZE);
    memcpy(f + VF_COOKIE, "conectix", 8);
    bi_st_be32(f + VF_FEATURES, 2);
    bi_st_be32(f + VF_VERSION, 0x00010000);
    bi_st_be64(f + VF_DATA_OFFSET, c->fixed ? UINT64_MAX : VHD_SECTOR);
    bi_st_be32(f + VF_TIMESTAMP, (uint32_t)(time(NULL) - VHD_TIMESTAMP_BASE));
    memcpy(f + VF_CREATOR_APP, c->force_size ? "qem2" : "qemu", 4);
    bi_st_be16(f + VF_CREATOR_VER, 5); /* Virtual PC 2007: 5.3 */
    bi_st_be16(f + VF_CREATOR_VER + 2, 3);
    memcpy(f + VF_CREATOR_OS, "Wi2k", 4);
    bi_st_be64(f + VF_ORIG_SIZE, sectors * VHD_SECTOR);
    bi_st_be64(f + VF_CUR_SIZE, sectors * VHD_SECTOR);
    bi_st_be16(f + VF_CYLS, cyls);
    f[VF_HEADS] = heads;
    f[VF_SPT] = spt;
    bi_st_be32(f + VF_TYPE, c->fixed ? VHD_FIXED : VHD_DYNAMIC);
    make_uuid(f + VF_UUID);
    bi_st_be32(f + VF_CHECKSUM, vpc_checksum(f, VHD_FOOTER_SIZE, VF_CHECKSUM));
}

/* A dynamic disk's metadata, the whole file: footer, header, BAT of
 * unused entries (whole sectors), footer. */
static int write_dynamic(bi_node *f, const uint8_t *footer, uint64_t sectors)
{
    uint64_t entries = bi_align_up(sectors, VPC_BLOCK_SIZE / VHD_SECTOR) /
                       (VPC_BLOCK_SIZE / VHD_SECTOR);
    uint64_t bat_bytes = bi_align_up(entries * 4, VHD_SECTOR);
    size_t len = VPC_BAT_OFFSET + bat_bytes + VHD_FOOTER_SIZE;
    uint8_t *buf = bi_blockalign(f, len);
    if (!buf)
        return -ENOMEM;
    memset(buf, 0, VPC_BAT_OFFSET);
    memcpy(buf, footer, VHD_FOOTER_SIZE);
    uint8_t *h = buf + VHD_SECTOR;
    memcpy(h + VD_COOKIE, "cxsparse", 8);
    /* all 64 bits set, as Microsoft's tools expect (the spec says 32) */
    bi_st_be64(h + VD_DATA_OFFSET, UINT64_MAX);
    bi_st_be64(h + VD_TABLE_OFFSET, VPC_BAT_OFFSET);
    bi_st_be32(h + VD_VERSION, 0x00010000);
    bi_st_be32(h + VD_MAX_ENTRIES, (uint32_t)entries);
    bi_st_be32(h + VD_BLOCK_SIZE, VPC_BLOCK_SIZE);
    bi_st_be32(h + VD_CHECKSUM,
               vpc_checksum(h, VHD_DYN_HEADER_SIZE, VD_CHECKSUM));
    memset(buf + VPC_BAT_OFFSET, 0xff, bat_bytes);
    memcpy(buf + VPC_BAT_OFFSET + bat_bytes, footer, VHD_FOOTER_SIZE);
    int ret = bi_pwrite(f, 0, buf, len, 0);
    bi_free_aligned(buf);
    return ret;
}

/* A fixed disk: sparse data, then the footer. */
static int write_fixed(bi_node *f, const uint8_t *footer, uint64_t size,
                       bi_error *err)
{
    int ret =
        bi_truncate(f, size + VHD_FOOTER_SIZE, false, BI_PREALLOC_OFF, err);
    if (ret < 0)
        return ret;
    uint8_t *buf = bi_blockalign(f, VHD_FOOTER_SIZE);
    if (!buf)
        return -ENOMEM;
    memcpy(buf, footer, VHD_FOOTER_SIZE);
    ret = bi_pwrite(f, size, buf, VHD_FOOTER_SIZE, 0);
    bi_free_aligned(buf);
    if (ret < 0)
        bi_error_set(err, -ret, "Unable to write VHD header");
    return ret;
}

/* Creates the (empty) file, as QEMU does before writing the format: the
 * size option stays with the format, so preallocation has nothing to
 * allocate. */
static bi_node *create_empty_file(const char *filename,
                                  const struct bi_create_opts *o, bi_error *err)
{
    struct bi_create_opts fco;
    bi_create_opts_init(&fco);
    fco.format = "file";
    fco.size_set = true;
    fco.prealloc = o->prealloc;
    if (bi_create_file(filename, &fco, err) < 0)
        return NULL;
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.read_write = true;
    return bi_open_protocol(filename, &oo, err);
}

/* The image's geometry and sectors for c: QEMU rounds the size up to a
 * geometry first, then checks that the rounded size is one. */
static int new_geometry(const struct vpc_create_args *c, uint16_t *cyls,
                        uint8_t *heads, uint8_t *spt, uint64_t *sectors,
                        bi_error *err)
{
    uint64_t size = c->size;
    int ret = 0;
    if (!c->force_size) {
        ret = vpc_rounded_size(size, false, cyls, heads, spt, sectors);
        size = *sectors * VHD_SECTOR;
    }
    if (ret == 0)
        ret = vpc_rounded_size(size, c->force_size, cyls, heads, spt, sectors);
    if (ret == -EFBIG) {
        bi_error_set(err, 0,
                     "The image size is too large for file format "
                     "'vpc'");
        return ret;
    }
    if (*sectors * VHD_SECTOR != size) {
        bi_error_set(err, 0,
                     "The requested image size cannot be represented in CHS "
                     "geometry");
        return -EINVAL;
    }
    return 0;
}

int vpc_create(const char *filename, const struct bi_create_opts *o,
               bi_error *err)
{
    struct vpc_create_args c = {bi_align_up(o->size, VHD_SECTOR), false, false};
    uint16_t cyls;
    uint8_t heads, spt, footer[VHD_FOOTER_SIZE];
    uint64_t sectors;
    int ret = parse_opts(o, &c, err);
    if (ret == 0 && o->backing_file) {
        bi_error_set(err, 0, "Invalid parameter 'backing_file'");
        ret = -EINVAL;
    }
    if (ret == 0)
        ret = new_geometry(&c, &cyls, &heads, &spt, &sectors, err);
    if (ret < 0)
        return ret;
    build_footer(footer, &c, sectors, cyls, heads, spt);
    bi_node *f = create_empty_file(filename, o, err);
    if (!f)
        return err && err->code ? err->code : -EIO;
    if (c.fixed) {
        ret = write_fixed(f, footer, sectors * VHD_SECTOR, err);
    } else {
        ret = write_dynamic(f, footer, sectors);
        if (ret < 0)
            bi_error_set(err, 0, "Unable to create or write VHD header");
    }
    int cret = bi_close(f, ret < 0 ? NULL : err);
    return ret < 0 ? ret : cret;
}
