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

/* The creation options of format d, then those of protocol proto (may
 * be NULL), each name once. */
static int opt_list(const struct bi_driver *d, const struct bi_driver *proto,
                    const struct bi_opt_desc ***out, int *n)
{
    *out = NULL;
    *n = 0;
    if (!d)
        return -ENOENT;
    if (d->is_protocol)
        proto = NULL;
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

/* Option key of format d, else of protocol proto (may be NULL). */
static const struct bi_opt_desc *opt_find(const struct bi_driver *d,
                                          const struct bi_driver *proto,
                                          const char *key)
{
    if (!d)
        return NULL;
    const struct bi_opt_desc *o = bi_opt_lookup(d->create_opts, key);
    if (!o && proto && !d->is_protocol)
        o = bi_opt_lookup(proto->create_opts, key);
    return o;
}

int bi_create_opt_list(const char *format, bool with_protocol,
                       const struct bi_opt_desc ***out, int *n)
{
    return opt_list(bi_driver_find(format),
                    with_protocol ? bi_create_protocol() : NULL, out, n);
}

int bi_create_opt_list_at(const char *format, const char *filename,
                          const struct bi_opt_desc ***out, int *n)
{
    return opt_list(bi_driver_find(format),
                    filename ? bi_protocol_for(filename) : NULL, out, n);
}

const struct bi_opt_desc *bi_create_opt_find(const char *format,
                                             const char *key)
{
    return opt_find(bi_driver_find(format), bi_create_protocol(), key);
}

const struct bi_opt_desc *
bi_create_opt_find_at(const char *format, const char *filename, const char *key)
{
    return opt_find(bi_driver_find(format),
                    filename ? bi_protocol_for(filename) : NULL, key);
}

int bi_amend_opt_list(const char *format, const struct bi_opt_desc ***out,
                      int *n)
{
    const struct bi_driver *d = bi_driver_find(format);
    int count = 0;

    *out = NULL;
    *n = 0;
    if (!d || !d->amend || !d->amend_opts)
        return -ENOTSUP;
    while (d->amend_opts[count].name)
        count++;
    *out = bi_xzalloc(sizeof(**out) * (size_t)(count ? count : 1));
    for (int i = 0; i < count; i++)
        (*out)[i] = &d->amend_opts[i];
    *n = count;
    return 0;
}

const struct bi_opt_desc *bi_runtime_opt_find(const char *format,
                                              const char *key)
{
    const struct bi_driver *d = bi_driver_find(format);
    return d ? bi_opt_lookup(d->runtime_opts, key) : NULL;
}
