/* SPDX-License-Identifier: MIT */
/*
 * vmdk: probe, sparse headers (VMDK 4 and 3), the descriptor and its
 * extents, open/close, info and the driver table. Every header field and
 * table entry is checked against the file before it is used; the messages
 * are QEMU 7.2's where QEMU refuses the image, blkimg's own (in the same
 * style) where QEMU would read past the end of a file.
 */
#include "vmdk.h"
#include "util/util.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* The 75-byte VMDK 4 header after the magic (offsets from the magic). */
enum {
    H4_VERSION = 4,
    H4_FLAGS = 8,
    H4_CAPACITY = 12,
    H4_GRANULARITY = 20,
    H4_DESC_OFFSET = 28,
    H4_DESC_SIZE = 36,
    H4_NUM_GTES = 44,
    H4_RGD_OFFSET = 48,
    H4_GD_OFFSET = 56,
    H4_GRAIN_OFFSET = 64,
    H4_COMPRESS = 77,
    H4_END = 79,
};
enum { MARKER_EOS = 0, MARKER_FOOTER = 3 };
/* Descriptor text QEMU reads at most (1 MiB - 1). */
#define DESC_READ_MAX ((1u << 20) - 1)

static uint64_t ld_le64(const uint8_t *p)
{
    return bi_ld_le32(p) | (uint64_t)bi_ld_le32(p + 4) << 32;
}

/* ---------------------------------------------------------------- probe */

/* A line of a text descriptor that QEMU takes for its first: "version=N"
 * with N 1..3, ended by LF or CR LF. p has n bytes. */
static bool version_line(const uint8_t *p, size_t n)
{
    if (n < 10 || memcmp(p, "version=", 8) || p[8] < '1' || p[8] > '3')
        return false;
    return p[9] == '\n' || (n >= 11 && p[9] == '\r' && p[10] == '\n');
}

/* QEMU's heuristic for a descriptor file (monolithicFlat, twoGbMaxExtent*,
 * vmfs ...): comment lines ('#' to LF) and blank lines (one or more
 * spaces, an optional CR, LF) may come first; the first other line must
 * be a version line. An empty line (a bare LF) ends the search: not vmdk.
 * Looks at no byte beyond buf[len - 1]. */
static bool descriptor_text(const uint8_t *buf, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (buf[i] == '#') {
            while (i < len && buf[i] != '\n')
                i++;
            i++; /* past the LF (or past the end: the loop stops) */
        } else if (buf[i] == ' ') {
            while (i < len && buf[i] == ' ')
                i++;
            if (i < len && buf[i] == '\r')
                i++;
            if (i == len || buf[i] != '\n')
                return false;
            i++;
        } else {
            return version_line(buf + i, len - i);
        }
    }
    return false;
}

/* Sparse extents start with "KDMV" (VMDK 4: monolithicSparse,
 * streamOptimized, twoGbMaxExtentSparse) or "COWD" (VMDK 3, vmfsSparse);
 * otherwise the file may be a text descriptor. */
static int vmdk_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    if (len < 4)
        return 0;
    if (!memcmp(buf, "KDMV", 4) || !memcmp(buf, "COWD", 4))
        return 100;
    return descriptor_text(buf, len) ? 100 : 0;
}

/* ----------------------------------------------------------- extents */

/* Appends a zeroed extent on file (guest range after the last one). */
static struct vmdk_extent *add_extent(vmdk_state *s, bi_node *file,
                                      bool own_file, uint64_t len)
{
    s->ext = realloc(s->ext, sizeof(*s->ext) * (size_t)(s->n_ext + 1));
    if (!s->ext)
        abort();
    struct vmdk_extent *e = &s->ext[s->n_ext];
    memset(e, 0, sizeof(*e));
    e->file = file;
    e->own_file = own_file;
    e->start = s->n_ext ? e[-1].start + e[-1].len : 0;
    e->len = len;
    e->file_size = file ? file->size : 0;
    s->n_ext++;
    return e;
}

static void free_extent(struct vmdk_extent *e)
{
    free(e->gd);
    free(e->rgd);
    vmdk_gt_cache_free(e);
    if (e->own_file && e->file) {
        if (e->file->drv->close)
            e->file->drv->close(e->file);
        bi_node_free(e->file);
    }
}

/* Reads a directory of count 32-bit entries at byte off of e's file,
 * which must lie inside it. */
