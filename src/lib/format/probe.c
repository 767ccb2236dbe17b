/* SPDX-License-Identifier: MIT */
/*
 * The driver registry and format probing.
 *
 * Every driver blkimg knows is one table in drivers[], one line each in
 * drivers.def: the protocol
 * (file), the formats it opens (raw, qcow2) and the formats it only
 * recognises (format/foreign.c: no open). Probing asks every format's
 * probe about the first BI_PROBE_BYTES of an image; the highest score
 * wins, raw (score 1) is what is left. Where two probes can claim the
 * same bytes, the one listed first wins, which reproduces QEMU 7.2's
 * choice (measured with qemu-img on crafted headers: qed and parallels
 * before vdi, vdi before the others; dmg before cloop).
 */
#include "block/block.h"
#include "format/foreign.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* In probing precedence where scores tie (drivers.def says why). */
static const struct bi_driver *const drivers[] = {
#define BI_DRIVER(name) &bi_drv_##name,
#include "format/drivers.def"
#undef BI_DRIVER
};

const struct bi_driver *bi_driver_find(const char *name)
{
    for (size_t i = 0; i < BI_ARRAY_SIZE(drivers); i++)
        if (!strcmp(drivers[i]->name, name))
            return drivers[i];
    return NULL;
}

const struct bi_driver *bi_probe_fallback(void)
{
    for (size_t i = 0; i < BI_ARRAY_SIZE(drivers); i++)
        if (drivers[i]->identity_map)
            return drivers[i];
    abort(); /* the registry always has raw */
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

/* The BI_FORMAT_* flags of d, read from its table. */
static int driver_caps(const struct bi_driver *d)
{
    return (d->open ? BI_FORMAT_OPEN : 0) | (d->create ? BI_FORMAT_CREATE : 0) |
           (bi_opt_lookup(d->create_opts, "backing_file") ? BI_FORMAT_BACKING
                                                          : 0) |
           (d->co_pwrite_compressed ? BI_FORMAT_COMPRESS : 0) |
           (d->snapshot ? BI_FORMAT_SNAPSHOTS : 0) |
           (d->bitmap ? BI_FORMAT_BITMAPS : 0) |
           (d->amend ? BI_FORMAT_AMEND : 0) |
           (d->measure ? BI_FORMAT_MEASURE : 0) |
           (d->is_protocol ? BI_FORMAT_PROTOCOL : 0) |
           (d->no_zero_init ? BI_FORMAT_NO_ZERO_INIT : 0);
}

int bi_format_caps(const char *name)
{
    const struct bi_driver *d = bi_driver_find(name);
    return d ? driver_caps(d) : -ENOENT;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

size_t bi_format_names(unsigned caps, const char **names, size_t max)
{
    const char *all[BI_ARRAY_SIZE(drivers)];
    size_t n = 0;
    for (size_t i = 0; i < BI_ARRAY_SIZE(drivers); i++)
        if (((unsigned)driver_caps(drivers[i]) & caps) == caps)
            all[n++] = drivers[i]->name;
    qsort(all, n, sizeof(all[0]), cmp_name);
    for (size_t i = 0; i < n && i < max; i++)
        names[i] = all[i];
    return n;
}

const struct bi_driver *bi_probe_format(const uint8_t *buf, size_t len,
                                        const char *filename)
{
    const struct bi_driver *best = bi_probe_fallback();
    int best_score = 0;
    for (size_t i = 0; i < BI_ARRAY_SIZE(drivers); i++) {
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
