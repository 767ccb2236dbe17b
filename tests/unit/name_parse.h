/* SPDX-License-Identifier: MIT */
/*
 * For the unit tests of a protocol's file names: runs its parse_filename
 * on a name and shows the options it made as "k=v;k=v", or the error as
 * "error: <message>" (a static buffer, valid until the next call).
 */
#ifndef BI_TEST_NAME_PARSE_H
#define BI_TEST_NAME_PARSE_H

#include "util/util.h"

#include <stdio.h>
#include <string.h>

typedef int name_parse_fn(const char *filename, struct bi_optlist *l,
                          bi_error *err);

__attribute__((unused)) static const char *parse_with(name_parse_fn *fn,
                                                      const char *name)
{
    static char out[2048];
    struct bi_optlist l = {0};
    bi_error err;

    bi_error_init(&err);
    out[0] = 0;
    if (fn(name, &l, &err) < 0) {
        snprintf(out, sizeof(out), "error: %s", err.msg);
    } else {
        for (int i = 0; i < l.n; i++) {
            size_t n = strlen(out);
            snprintf(out + n, sizeof(out) - n, "%s%s=%s", i ? ";" : "",
                     l.v[i].key, l.v[i].value);
        }
    }
    bi_optlist_free(&l);
    return out;
}

#endif
