/* SPDX-License-Identifier: MIT */
/*
 * vmdk creation as qemu-img 7.2 creates it: the same files (names,
 * headers, directories, descriptor text; only the random CID differs) for
 * every subformat, and its option table for the "Formatting" line.
 */
#include "util/util.h"
#include "vmdk.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* QEMU 7.2's options, in its order. */
const struct bi_opt_desc vmdk_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"adapter_type", BI_OPT_STRING,
     "Virtual adapter type, can be one of ide (default), lsilogic, buslogic "
     "or legacyESX",
     NULL, 0},
    {"backing_file", BI_OPT_STRING, "File name of a base image", NULL, 0},
    {"backing_fmt", BI_OPT_STRING, "Must be 'vmdk' if present", NULL, 0},
    {"compat6", BI_OPT_BOOL, "VMDK version 6 image", "off", 0},
    {"hwversion", BI_OPT_STRING, "VMDK hardware version", "undefined", 0},
    {"toolsversion", BI_OPT_STRING, "VMware guest tools version", NULL, 0},
    {"subformat", BI_OPT_STRING,
     "VMDK flat extent format, can be one of {monolithicSparse (default) | "
     "monolithicFlat | twoGbMaxExtentSparse | twoGbMaxExtentFlat | "
     "streamOptimized} ",
     NULL, 0},
    {"zeroed_grain", BI_OPT_BOOL,
     "Enable efficient zero writes using the zeroed-grain GTE feature", NULL,
     0},
    {NULL, 0, NULL, NULL, 0},
};

enum sub { MONO_SPARSE, MONO_FLAT, SPLIT_SPARSE, SPLIT_FLAT, STREAM };
static const char *const sub_names[] = {
    "monolithicSparse",   "monolithicFlat",  "twoGbMaxExtentSparse",
    "twoGbMaxExtentFlat", "streamOptimized",
};
static const char *const adapters[] = {"ide", "buslogic", "lsilogic",
                                       "legacyESX"};
#define SPLIT_SIZE 0x80000000ULL /* twoGbMaxExtent*'s extent size */

struct vc {
    const char *filename;
    uint64_t size;
    enum sub sub;
    bool flat, split, compress, zeroed;
    const char *adapter, *hw, *tools, *backing;
    uint32_t parent_cid;
};

static const char *opt(const struct bi_create_opts *o, const char *key)
{
    return bi_opts_value(o->options, key);
}

/* The index of v in names (n of them), or -1. */
static int lookup(const char *v, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i]))
            return i;
    return -1;
}

/* The options as QEMU's vmdk_co_create_opts reads and checks them. */
static int parse(const struct bi_create_opts *o, struct vc *c, bi_error *err)
{
    const char *bfmt = o->backing_fmt ? o->backing_fmt : opt(o, "backing_fmt");
    if (bfmt && strcmp(bfmt, "vmdk"))
        return bi_error_setc(err, -EINVAL, "backing_file must be a vmdk image");
    c->size = bi_align_up(o->size, VMDK_SECTOR);
    c->adapter = opt(o, "adapter_type") ? opt(o, "adapter_type") : "ide";
    c->backing = o->backing_file ? o->backing_file : opt(o, "backing_file");
    c->hw = opt(o, "hwversion");
    if (c->hw && !strcmp(c->hw, "undefined"))
        c->hw = NULL;
    c->tools = opt(o, "toolsversion") ? opt(o, "toolsversion") : "2147483647";
    const char *compat6 = opt(o, "compat6"), *zg = opt(o, "zeroed_grain");
    c->zeroed = zg && !strcmp(zg, "on");
    if (lookup(c->adapter, adapters, 4) < 0)
        return bi_error_setc(err, -EINVAL, "invalid parameter value: %s",
                             c->adapter);
    const char *sf = opt(o, "subformat");
    int sub = sf ? lookup(sf, sub_names, 5) : MONO_SPARSE;
    if (sub < 0)
        return bi_error_setc(err, -EINVAL, "invalid parameter value: %s", sf);
    c->sub = (enum sub)sub;
    if (compat6 && !strcmp(compat6, "on")) {
        if (c->hw)
            return bi_error_setc(
                err, -EINVAL, "compat6 cannot be enabled with hwversion set");
        c->hw = "6";
    }
    if (!c->hw)
        c->hw = "4";
    c->split = c->sub == SPLIT_SPARSE || c->sub == SPLIT_FLAT;
    c->flat = c->sub == MONO_FLAT || c->sub == SPLIT_FLAT;
    c->compress = c->sub == STREAM;
    if (c->flat && c->backing)
        return bi_error_setc(err, -ENOTSUP,
                             "Flat image can't have backing file");
    if (c->flat && c->zeroed)
        return bi_error_setc(err, -ENOTSUP,
                             "Flat image can't enable zeroed grain");
    return 0;
}

/* ------------------------------------------------------- sparse extent */

static void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

