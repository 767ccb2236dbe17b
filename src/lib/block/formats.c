/* SPDX-License-Identifier: MIT */
/*
 * What the registered drivers offer (blkimg.h "formats"): names,
 * capabilities and option tables, read from each driver's table. Nothing
 * here knows a format.
 */
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *bi_opt_type_name(enum bi_opt_type t)
{
    switch (t) {
    case BI_OPT_BOOL:
        return "bool (on/off)";
    case BI_OPT_NUMBER:
        return "num";
    case BI_OPT_SIZE:
        return "size";
    default:
        return "str";
    }
}

const char *bi_driver_name(int i)
{
    const struct bi_driver *d = bi_driver_at(i);
    return d ? d->name : NULL;
}

const struct bi_opt_desc *bi_opt_lookup(const struct bi_opt_desc *table,
                                        const char *key)
{
    for (const struct bi_opt_desc *d = table; d && d->name; d++) {
        if ((d->flags & BI_OPT_PREFIX) ? !strncmp(key, d->name, strlen(d->name))
                                       : !strcmp(key, d->name))
            return d;
    }
    return NULL;
}

const struct bi_driver *bi_create_protocol(void)
{
    const struct bi_driver *d;
    for (int i = 0; (d = bi_driver_at(i)); i++)
        if (d->is_protocol)
            return d;
    return NULL;
}

int bi_create_opt_list(const char *format, bool with_protocol,
                       const struct bi_opt_desc ***out, int *n)
{
    const struct bi_driver *d = bi_driver_find(format);
    *out = NULL;
    *n = 0;
    if (!d)
        return -ENOENT;
    const struct bi_driver *proto =
        with_protocol && !d->is_protocol ? bi_create_protocol() : NULL;
    const struct bi_opt_desc *tables[2] = {d->create_opts,
                                           proto ? proto->create_opts : NULL};
    int cap = 1;
    for (int t = 0; t < 2; t++)
        for (const struct bi_opt_desc *o = tables[t]; o && o->name; o++)
            cap++;
    const struct bi_opt_desc **v = bi_xmalloc(sizeof(*v) * (size_t)cap);
    int k = 0;
    for (int t = 0; t < 2; t++) {
        for (const struct bi_opt_desc *o = tables[t]; o && o->name; o++) {
            int i = 0;
            while (i < k && strcmp(v[i]->name, o->name))
                i++;
            if (i == k)
                v[k++] = o;
        }
    }
    *out = v;
    *n = k;
    return 0;
}

const struct bi_opt_desc *bi_create_opt_find(const char *format,
                                             const char *key)
{
    const struct bi_driver *d = bi_driver_find(format);
    if (!d)
        return NULL;
    const struct bi_opt_desc *o = bi_opt_lookup(d->create_opts, key);
    const struct bi_driver *proto =
        d->is_protocol ? NULL : bi_create_protocol();
    if (!o && proto)
        o = bi_opt_lookup(proto->create_opts, key);
    return o;
}

const struct bi_opt_desc *bi_amend_opts(const char *format)
{
    const struct bi_driver *d = bi_driver_find(format);
    return d && d->amend ? d->amend_opts : NULL;
}

const struct bi_opt_desc *bi_runtime_opt_find(const char *format,
                                              const char *key)
{
    const struct bi_driver *d = bi_driver_find(format);
    return d ? bi_opt_lookup(d->runtime_opts, key) : NULL;
}
