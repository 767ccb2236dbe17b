/* SPDX-License-Identifier: MIT */
/* Helpers shared by the filters (filter.h). */
#include "filter/filter.h"
#include "util/util.h"

#include <errno.h>
#include <string.h>

const char *bi_filter_opt(const struct bi_open_opts *o, const char *key)
{
    return bi_opts_value(o->protocol_opts, key);
}

char *bi_filter_escape(const char *s)
{
    char *e = bi_xmalloc(2 * strlen(s) + 1), *q = e;
    for (; *s; s++) {
        *q++ = *s;
        if (*s == ',')
            *q++ = ',';
    }
    *q = 0;
    return e;
}

int bi_filter_set_perm(bi_node *n, unsigned perm, unsigned shared,
                       bi_error *err)
{
    return bi_node_set_perm(n->file, perm, shared, err);
}

int64_t bi_filter_allocated_size(bi_node *n)
{
    const struct bi_driver *d = n->file->drv;
    return d->get_allocated_file_size ? d->get_allocated_file_size(n->file)
                                      : -ENOTSUP;
}

int bi_filter_truncate(bi_node *n, uint64_t size, bool exact,
                       enum bi_prealloc prealloc, bi_error *err)
{
    const struct bi_driver *d = n->file->drv;
    int ret = d->co_truncate
                  ? d->co_truncate(n->file, size, exact, prealloc, err)
                  : -ENOTSUP;
    if (ret == 0)
        n->size = n->file->size;
    return ret;
}