static int read_dir(struct vmdk_extent *e, uint64_t off, uint32_t count,
                    uint32_t **out, const char *what, bi_error *err)
{
    uint64_t bytes = (uint64_t)count * 4;
    if (off > e->file_size || bytes > e->file_size - off)
        return bi_error_setc(
            err, -EINVAL, "%s of extent '%s' lies beyond the end of the file",
            what, e->file->filename);
    uint32_t *t = malloc(bytes ? bytes : 4);
    if (!t)
        return -ENOMEM;
    int ret = bi_co_pread(e->file, off, t, bytes);
    if (ret < 0) {
        free(t);
        return bi_error_setc(err, ret, "Could not read %s from extent '%s': %s",
                             what, e->file->filename, strerror(-ret));
    }
    for (uint32_t i = 0; i < count; i++)
        t[i] = le32toh(t[i]);
    *out = t;
    return 0;
}

/* Every grain table the directory names must lie inside the file. */
static int check_gts(struct vmdk_extent *e, bi_error *err)
{
    uint64_t gt_bytes = (uint64_t)e->gt_entries * 4;
    for (uint32_t i = 0; i < e->gd_entries; i++) {
        uint64_t off = (uint64_t)e->gd[i] * VMDK_SECTOR;
        if (e->gd[i] && (off > e->file_size || gt_bytes > e->file_size - off))
            return bi_error_setc(err, -EINVAL,
                                 "Grain table %" PRIu32 " of extent '%s' lies "
                                 "beyond the end of the file",
                                 i, e->file->filename);
    }
    return 0;
}

/* The checks QEMU's vmdk_add_extent makes, then the sizes; capacity and
 * grain in sectors. */
static int sparse_geometry(struct vmdk_extent *e, uint64_t capacity,
                           uint64_t grain, uint32_t gtes, bi_error *err)
{
    if (grain > VMDK_MAX_GRAIN_SECTORS)
        return bi_error_setc(err, -EFBIG,
                             "Invalid granularity, image may be corrupt");
    uint64_t span = (uint64_t)gtes * grain;
    uint64_t gd = (capacity + span - 1) / span;
    if (capacity > UINT64_MAX - span || gd > VMDK_MAX_GD_ENTRIES)
        return bi_error_setc(err, -EFBIG, "L1 size too big");
    uint64_t before = e->start;
    if (capacity > (INT64_MAX - before) / VMDK_SECTOR)
        return bi_error_setc(err, -EFBIG, "Image size too big");
    e->len = capacity * VMDK_SECTOR;
    e->grain = grain * VMDK_SECTOR;
    e->gt_entries = gtes;
    e->gd_entries = (uint32_t)gd;
    e->next_grain = bi_align_up(e->file_size, e->grain);
    return 0;
}

/* Reads the GD (and, for a writable image, the redundant one). */
static int sparse_tables(bi_node *n, struct vmdk_extent *e, uint64_t gd_off,
                         uint64_t rgd_off, bi_error *err)
{
    int ret = read_dir(e, gd_off, e->gd_entries, &e->gd, "l1 table", err);
    if (ret == 0)
        ret = check_gts(e, err);
    if (ret == 0 && rgd_off && !n->read_only)
        ret = read_dir(e, rgd_off, e->gd_entries, &e->rgd, "l1 backup table",
                       err);
    return ret;
}

/* The footer of a stream whose GD is at its end: footer marker, a header
 * copy, end-of-stream marker, in the last three sectors but one (QEMU
 * reads it at size - 1536). Replaces hdr (magic included) with it. */
static int read_footer(struct vmdk_extent *e, uint8_t *hdr, bi_error *err)
{
    uint64_t size = bi_align_up(e->file_size, VMDK_SECTOR);
    uint8_t f[1536];
    if (size < sizeof(f))
        return bi_error_setc(err, -EINVAL, "Invalid footer");
    int ret = bi_co_pread(e->file, size - sizeof(f), f, sizeof(f));
    if (ret < 0)
        return bi_error_setc(err, ret, "Failed to read footer: %s",
                             strerror(-ret));
    const uint8_t *fm = f, *h = f + 512, *eos = f + 1024;
    if (bi_ld_be32(h) != VMDK4_MAGIC_BE || bi_ld_le32(fm + 8) != 0 ||
        bi_ld_le32(fm + 12) != MARKER_FOOTER || ld_le64(eos) != 0 ||
        bi_ld_le32(eos + 8) != 0 || bi_ld_le32(eos + 12) != MARKER_EOS)
        return bi_error_setc(err, -EINVAL, "Invalid footer");
    memcpy(hdr, h, H4_END);
    return 0;
}

