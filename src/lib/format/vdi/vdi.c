/* SPDX-License-Identifier: MIT */
/*
 * vdi: the header (QEMU 7.2's checks and words), open and close, block
 * status and the driver table. See vdi.h for the layout.
 */
#include "format/vdi/vdi.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vdi_error(bi_error *err, int code, const char *fmt, ...)
{
    char buf[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return bi_error_setc(err, code, "%s", buf);
}

static uint64_t ld_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

static bool uuid_is_null(const uint8_t *p)
{
    static const uint8_t null[16];
    return !memcmp(p, null, sizeof(null));
}

/* The checks that need nothing but the fixed fields, in QEMU's order. */
static int check_fields(const struct vdi_header *h, bi_error *err)
{
    if (h->signature != VDI_SIGNATURE) {
        vdi_error(err, -EINVAL,
                  "Image not in VDI format (bad signature %08" PRIx32 ")",
                  h->signature);
        return -EINVAL;
    }
    if (h->version != VDI_VERSION_1_1)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (version %" PRIu32 ".%" PRIu32 ")",
                  h->version >> 16, h->version & 0xffff);
    else if (h->offset_bmap % VDI_SECTOR)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (unaligned block "
                  "map offset 0x%" PRIx32 ")",
                  h->offset_bmap);
    else if (h->offset_data % VDI_SECTOR)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (unaligned data "
                  "offset 0x%" PRIx32 ")",
                  h->offset_data);
    else if (h->sector_size != VDI_SECTOR)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (sector size %" PRIu32 " is not %d)",
                  h->sector_size, VDI_SECTOR);
    else if (h->block_size != VDI_BLOCK)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (block size %" PRIu32 " is not %d)",
                  h->block_size, VDI_BLOCK);
    else
        return 0;
    return -ENOTSUP;
}

int vdi_parse_header(const uint8_t *p, struct vdi_header *h, bi_error *err)
{
    memset(h, 0, sizeof(*h));
    h->signature = bi_ld_le32(p + VH_SIGNATURE);
    h->version = bi_ld_le32(p + VH_VERSION);
    h->image_type = bi_ld_le32(p + VH_IMAGE_TYPE);
    h->offset_bmap = bi_ld_le32(p + VH_OFFSET_BMAP);
    h->offset_data = bi_ld_le32(p + VH_OFFSET_DATA);
    h->sector_size = bi_ld_le32(p + VH_SECTOR_SIZE);
    h->disk_size = ld_le64(p + VH_DISK_SIZE);
    h->block_size = bi_ld_le32(p + VH_BLOCK_SIZE);
    h->blocks = bi_ld_le32(p + VH_BLOCKS);
    h->allocated = bi_ld_le32(p + VH_ALLOCATED);
    h->link_uuid_set = !uuid_is_null(p + VH_UUID_LINK);
    h->parent_uuid_set = !uuid_is_null(p + VH_UUID_PARENT);

    /* QEMU checks the size before anything else, the stored one */
    if (h->disk_size > VDI_DISK_SIZE_MAX) {
        vdi_error(err, -ENOTSUP,
                  "Unsupported VDI image size (size is 0x%" PRIx64
                  ", max supported is 0x%" PRIx64 ")",
                  h->disk_size, VDI_DISK_SIZE_MAX);
        return -ENOTSUP;
    }
    int ret = check_fields(h, err);
    if (ret < 0)
        return ret;
    uint64_t room = (uint64_t)h->blocks * h->block_size;
    if (vdi_guest_size(h) > room)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (disk size %" PRIu64
                  ", image bitmap has room for %" PRIu64 ")",
                  vdi_guest_size(h), room);
    else if (h->link_uuid_set)
        vdi_error(err, -ENOTSUP, "unsupported VDI image (non-NULL link UUID)");
    else if (h->parent_uuid_set)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (non-NULL parent UUID)");
    else if (h->blocks > VDI_BLOCKS_MAX)
        vdi_error(err, -ENOTSUP,
                  "unsupported VDI image (too many blocks %" PRIu32
                  ", max is %" PRIu32 ")",
                  h->blocks, VDI_BLOCKS_MAX);
    else
        return 0;
    return -ENOTSUP;
}

uint64_t vdi_guest_size(const struct vdi_header *h)
{
    /* VBoxManage convertfromraw makes odd sizes; QEMU rounds them up */
    return bi_align_up(h->disk_size, VDI_SECTOR);
}

/* True if the header, the map and the data area follow one another
 * without overlapping (QEMU does not check this: a write to such an
 * image would overwrite its own metadata). */
static bool layout_sane(const struct vdi_header *h)
{
    uint64_t map_end = (uint64_t)h->offset_bmap + (uint64_t)h->blocks * 4;
    return h->offset_bmap >= VDI_HEADER_SIZE &&
           (h->blocks == 0 || map_end <= h->offset_data);
}

