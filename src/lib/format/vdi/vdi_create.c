/* SPDX-License-Identifier: MIT */
/*
 * vdi creation as qemu-img 7.2 does it: the file is created empty (QEMU's
 * vdi takes the size option away before the protocol sees it, so a
 * preallocation mode applies to nothing), then the header sector and the
 * block map are written; a static image's map points every block at its
 * own host block and the file is grown (sparse) to hold them all.
 */
#include "format/vdi/vdi.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* QEMU 7.2's vdi creation options, in its order (the "Formatting" line's;
 * the file protocol's come after them). */
const struct bi_opt_desc vdi_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"static", BI_OPT_BOOL, "VDI static (pre-allocated) image", "off", 0},
    {NULL, 0, NULL, NULL, 0},
};

static const char vdi_text[] = "<<< QEMU VM Virtual Disk Image >>>\n";

/* Reads the options the driver gets: static (on/off, as the generic layer
 * spells booleans), size and preallocation (the generic layer's). */
static int parse_opts(const struct bi_create_opts *o, bool *is_static,
                      bi_error *err)
{
    *is_static = false;
    for (const char *const *p = o->options; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        size_t klen = eq ? (size_t)(eq - *p) : strlen(*p);
        const char *v = eq ? eq + 1 : "on";
        if (klen == 6 && !strncmp(*p, "static", 6)) {
            if (strcmp(v, "on") && strcmp(v, "off"))
                return vdi_error(err, -EINVAL,
                                 "Parameter 'static' expects 'on' or 'off'");
            *is_static = !strcmp(v, "on");
        } else if (!(klen == 4 && !strncmp(*p, "size", 4)) &&
                   !(klen == 13 && !strncmp(*p, "preallocation", 13))) {
            return vdi_error(err, -EINVAL, "Invalid parameter '%.*s'",
                             (int)klen, *p);
        }
    }
    return 0;
}

/* A random (version 4) UUID in VirtualBox's byte order: RFC 4122's with
 * its first three fields little-endian. */
static void put_uuid(uint8_t *p)
{
    uint8_t u[16];
    if (getrandom(u, sizeof(u), 0) != (ssize_t)sizeof(u)) {
        for (size_t i = 0; i < sizeof(u); i++)
            u[i] = (uint8_t)rand();
    }
    u[6] = (uint8_t)((u[6] & 0x0f) | 0x40);
    u[8] = (uint8_t)((u[8] & 0x3f) | 0x80);
    static const uint8_t order[16] = {3, 2, 1,  0,  5,  4,  7,  6,
                                      8, 9, 10, 11, 12, 13, 14, 15};
    for (size_t i = 0; i < sizeof(u); i++)
        p[i] = u[order[i]];
}

static void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}

/* The header sector of a new image of blocks blocks, map bytes long. */
static void build_header(uint8_t *h, uint64_t size, uint32_t blocks,
                         uint64_t map, bool is_static)
{
    memset(h, 0, VDI_HEADER_SIZE);
    memcpy(h, vdi_text, sizeof(vdi_text) - 1);
    put32(h + VH_SIGNATURE, VDI_SIGNATURE);
    put32(h + VH_VERSION, VDI_VERSION_1_1);
    put32(h + VH_HEADER_SIZE, 0x180);
    put32(h + VH_IMAGE_TYPE, is_static ? VDI_TYPE_STATIC : VDI_TYPE_DYNAMIC);
    put32(h + VH_OFFSET_BMAP, VDI_HEADER_SIZE);
    put32(h + VH_OFFSET_DATA, (uint32_t)(VDI_HEADER_SIZE + map));
    put32(h + VH_SECTOR_SIZE, VDI_SECTOR);
    uint64_t le = htole64(size);
    memcpy(h + VH_DISK_SIZE, &le, sizeof(le));
    put32(h + VH_BLOCK_SIZE, VDI_BLOCK);
    put32(h + VH_BLOCKS, blocks);
    put32(h + VH_ALLOCATED, is_static ? blocks : 0);
    put_uuid(h + VH_UUID_IMAGE);
    put_uuid(h + VH_UUID_SNAP);
}

/* Writes the header and the map of a new image into the empty file f. */
static int write_image(bi_node *f, uint64_t size, bool is_static, bi_error *err)
{
    uint32_t blocks = (uint32_t)((size + VDI_BLOCK - 1) / VDI_BLOCK);
    uint64_t map = bi_align_up((uint64_t)blocks * 4, VDI_SECTOR);
    uint8_t *buf = bi_blockalign(f, VDI_HEADER_SIZE + map);
    if (!buf)
        return vdi_error(err, -ENOMEM, "Could not allocate bmap");
    build_header(buf, size, blocks, map, is_static);
    uint8_t *bmap = buf + VDI_HEADER_SIZE;
    memset(bmap, 0, map);
    for (uint32_t i = 0; i < blocks; i++)
        put32(bmap + 4 * (uint64_t)i, is_static ? i : VDI_UNALLOCATED);
    int ret = bi_pwrite(f, 0, buf, VDI_HEADER_SIZE + map, 0);
    bi_free_aligned(buf);
    if (ret < 0)
        return vdi_error(err, ret, "Error writing header");
    if (is_static) {
        uint64_t end = VDI_HEADER_SIZE + map + (uint64_t)blocks * VDI_BLOCK;
        ret = bi_truncate(f, end, false, BI_PREALLOC_OFF, err);
        if (ret < 0) {
            bi_error_prefix(err, "Failed to statically allocate file");
            return ret;
        }
    }
    ret = bi_flush(f);
    return ret < 0 ? vdi_error(err, ret, "Error writing header") : 0;
}

int vdi_create(const char *filename, const struct bi_create_opts *o,
               bi_error *err)
{
    bool is_static;
    int ret = parse_opts(o, &is_static, err);
    if (ret < 0)
        return ret;
    if (o->backing_file)
        return vdi_error(err, -ENOTSUP,
                         "Backing file not supported for file format 'vdi'");
    if (o->size > VDI_DISK_SIZE_MAX)
        return vdi_error(err, -ENOTSUP,
                         "Unsupported VDI image size (size is 0x%" PRIx64
                         ", max supported is 0x%" PRIx64 ")",
                         o->size, VDI_DISK_SIZE_MAX);
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
    ret = write_image(f, o->size, is_static, err);
    bi_error e2;
    bi_error_init(&e2);
    int cret = bi_close(f, &e2);
    if (ret == 0 && cret < 0)
        ret = vdi_error(err, cret, "Error writing header");
    return ret;
}