static int open_desc_text(bi_node *n, char *desc, const struct bi_open_opts *o,
                          int depth, bi_error *err);
static int read_desc(bi_node *file, uint64_t off, char **out, bi_error *err);

/* Checks a VMDK 4 header's version and table sizes as QEMU does. */
static int check_vmdk4(bi_node *n, const uint8_t *h, bool compressed,
                       bi_error *err)
{
    uint32_t version = bi_ld_le32(h + H4_VERSION);
    if (version > 3)
        return bi_error_setc(err, -ENOTSUP, "Unsupported VMDK version %" PRIu32,
                             version);
    if (version == 3 && !n->read_only && !compressed)
        return bi_error_setc(err, -EINVAL, "VMDK version 3 must be read only");
    if (bi_ld_le32(h + H4_NUM_GTES) > 512)
        return bi_error_setc(err, -EINVAL, "L2 table size too big");
    if ((uint64_t)bi_ld_le32(h + H4_NUM_GTES) * ld_le64(h + H4_GRANULARITY) ==
        0)
        return bi_error_setc(err, -EINVAL, "L1 entry size is invalid");
    return 0;
}

/* Fills extent e from VMDK 4 header h (magic included): QEMU's checks,
 * then the directories, which must lie inside the file. */
static int vmdk4_extent(bi_node *n, struct vmdk_extent *e, const uint8_t *h,
                        bi_error *err)
{
    vmdk_state *s = n->opaque;
    bool compressed = (h[H4_COMPRESS] | h[H4_COMPRESS + 1] << 8) == 1;
    int ret = check_vmdk4(n, h, compressed, err);
    if (ret < 0)
        return ret;
    uint32_t flags = bi_ld_le32(h + H4_FLAGS);
    uint64_t grain_off = ld_le64(h + H4_GRAIN_OFFSET);
    uint64_t sectors = bi_align_up(e->file_size, VMDK_SECTOR) / VMDK_SECTOR;
    if (sectors < grain_off)
        return bi_error_setc(err, -EINVAL,
                             "File truncated, expecting at least %" PRId64
                             " bytes",
                             (int64_t)(grain_off * VMDK_SECTOR));
    ret = sparse_geometry(e, ld_le64(h + H4_CAPACITY),
                          ld_le64(h + H4_GRANULARITY),
                          bi_ld_le32(h + H4_NUM_GTES), err);
    if (ret < 0)
        return ret;
    e->data_start = grain_off * VMDK_SECTOR;
    e->compressed = compressed;
    if (compressed)
        snprintf(s->create_type, sizeof(s->create_type), "streamOptimized");
    e->has_marker = (flags & VMDK4_FLAG_MARKER) != 0;
    e->zero_grain = (flags & VMDK4_FLAG_ZERO_GRAIN) != 0;
    e->version = (int)bi_ld_le32(h + H4_VERSION);
    uint64_t gd = ld_le64(h + H4_GD_OFFSET), rgd = ld_le64(h + H4_RGD_OFFSET);
    if (!(flags & VMDK4_FLAG_RGD))
        rgd = 0;
    if (gd > sectors || rgd > sectors)
        return bi_error_setc(err, -EINVAL,
                             "l1 table of extent '%s' lies beyond the end of "
                             "the file",
                             e->file->filename);
    return sparse_tables(n, e, gd * VMDK_SECTOR, rgd * VMDK_SECTOR, err);
}

/* A hosted sparse extent ("KDMV") on file (the header from the footer if
 * the GD is at the end of a stream); a header of capacity 0 that points
 * to a descriptor makes the file a descriptor (depth 0 only). */
