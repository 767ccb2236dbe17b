/* SPDX-License-Identifier: MIT */
/*
 * The driver registry and format probing.
 *
 * Every driver blkimg knows is one table in drivers[]: the protocol
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

/* In probing precedence where scores tie: qed and parallels before vdi,
 * vdi before the other formats with a magic, dmg before cloop. */
static const struct bi_driver *const drivers[] = {
    &bi_drv_file,  &bi_drv_raw,   &bi_drv_qed,  &bi_drv_parallels, &bi_drv_vdi,
    &bi_drv_qcow2, &bi_drv_qcow,  &bi_drv_vmdk, &bi_drv_vhdx,      &bi_drv_vpc,
    &bi_drv_luks,  &bi_drv_bochs, &bi_drv_dmg,  &bi_drv_cloop,
};

const struct bi_driver *bi_driver_find(const char *name)
{
    for (size_t i = 0; i < BI_ARRAY_SIZE(drivers); i++)
        if (!strcmp(drivers[i]->name, name))
            return drivers[i];
    return NULL;
}

int bi_format_exists(const char *format)
{
    const struct bi_driver *d = bi_driver_find(format);
    return d && !d->is_protocol ? 0 : -ENOENT;
}

/* The BI_FORMAT_* flags of d. */
static int driver_caps(const struct bi_driver *d)
{
    return (d->open ? BI_FORMAT_OPEN : 0) | (d->create ? BI_FORMAT_CREATE : 0);
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
    const struct bi_driver *best = &bi_drv_raw;
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