bool vdi_map_consistent(const vdi_state *s)
{
    const struct vdi_header *h = &s->h;
    if (!layout_sane(h) || s->next_index > h->blocks)
        return false;
    uint8_t *seen = calloc((size_t)s->next_index / 8 + 1, 1);
    if (!seen)
        return false;
    bool ok = true;
    for (uint32_t b = 0; b < h->blocks && ok; b++) {
        uint32_t e = le32toh(s->bmap[b]);
        if (!vdi_is_allocated(e))
            continue;
        ok = e < s->next_index && !(seen[e / 8] & (1u << (e % 8)));
        if (ok)
            seen[e / 8] |= (uint8_t)(1u << (e % 8));
    }
    free(seen);
    return ok;
}

/* Reads the block map. QEMU reads past the end of the file as zeroes
 * (every block then maps to host block 0); a map that does not lie in
 * the file is refused instead, so that a crafted header cannot make the
 * open allocate and read gigabytes of nothing. */
static int read_bmap(bi_node *n, vdi_state *s, bi_error *err)
{
    int64_t fsz = bi_getlength(n->file);
    if (fsz < 0) {
        bi_error_set(err, (int)fsz, "Could not read the VDI block map");
        return (int)fsz;
    }
    uint64_t need = (uint64_t)s->h.blocks * 4;
    if ((uint64_t)s->h.offset_bmap + need > (uint64_t)fsz) {
        vdi_error(err, -EINVAL,
                  "VDI block map (%" PRIu32 " entries at "
                  "offset 0x%" PRIx32 ") lies beyond the end of the file",
                  s->h.blocks, s->h.offset_bmap);
        return -EINVAL;
    }
    s->bmap_bytes = bi_align_up(need, VDI_SECTOR);
    s->bmap = bi_blockalign(n->file, s->bmap_bytes ? s->bmap_bytes : 1);
    if (!s->bmap) {
        bi_error_set(err, -ENOMEM, "Could not allocate the VDI block map");
        return -ENOMEM;
    }
    int ret = s->bmap_bytes ? bi_co_pread(n->file, s->h.offset_bmap, s->bmap,
                                          s->bmap_bytes)
                            : 0;
    if (ret < 0)
        bi_error_set(err, ret, "Could not read the VDI block map");
    return ret;
}

/* The open body, in a coroutine: the header and the block map, each
 * checked before use. */
static int vdi_do_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    (void)o;
    vdi_state *s = n->opaque;
    bi_co_mutex_init(&s->meta_lock);
    s->raw = bi_blockalign(n->file, VDI_HEADER_SIZE);
    if (!s->raw)
        return -ENOMEM;
    int ret = bi_co_pread(n->file, 0, s->raw, VDI_HEADER_SIZE);
    if (ret < 0) {
        bi_error_set(err, ret, "Could not read the VDI header");
        return ret;
    }
    ret = vdi_parse_header(s->raw, &s->h, err);
    if (ret == 0)
        ret = read_bmap(n, s, err);
    if (ret < 0)
        return ret;
    s->next_index = s->h.allocated;
    s->inconsistent = !vdi_map_consistent(s);
    n->size = vdi_guest_size(&s->h);
    return 0;
}

/* Open failures carry a message: the generic one where none was set. */
static int vdi_do_open_named(bi_node *n, const struct bi_open_opts *o,
                             bi_error *err)
{
    int ret = vdi_do_open(n, o, err);
    if (ret < 0 && err && !err->msg[0])
        bi_error_set(err, ret, "Could not open VDI image");
    return ret;
}

static void vdi_close(bi_node *n)
{
    vdi_state *s = n->opaque;
    if (!s)
        return;
    bi_free_aligned(s->raw);
    bi_free_aligned(s->bmap);
    bi_free_aligned(s->zeroes);
    s->raw = NULL;
    s->bmap = NULL;
    s->zeroes = NULL;
}

static int vdi_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    return bi_run_co_open(vdi_do_open_named, vdi_close, n, o, err);
}

/* The signature 0xbeda107f (little-endian) at offset 64 of the 512-byte
 * header; the text before it is free-form. */
static int vdi_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    return len >= VDI_HEADER_SIZE &&
                   bi_ld_le32(buf + VH_SIGNATURE) == VDI_SIGNATURE
               ? 100
               : 0;
}

static void vdi_refresh_limits(bi_node *n)
{
    n->limits = n->file->limits;
    /* any byte range maps; the file node aligns its own I/O */
    bi_limits_any_range(&n->limits, 0);
}

/* Blocks are QEMU's clusters (info's cluster_size, the serialisation of
 * allocating writes); no VM state. */
static void vdi_get_geometry(bi_node *n, struct bi_geometry *g)
{
    (void)n;
    g->cluster_size = VDI_BLOCK;
}

const struct bi_driver bi_drv_vdi = {
    .name = "vdi",
    .state_size = sizeof(vdi_state),
    .probe = vdi_probe,
    .open = vdi_open,
    .close = vdi_close,
    .create = vdi_create,
    .create_opts = vdi_create_opts,
    .refresh_limits = vdi_refresh_limits,
    .co_map = vdi_co_map,
    .co_write_done = vdi_co_write_done,
    .get_geometry = vdi_get_geometry,
    .co_block_status = vdi_co_block_status,
    .check = vdi_check,
};
