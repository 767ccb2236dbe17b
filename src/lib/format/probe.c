/* SPDX-License-Identifier: MIT */
/* The driver registry and format probing by magic. */
#include "block/block.h"

#include <errno.h>
#include <string.h>

static const struct bi_driver *const drivers[] = {
#define BI_DRIVER(name) &bi_drv_##name,
#include "format/drivers.def"
#undef BI_DRIVER
};

const struct bi_driver *bi_driver_find(const char *name)
{
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (!strcmp(drivers[i]->name, name))
            return drivers[i];
    return NULL;
}

const struct bi_driver *bi_driver_at(int i)
{
    return i >= 0 && (size_t)i < sizeof(drivers) / sizeof(drivers[0])
               ? drivers[i]
               : NULL;
}

int bi_format_exists(const char *format)
{
    const struct bi_driver *d = bi_driver_find(format);
    return d && !d->is_protocol ? 0 : -ENOENT;
}

const struct bi_driver *bi_probe_format(const uint8_t *buf, size_t len,
                                        const char *filename)
{
    const struct bi_driver *best = &bi_drv_raw;
    int best_score = 0;
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++) {
        const struct bi_driver *d = drivers[i];
        if (d->is_protocol || !d->probe)
            continue;
        int score = d->probe(buf, len, filename);
        if (score > best_score) {
            best_score = score;
            best = d;
        }
    }
    return best;
}