static int open_vmdk4(bi_node *n, bi_node *file, bool own,
                      const struct bi_open_opts *o, int depth, bi_error *err)
{
    vmdk_state *s = n->opaque;
    uint8_t h[H4_END];
    int ret = bi_co_pread(file, 0, h, sizeof(h));
    if (ret < 0)
        return bi_error_setc(err, -EINVAL,
                             "Could not read header from file '%s': %s",
                             file->filename, strerror(-ret));
    uint64_t desc_off = ld_le64(h + H4_DESC_OFFSET);
    if (ld_le64(h + H4_CAPACITY) == 0 && desc_off) {
        if (depth > 0 || desc_off > file->size / VMDK_SECTOR)
            return bi_error_setc(err, -EINVAL, "invalid VMDK image descriptor");
        char *desc = NULL;
        ret = read_desc(file, desc_off * VMDK_SECTOR, &desc, err);
        if (ret == 0)
            ret = open_desc_text(n, desc, o, depth + 1, err);
        free(desc);
        return ret;
    }
    if (!s->create_type[0])
        snprintf(s->create_type, sizeof(s->create_type), "monolithicSparse");
    struct vmdk_extent *e = add_extent(s, file, own, 0);
    if (ld_le64(h + H4_GD_OFFSET) == VMDK4_GD_AT_END)
        ret = read_footer(e, h, err);
    if (ret == 0)
        ret = vmdk4_extent(n, e, h, err);
    if (ret < 0) {
        e->own_file = false; /* the caller closes the file */
        free_extent(e);
        s->n_ext--;
    }
    return ret;
}

/* A VMDK 3 ("COWD") sparse extent: 4096-entry grain tables. */
static int open_vmdk3(bi_node *n, bi_node *file, bool own, bi_error *err)
{
    vmdk_state *s = n->opaque;
    uint8_t h[44];
    int ret = bi_co_pread(file, 0, h, sizeof(h));
    if (ret < 0)
        return bi_error_setc(err, -EINVAL,
                             "Could not read header from file "
                             "'%s': %s",
                             file->filename, strerror(-ret));
    struct vmdk_extent *e = add_extent(s, file, own, 0);
    uint64_t grain = bi_ld_le32(h + 16);
    uint32_t gd_entries = bi_ld_le32(h + 24);
    if (grain == 0) {
        ret = bi_error_setc(err, -EINVAL, "L1 entry size is invalid");
        goto fail;
    }
    ret = sparse_geometry(e, bi_ld_le32(h + 12), grain, 4096, err);
    if (ret == 0 && gd_entries > VMDK_MAX_GD_ENTRIES)
        ret = bi_error_setc(err, -EFBIG, "L1 size too big");
    if (ret < 0)
        goto fail;
    e->gd_entries = gd_entries; /* QEMU takes the header's count */
    e->data_start = VMDK_SECTOR;
    ret =
        sparse_tables(n, e, (uint64_t)bi_ld_le32(h + 20) * VMDK_SECTOR, 0, err);
    if (ret == 0)
        return 0;
fail:
    e->own_file = false;
    free_extent(e);
    s->n_ext--;
    return ret;
}

/* A sparse extent: by its magic. */
static int open_sparse(bi_node *n, bi_node *file, bool own,
                       const struct bi_open_opts *o, int depth, bi_error *err)
{
    uint8_t m[4] = {0};
    if (file->size < 4)
        return bi_error_setc(err, -EINVAL,
                             "File is too small, not a valid image");
    int ret = bi_co_pread(file, 0, m, 4);
    if (ret < 0)
        return bi_error_setc(err, ret, "Could not read from file: %s",
                             strerror(-ret));
    if (bi_ld_be32(m) == VMDK4_MAGIC_BE)
        return open_vmdk4(n, file, own, o, depth, err);
    if (bi_ld_be32(m) == VMDK3_MAGIC_BE)
        return open_vmdk3(n, file, own, err);
    return bi_error_setc(err, -EINVAL, "Image not in VMDK format");
}

/* -------------------------------------------------------- descriptor */

/* The descriptor text at off of file, up to QEMU's 1 MiB, NUL-ended. */
static int read_desc(bi_node *file, uint64_t off, char **out, bi_error *err)
{
    uint64_t size = file->size;
    if (size < 4)
        return bi_error_setc(err, -EINVAL,
                             "File is too small, not a valid image");
    size = BI_MIN(size, (uint64_t)DESC_READ_MAX);
    char *buf = malloc(size + 1);
    if (!buf)
        return -ENOMEM;
    int ret = bi_co_pread(file, off, buf, size);
    if (ret < 0) {
        free(buf);
        return bi_error_setc(err, ret, "Could not read from file: %s",
                             strerror(-ret));
    }
    buf[size] = 0;
    *out = buf;
    return 0;
}

/* QEMU's lookup of name="value" anywhere in desc: false if absent, not
 * quoted to an end, or longer than size - 1. */