/* A directory of count entries pointing at consecutive 4-sector grain
 * tables from sector first, in whole sectors, at sector at. */
static int write_gd(bi_node *f, uint64_t at, uint32_t count, uint64_t first,
                    uint64_t gd_sectors)
{
    size_t bytes = gd_sectors * VMDK_SECTOR;
    uint8_t *b = bi_xzalloc(bytes ? bytes : 1);
    for (uint32_t i = 0; i < count; i++)
        put32(b + 4 * i, (uint32_t)(first + 4 * i));
    int ret = bytes ? bi_pwrite(f, at * VMDK_SECTOR, b, bytes, 0) : 0;
    free(b);
    return ret;
}

/* QEMU's sparse extent of size bytes: header (64 KiB grains, 512-entry
 * tables, descriptor room at sectors 1-20), redundant GD and its tables,
 * GD and its tables, data from the next 64 KiB. */
static int init_sparse(bi_node *f, uint64_t size, bool compress, bool zeroed,
                       bi_error *err)
{
    uint64_t cap = size / VMDK_SECTOR, grains = (cap + 127) / 128;
    uint64_t gt_count = (grains + 511) / 512;
    uint64_t gd_sectors = (gt_count * 4 + 511) / 512;
    if (gt_count > VMDK_MAX_GD_ENTRIES)
        return bi_error_setc(err, -EFBIG, "L1 size too big");
    uint64_t rgd = 21, gd = rgd + gd_sectors + 4 * gt_count;
    uint64_t grain_off = bi_align_up(gd + gd_sectors + 4 * gt_count, 128);
    uint8_t h[79] = {'K', 'D', 'M', 'V'};
    put32(h + 4, compress ? 3 : zeroed ? 2 : 1);
    put32(h + 8, VMDK4_FLAG_RGD | VMDK4_FLAG_NL_DETECT |
                     (compress ? VMDK4_FLAG_COMPRESS | VMDK4_FLAG_MARKER : 0) |
                     (zeroed ? VMDK4_FLAG_ZERO_GRAIN : 0));
    put64(h + 12, cap);
    put64(h + 20, 128);
    put64(h + 28, 1);
    put64(h + 36, 20);
    put32(h + 44, 512);
    put64(h + 48, rgd);
    put64(h + 56, gd);
    put64(h + 64, grain_off);
    memcpy(h + 73, "\n \r\n", 4);
    h[77] = compress ? 1 : 0;
    int ret = bi_pwrite(f, 0, h, sizeof(h), 0);
    if (ret == 0)
        ret = bi_truncate(f, grain_off * VMDK_SECTOR, false, BI_PREALLOC_OFF,
                          err);
    if (ret == 0)
        ret =
            write_gd(f, rgd, (uint32_t)gt_count, rgd + gd_sectors, gd_sectors);
    if (ret == 0)
        ret = write_gd(f, gd, (uint32_t)gt_count, gd + gd_sectors, gd_sectors);
    if (ret < 0)
        bi_error_setc(err, ret, "Input/output error");
    return ret;
}

/* Creates the file path (protocol level) and opens it for writing. */
static bi_node *new_file(const char *path, bi_error *err)
{
    struct bi_create_opts fco;
    bi_create_opts_init(&fco);
    fco.format = "file";
    fco.size_set = true;
    if (bi_create_file(path, &fco, err) < 0)
        return NULL;
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.read_write = true;
    return bi_open_protocol(path, &oo, err);
}

static int close_file(bi_node *f, int ret)
{
    bi_error e;
    bi_error_init(&e);
    int r = bi_close(f, &e);
    return ret ? ret : r;
}

/* One extent file of size bytes: a flat file of that length or a sparse
 * extent. */
static int create_extent(const struct vc *c, const char *path, uint64_t size,
                         bi_error *err)
{
    bi_node *f = new_file(path, err);
    if (!f)
        return err && err->code ? err->code : -EIO;
    int ret = c->flat ? bi_truncate(f, size, false, BI_PREALLOC_OFF, err)
                      : init_sparse(f, size, c->compress, c->zeroed, err);
    return close_file(f, ret);
}

/* --------------------------------------------------------- descriptor */

/* The descriptor qemu-img writes. */
static char *desc_text(const struct vc *c, const char *extents)
{
    char *parent = c->backing
                       ? bi_xasprintf("parentFileNameHint=\"%s\"", c->backing)
                       : bi_xstrdup("");
    uint32_t heads = strcmp(c->adapter, "ide") ? 255 : 16;
    char *d = bi_xasprintf(
        "# Disk DescriptorFile\nversion=1\nCID=%" PRIx32 "\nparentCID=%" PRIx32
        "\ncreateType=\"%s\"\n%s\n# Extent description\n%s\n"
        "# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"%s\"\n"
        "ddb.geometry.cylinders = \"%" PRId64 "\"\n"
        "ddb.geometry.heads = \"%" PRIu32 "\"\n"
        "ddb.geometry.sectors = \"63\"\nddb.adapterType = \"%s\"\n"
        "ddb.toolsVersion = \"%s\"\n",
        vmdk_random_cid(), c->parent_cid, sub_names[c->sub], parent, extents,
        c->hw, (int64_t)(c->size / (63ULL * heads * VMDK_SECTOR)), heads,
        c->adapter, c->tools);
    free(parent);
    return d;
}

