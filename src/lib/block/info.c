/* SPDX-License-Identifier: MIT */
/* Image information (qemu-img info's fields); the driver adds its own. */
#include "blkimg/image_ops.h"
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

void bi_node_geometry(bi_node *n, struct bi_geometry *g)
{
    memset(g, 0, sizeof(*g));
    if (n->drv->get_geometry)
        n->drv->get_geometry(n, g);
}

bi_node *bi_snapshot_node(bi_node *n)
{
    if (!n->drv->snapshot && n->drv->identity_map && n->file && n->file != n &&
        n->file->drv->snapshot)
        return n->file;
    return n;
}

/* QEMU's bdrv_get_info() succeeds (and info shows the dirty flag) when a
 * driver answers it: a format with get_info, a format without one through
 * its file, a protocol that has one (file, not nbd). */
static bool answers_info(const bi_node *n)
{
    if (n->drv->get_info)
        return true;
    if (n->drv->is_protocol || !n->file || n->file == n)
        return false;
    return answers_info(n->file);
}

void bi_info_set(char **field, const char *value)
{
    free(*field);
    *field = value && value[0] ? bi_xstrdup(value) : NULL;
}

/* Fills the library's own full-size *info; on failure what it holds is
 * still for info_release. */
static int info_fill(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    struct bi_geometry g;
    bi_node_geometry(n, &g);
    info->cluster_size = g.cluster_size;
    info->vm_state_offset = g.vm_state_offset;
    info->format = n->drv->name;
    info->virtual_size = n->size;
    info->actual_size = bi_allocated_file_size(n);
    if (info->actual_size < 0)
        info->actual_size = -1;
    if (n->backing_filename && n->backing_filename[0]) {
        bi_info_set(&info->backing_filename, n->backing_filename);
        if (n->backing)
            bi_info_set(&info->full_backing_filename, n->backing->filename);
        else if (n->backing_filename[0] == '/')
            bi_info_set(&info->full_backing_filename, n->backing_filename);
    }
    if (n->backing_format)
        bi_info_set(&info->backing_format, n->backing_format);
    bi_node *sn = bi_snapshot_node(n);
    if (sn->drv->snapshot) {
        int ret =
            sn->drv->snapshot->list(sn, &info->snapshots, &info->n_snapshots);
        if (ret < 0)
            return ret;
    }
    info->has_dirty_flag = answers_info(n);
    if (n->drv->get_info)
        return n->drv->get_info(n, info, err);
    return 0;
}

/* Frees what *info holds in its fields that lie entirely within its first
 * size bytes (within), or in those that do not (!within): the part a
 * program's struct of that size owns, or the part it cannot hold. */
static void info_release(struct bi_image_info *info, size_t size, bool within)
{
#define OWNED(f) (BI_FIELD_FITS(struct bi_image_info, f, size) == within)
    if (OWNED(specific)) {
        bi_value_free(info->specific);
        info->specific = NULL;
    }
    if (OWNED(backing_filename))
        bi_info_set(&info->backing_filename, NULL);
    if (OWNED(full_backing_filename))
        bi_info_set(&info->full_backing_filename, NULL);
    if (OWNED(backing_format))
        bi_info_set(&info->backing_format, NULL);
    if (OWNED(snapshots) && OWNED(n_snapshots)) {
        bi_snapshot_list_free(info->snapshots, info->n_snapshots);
        info->snapshots = NULL;
        info->n_snapshots = 0;
    }
#undef OWNED
}

int bi_get_info_sized(bi_node *n, struct bi_image_info *info, size_t size,
                      bi_error *err)
{
    struct bi_image_info full;
    memset(&full, 0, sizeof(full));
    int ret = info_fill(n, &full, err);
    /* what the program's struct cannot hold is freed now; the rest it
     * frees with bi_info_free, after a failure too */
    info_release(&full, size, false);
    bi_struct_out(info, size, &full, sizeof(full));
    return ret;
}

void bi_info_free_sized(struct bi_image_info *info, size_t size)
{
    struct bi_image_info full;
    memset(&full, 0, sizeof(full));
    memcpy(&full, info, size < sizeof(full) ? size : sizeof(full));
    info_release(&full, size, true);
    bi_struct_out(info, size, &full, sizeof(full));
}