static bool desc_value(const char *desc, const char *name, char *buf,
                       size_t size)
{
    const char *end = desc + strlen(desc);
    const char *p = strstr(desc, name);
    if (!p)
        return false;
    p += strlen(name) + 2; /* past =" */
    if (p >= end)
        return false;
    const char *q = memchr(p, '"', (size_t)(end - p));
    if (!q || (size_t)(q - p) + 1 > size)
        return false;
    memcpy(buf, p, (size_t)(q - p));
    buf[q - p] = 0;
    return true;
}

/* The directory part of path, '/' included ("" for none). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? bi_xasprintf("%.*s", (int)(slash - path + 1), path)
                 : bi_xstrdup("");
}

/* Opens the file an extent line names, relative to the descriptor. */
static bi_node *open_extent_file(bi_node *n, const char *fname, bool flat,
                                 const struct bi_open_opts *o, bi_error *err)
{
    char *dir = dir_of(n->file->filename);
    char *path =
        fname[0] == '/' ? bi_xstrdup(fname) : bi_xasprintf("%s%s", dir, fname);
    struct bi_open_opts eo;
    bi_open_opts_init(&eo);
    if (o)
        eo = *o;
    eo.format = NULL;
    eo.protocol_opts = NULL;
    eo.driver_opts = NULL;
    eo.read_write = !n->read_only;
    bi_error e;
    bi_error_init(&e);
    bi_node *f = bi_open_protocol(path, &eo, &e);
    /* QEMU's locks: a file with metadata as the image's own file; a flat
     * one (data only) lets others write, not resize */
    unsigned perm = BI_PERM_CONSISTENT_READ |
                    (eo.read_write ? BI_PERM_WRITE : 0) |
                    (eo.read_write && !flat ? BI_PERM_RESIZE : 0);
    unsigned shared =
        BI_PERM_ALL & ~(BI_PERM_RESIZE | (flat ? 0 : BI_PERM_WRITE));
    if (f && bi_node_set_perm(f, perm, shared, &e) < 0) {
        if (f->drv->close)
            f->drv->close(f);
        bi_node_free(f);
        f = NULL;
    }
    if (!f) /* "Could not open '<path>': <cause>", as QEMU's */
        bi_error_setc(err, e.code ? e.code : -EIO, "%s", e.msg);
    free(dir);
    free(path);
    return f;
}

/* One extent line that names a file (FLAT, VMFS, SPARSE, VMFSSPARSE). */
static int add_file_extent(bi_node *n, const char *type, int64_t sectors,
                           const char *fname, int64_t flat_off,
                           const struct bi_open_opts *o, int depth,
                           bi_error *err)
{
    vmdk_state *s = n->opaque;
    bool flat = !strcmp(type, "FLAT") || !strcmp(type, "VMFS");
    if (!flat && !strcmp(type, "SESPARSE"))
        return bi_error_setc(err, -ENOTSUP, "Unsupported extent type '%s'",
                             type);
    bi_node *f = open_extent_file(n, fname, flat, o, err);
    if (!f)
        return err && err->code ? err->code : -EIO;
    int ret = 0;
    if (flat) {
        struct vmdk_extent *e =
            add_extent(s, f, true, (uint64_t)sectors * VMDK_SECTOR);
        e->flat = true;
        e->flat_offset = (uint64_t)flat_off * VMDK_SECTOR;
    } else {
        ret = open_sparse(n, f, true, o, depth, err);
    }
    if (ret < 0) {
        if (f->drv->close)
            f->drv->close(f);
        bi_node_free(f);
        return ret;
    }
    snprintf(s->ext[s->n_ext - 1].type, sizeof(s->ext[0].type), "%s", type);
    return 0;
}

/* A ZERO extent: reads as zeroes (VMware's meaning; QEMU 7.2 skips the
 * line, which shifts the extents after it). */
static void add_zero_extent(vmdk_state *s, int64_t sectors)
{
    struct vmdk_extent *e =
        add_extent(s, NULL, false, (uint64_t)sectors * VMDK_SECTOR);
    e->flat = true;
    snprintf(e->type, sizeof(e->type), "ZERO");
}

static const char *next_line(const char *p)
{
    const char *nl = strchr(p, '\n');
    return nl ? nl + 1 : p + strlen(p);
}

