/* SPDX-License-Identifier: MIT */
/*
 * Image size measurement (qemu-img measure): the options are checked
 * against the format's creation options, the format driver measures.
 */
#include "blkimg/convert.h"
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* bi_measure for the library's full-size *out. */
static int measure(const char *format, const char *const *options, bi_node *src,
                   struct bi_measure *out, bi_error *err)
{
    const struct bi_driver *drv = bi_driver_find(format);
    if (!drv || drv->is_protocol) {
        bi_error_set(err, 0, "Unknown file format '%s'", format);
        return -EINVAL;
    }
    if (!drv->measure) {
        bi_error_set(err, 0,
                     "Block driver '%s' does not support size measurement",
                     format);
        return -ENOTSUP;
    }
    for (const char *const *o = options; o && *o; o++) {
        char key[128];
        size_t kl = strcspn(*o, "=");
        snprintf(key, sizeof(key), "%.*s", (int)kl, *o);
        if (!bi_create_opt_find(format, key)) {
            bi_error_set(err, 0, "Invalid parameter '%s'", key);
            return -EINVAL;
        }
    }
    return drv->measure(options, src, out, err);
}

int bi_measure_sized(const char *format, const char *const *options,
                     bi_node *src, struct bi_measure *out, size_t size,
                     bi_error *err)
{
    struct bi_measure full;
    memset(&full, 0, sizeof(full));
    int ret = measure(format, options, src, &full, err);
    bi_struct_out(out, size, &full, sizeof(full));
    return ret;
}