/* The parent's CID: it must open as a vmdk (its own parents are not
 * opened), named relative to the new image's directory. */
static int parent_cid(struct vc *c, bi_error *err)
{
    c->parent_cid = 0xffffffff;
    if (!c->backing)
        return 0;
    const char *slash = strrchr(c->filename, '/');
    char *path = c->backing[0] == '/' || !slash
                     ? bi_xstrdup(c->backing)
                     : bi_xasprintf("%.*s%s", (int)(slash - c->filename + 1),
                                    c->filename, c->backing);
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.no_backing = true;
    bi_node *b = bi_open_node(path, NULL, &oo, err);
    free(path);
    if (!b)
        return err && err->code ? err->code : -EIO;
    int ret = 0;
    if (b->drv != &bi_drv_vmdk)
        ret = bi_error_setc(err, -EINVAL,
                            "Invalid backing file format: %s. Must be vmdk",
                            b->drv->name);
    else
        c->parent_cid = ((const vmdk_state *)b->opaque)->cid;
    bi_error e;
    bi_error_init(&e);
    bi_close(b, &e);
    return ret;
}

/* The name of extent idx (1...) of a split or flat image, from the
 * descriptor's: prefix-s001.ext, prefix-f001.ext, prefix-flat.ext. */
static char *extent_name(const struct vc *c, int idx)
{
    const char *base = strrchr(c->filename, '/');
    base = base ? base + 1 : c->filename;
    const char *dot = strrchr(base, '.');
    int dir = (int)(base - c->filename);
    int stem = dot ? (int)(dot - base) : (int)strlen(base);
    const char *ext = dot ? dot : "";
    if (c->split)
        return bi_xasprintf("%.*s%.*s-%c%03d%s", dir, c->filename, stem, base,
                            c->flat ? 'f' : 's', idx, ext);
    return bi_xasprintf("%.*s%.*s-flat%s", dir, c->filename, stem, base, ext);
}

static void add_line(char **lines, const struct vc *c, uint64_t size,
                     const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *l = bi_xasprintf(c->flat ? "%sRW %" PRIu64 " FLAT \"%s\" 0\n"
                                   : "%sRW %" PRIu64 " SPARSE \"%s\"\n",
                           *lines, (uint64_t)((size + 511) / 512), base);
    free(*lines);
    *lines = l;
}

/* The extents of a flat or split image, each its own file. */
static int create_extents(const struct vc *c, char **lines, bi_error *err)
{
    uint64_t step = c->split ? SPLIT_SIZE : c->size;
    int idx = 1;
    for (uint64_t done = 0; done < c->size; done += step, idx++) {
        uint64_t cur = BI_MIN(c->size - done, step);
        char *path = extent_name(c, idx);
        int ret = create_extent(c, path, cur, err);
        if (ret == 0)
            add_line(lines, c, cur, path);
        free(path);
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* Writes the descriptor: at sector 1 of a monolithic sparse file, or as
 * the whole descriptor file. */
static int write_desc(const struct vc *c, bi_node *f, const char *lines)
{
    bool embedded = !c->split && !c->flat;
    char *d = desc_text(c, lines);
    size_t len = strlen(d);
    int ret = bi_pwrite(f, embedded ? 0x200 : 0, d, len, 0);
    bi_error e;
    bi_error_init(&e);
    if (ret == 0 && !embedded)
        ret = bi_truncate(f, len, true, BI_PREALLOC_OFF, &e);
    free(d);
    return ret;
}

int vmdk_create(const char *filename, const struct bi_create_opts *o,
                bi_error *err)
{
    struct vc c = {.filename = filename};
    int ret = parse(o, &c, err);
    if (ret < 0)
        return ret;
    bool embedded = !c.split && !c.flat;
    bi_node *f = new_file(filename, err);
    if (!f)
        return err && err->code ? err->code : -EIO;
    char *lines = bi_xstrdup("");
    if (embedded) {
        ret = init_sparse(f, c.size, c.compress, c.zeroed, err);
        if (ret == 0)
            add_line(&lines, &c, c.size, filename);
    }
    if (ret == 0)
        ret = parent_cid(&c, err);
    if (ret == 0 && !embedded)
        ret = create_extents(&c, &lines, err);
    if (ret == 0) {
        ret = write_desc(&c, f, lines);
        if (ret < 0)
            bi_error_setc(err, ret, "Could not write description: %s",
                          strerror(-ret));
    }
    free(lines);
    return close_file(f, ret);
}