/* "Invalid extent line: <the line without its LF>". */
static int invalid_line(const char *p, bi_error *err)
{
    const char *np = next_line(p);
    if (np > p && np[-1] == '\n')
        np--;
    return bi_error_setc(err, -EINVAL, "Invalid extent line: %.*s",
                         (int)(np - p), p);
}

/* Parses the extent lines as QEMU does: "RW <sectors> <type> "<file>"
 * [<offset>]"; other lines, other access words and unknown types are
 * skipped; a FLAT line needs its offset. */
static int parse_extents(bi_node *n, const char *desc,
                         const struct bi_open_opts *o, int depth, bi_error *err)
{
    vmdk_state *s = n->opaque;
    for (const char *p = desc; *p; p = next_line(p)) {
        char access[11], type[11], fname[512];
        int64_t sectors = 0, flat_off = -1;
        int m = sscanf(p, "%10s %" SCNd64 " %10s \"%511[^\n\r\"]\" %" SCNd64,
                       access, &sectors, type, fname, &flat_off);
        if (m >= 3 && !strcmp(access, "RW") && !strcmp(type, "ZERO")) {
            if (sectors <= 0 || (uint64_t)sectors > INT64_MAX / VMDK_SECTOR)
                return invalid_line(p, err);
            add_zero_extent(s, sectors);
            continue;
        }
        if (m < 4 || strcmp(access, "RW"))
            continue;
        if (!strcmp(type, "FLAT")) {
            if (m != 5 || flat_off < 0)
                return invalid_line(p, err);
        } else if (!strcmp(type, "VMFS")) {
            if (m != 4)
                return invalid_line(p, err);
            flat_off = 0;
        } else if (m != 4) {
            return invalid_line(p, err);
        }
        if (sectors <= 0 ||
            (strcmp(type, "FLAT") && strcmp(type, "SPARSE") &&
             strcmp(type, "VMFS") && strcmp(type, "VMFSSPARSE") &&
             strcmp(type, "SESPARSE")))
            continue;
        if ((uint64_t)sectors > INT64_MAX / VMDK_SECTOR ||
            (flat_off > 0 && (uint64_t)flat_off > INT64_MAX / VMDK_SECTOR))
            return invalid_line(p, err);
        int ret =
            add_file_extent(n, type, sectors, fname, flat_off, o, depth, err);
        if (ret < 0)
            return ret;
        struct vmdk_extent *e = &s->ext[s->n_ext - 1];
        if (e->start + e->len > INT64_MAX - VMDK_SECTOR)
            return bi_error_setc(err, -EFBIG, "Image size too big");
    }
    return 0;
}

/* A descriptor (its own file, or pointed to by an empty sparse header). */
static int open_desc_text(bi_node *n, char *desc, const struct bi_open_opts *o,
                          int depth, bi_error *err)
{
    static const char *const types[] = {
        "monolithicFlat",       "vmfs",
        "vmfsSparse",           "seSparse",
        "twoGbMaxExtentSparse", "twoGbMaxExtentFlat",
    };
    vmdk_state *s = n->opaque;
    char ct[128];
    if (!desc_value(desc, "createType", ct, sizeof(ct)))
        return bi_error_setc(err, -EINVAL, "invalid VMDK image descriptor");
    bool known = false;
    for (size_t i = 0; i < BI_ARRAY_SIZE(types); i++)
        known |= !strcmp(ct, types[i]);
    if (!known)
        return bi_error_setc(err, -ENOTSUP, "Unsupported image type '%s'", ct);
    snprintf(s->create_type, sizeof(s->create_type), "%s", ct);
    s->desc_offset = 0;
    return parse_extents(n, desc, o, depth, err);
}

/* ---------------------------------------------------- CIDs and parent */

/* The 20 descriptor sectors QEMU reads the CIDs and the parent from. */
static char *read_desc_sectors(bi_node *n)
{
    vmdk_state *s = n->opaque;
    char *d = bi_xzalloc(VMDK_DESC_SIZE + 1);
    if (bi_co_pread(n->file, s->desc_offset, d, VMDK_DESC_SIZE) < 0) {
        free(d);
        return NULL;
    }
    d[VMDK_DESC_SIZE - 1] = 0;
    return d;
}

/* "CID=<hex>" or "parentCID=<hex>": the first occurrence of the word. */
static bool desc_cid(const char *d, const char *word, uint32_t *out)
{
    const char *p = strstr(d, word);
    unsigned int v;
    if (!p || sscanf(p + strlen(word) + 1, "%x", &v) != 1)
        return false;
    *out = v;
    return true;
}

