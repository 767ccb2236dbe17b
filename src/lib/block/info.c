/* SPDX-License-Identifier: MIT */
/* Image information (qemu-img info's fields); the driver adds its own. */
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

int bi_get_info(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    struct bi_geometry g;
    memset(info, 0, sizeof(*info));
    bi_node_geometry(n, &g);
    info->cluster_size = g.cluster_size;
    info->vm_state_offset = g.vm_state_offset;
    snprintf(info->format, sizeof(info->format), "%s", n->drv->name);
    info->virtual_size = n->size;
    info->actual_size = bi_allocated_file_size(n);
    if (info->actual_size < 0)
        info->actual_size = -1;
    if (n->backing_filename && n->backing_filename[0]) {
        snprintf(info->backing_filename, sizeof(info->backing_filename), "%s",
                 n->backing_filename);
        if (n->backing) {
            snprintf(info->full_backing_filename,
                     sizeof(info->full_backing_filename), "%s",
                     n->backing->filename);
        } else if (n->backing_filename[0] == '/') {
            snprintf(info->full_backing_filename,
                     sizeof(info->full_backing_filename), "%s",
                     n->backing_filename);
        }
    }
    if (n->backing_format)
        snprintf(info->backing_format, sizeof(info->backing_format), "%s",
                 n->backing_format);
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

void bi_info_free(struct bi_image_info *info)
{
    bi_value_free(info->specific);
    info->specific = NULL;
    free(info->snapshots);
    info->snapshots = NULL;
    info->n_snapshots = 0;
}