/* parentFileNameHint="<name>" names the backing file (format vmdk). */
static int read_parent(bi_node *n, const char *d)
{
    const char *p = strstr(d, "parentFileNameHint");
    if (!p)
        return 0;
    p += strlen("parentFileNameHint") + 2;
    const char *q = strchr(p, '"');
    if (!q || q - p > 4095)
        return -EINVAL;
    free(n->backing_filename);
    free(n->backing_format);
    n->backing_filename = bi_xasprintf("%.*s", (int)(q - p), p);
    n->backing_format = bi_xstrdup("vmdk");
    return 0;
}

static int read_cids(bi_node *n, bi_error *err)
{
    vmdk_state *s = n->opaque;
    char *d = read_desc_sectors(n);
    int ret = d ? read_parent(n, d) : -EIO;
    if (ret == 0 && (!desc_cid(d, "CID", &s->cid) ||
                     !desc_cid(d, "parentCID", &s->parent_cid)))
        ret = -EINVAL;
    free(d);
    if (ret < 0)
        bi_error_setc(err, ret, "Could not open '%s': %s", n->filename,
                      strerror(-ret));
    return ret;
}

uint32_t vmdk_random_cid(void)
{
    uint32_t v;
    if (getrandom(&v, sizeof(v), 0) != sizeof(v))
        v = (uint32_t)random();
    return v;
}

int vmdk_update_cid(bi_node *n)
{
    vmdk_state *s = n->opaque;
    char *d = read_desc_sectors(n);
    if (!d)
        return -EIO;
    char *pc = strstr(d, "parentCID");
    char *c = strstr(d, "CID");
    int ret = -EINVAL;
    if (pc && c) {
        char *tail = bi_xstrdup(pc);
        uint32_t cid = vmdk_random_cid();
        c += 4;
        snprintf(c, (size_t)(VMDK_DESC_SIZE - (c - d)), "%" PRIx32 "\n%s", cid,
                 tail);
        free(tail);
        /* QEMU's write stops at the file's last sector */
        uint64_t end = bi_align_up(n->file->size, VMDK_SECTOR);
        uint64_t l = end > s->desc_offset
                         ? BI_MIN(VMDK_DESC_SIZE, end - s->desc_offset)
                         : 0;
        ret = bi_co_pwrite(n->file, s->desc_offset, d, l, 0);
        if (ret == 0)
            ret = bi_co_flush(n->file);
        if (ret == 0)
            s->cid = cid;
    }
    free(d);
    return ret;
}

/* ------------------------------------------------------------- open */

static int vmdk_do_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    vmdk_state *s = n->opaque;
    s->node = n;
    bi_co_mutex_init(&s->lock);
    bi_co_queue_init(&s->comp_wait);
    char *buf = NULL;
    int ret = read_desc(n->file, 0, &buf, err);
    if (ret < 0)
        return ret;
    uint32_t magic = bi_ld_be32(buf);
    if (magic == VMDK4_MAGIC_BE || magic == VMDK3_MAGIC_BE) {
        ret = open_sparse(n, n->file, false, o, 0, err);
        s->desc_offset = 0x200;
    } else {
        ret = open_desc_text(n, buf, o, 0, err);
    }
    free(buf);
    if (ret == 0)
        ret = read_cids(n, err);
    if (ret < 0)
        return ret;
    n->size =
        s->n_ext ? s->ext[s->n_ext - 1].start + s->ext[s->n_ext - 1].len : 0;
    return 0;
}

static void vmdk_free_state(bi_node *n)
{
    vmdk_state *s = n->opaque;
    for (int i = 0; i < s->n_ext; i++)
        free_extent(&s->ext[i]);
    free(s->ext);
    s->ext = NULL;
    s->n_ext = 0;
}

static int vmdk_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    return bi_run_co_open(vmdk_do_open, vmdk_free_state, n, o, err);
}

static void vmdk_close(bi_node *n)
{
    if (n->opaque)
        vmdk_free_state(n);
}

/* ---------------------------------------------------------- properties */

static void vmdk_refresh_limits(bi_node *n)
{
    vmdk_state *s = n->opaque;
    n->limits = n->file->limits;
    for (int i = 0; s && i < s->n_ext; i++) {
        const bi_node *f = s->ext[i].file;
        if (!f)
            continue;
        n->limits.min_mem_alignment =
            BI_MAX(n->limits.min_mem_alignment, f->limits.min_mem_alignment);
        n->limits.opt_mem_alignment =
            BI_MAX(n->limits.opt_mem_alignment, f->limits.opt_mem_alignment);
    }
    bi_limits_any_range(&n->limits, 0);
}

/* QEMU's cluster size: that of the first extent when it is sparse and all
 * extents are of its kind (flatness, compression, grain size). */
static uint64_t common_grain(const vmdk_state *s)
{
    if (!s->n_ext || s->ext[0].flat)
        return 0;
    for (int i = 1; i < s->n_ext; i++) {
        const struct vmdk_extent *a = &s->ext[0], *b = &s->ext[i];
        if (a->flat != b->flat || a->compressed != b->compressed ||
            a->grain != b->grain)
            return 0;
    }
    return s->ext[0].grain;
}

/* The grain is the allocation unit; writes to sparse extents of mixed
 * grain sizes are serialised at the largest. */
static void vmdk_get_geometry(bi_node *n, struct bi_geometry *g)
{
    vmdk_state *s = n->opaque;
    g->cluster_size = common_grain(s);
    g->compressed_writes_only =
        s->n_ext && s->ext[0].compressed && g->cluster_size;
    for (int i = 0; !g->cluster_size && i < s->n_ext; i++)
        g->cluster_size = BI_MAX(g->cluster_size, s->ext[i].grain);
}

static int64_t vmdk_allocated_size(bi_node *n)
{
    vmdk_state *s = n->opaque;
    int64_t total = bi_allocated_file_size(n->file);
    for (int i = 0; total >= 0 && i < s->n_ext; i++) {
        if (!s->ext[i].own_file)
            continue;
        int64_t r = bi_allocated_file_size(s->ext[i].file);
        total = r < 0 ? r : total + r;
    }
    return total;
}

static int vmdk_co_flush(bi_node *n)
{
    vmdk_state *s = n->opaque;
    for (int i = 0; i < s->n_ext; i++) {
        if (s->ext[i].own_file && !n->read_only) {
            int ret = bi_co_flush(s->ext[i].file);
            if (ret < 0)
                return ret;
        }
    }
    return 0;
}

/* qemu's VmdkExtentInfo, in its member order. */
static bi_value *extent_value(const struct vmdk_extent *e)
{
    bi_value *v = bi_value_object();
    if (e->compressed)
        bi_value_set_bool(v, "compressed", true);
    bi_value_set_uint(v, "virtual-size", e->len);
    bi_value_set_string(v, "filename", e->file ? e->file->filename : "");
    if (!e->flat)
        bi_value_set_uint(v, "cluster-size", e->grain);
    bi_value_set_string(v, "format", e->type);
    return v;
}

/* qemu's ImageInfoSpecificVmdk. */
static int vmdk_get_info(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    (void)err;
    vmdk_state *s = n->opaque;
    bi_value *d = bi_value_object();
    bi_value_set_uint(d, "cid", s->cid);
    bi_value_set_uint(d, "parent-cid", s->parent_cid);
    bi_value_set_string(d, "create-type", s->create_type);
    bi_value *list = bi_value_array();
    for (int i = 0; i < s->n_ext; i++)
        bi_value_append(list, extent_value(&s->ext[i]));
    bi_value_set(d, "extents", list);
    info->specific = d;
    info->has_dirty_flag = true;
    return 0;
}

const struct bi_driver bi_drv_vmdk = {
    .name = "vmdk",
    .state_size = sizeof(vmdk_state),
    .probe = vmdk_probe,
    .open = vmdk_open,
    .close = vmdk_close,
    .create = vmdk_create,
    .create_opts = vmdk_create_opts,
    .refresh_limits = vmdk_refresh_limits,
    .co_map = vmdk_co_map,
    .co_write_done = vmdk_co_write_done,
    .co_read_compressed = vmdk_co_read_compressed,
    .co_pwrite_compressed = vmdk_co_pwrite_compressed,
    .get_geometry = vmdk_get_geometry,
    .co_pwrite_zeroes = vmdk_co_pwrite_zeroes,
    .co_flush = vmdk_co_flush,
    .co_block_status = vmdk_co_block_status,
    .get_allocated_file_size = vmdk_allocated_size,
    .get_info = vmdk_get_info,
    .check = vmdk_check,
};
