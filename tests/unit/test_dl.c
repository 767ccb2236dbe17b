/* SPDX-License-Identifier: MIT */
/* Libraries loaded on first use (util/dl.c): a real library and its
 * function, a missing library, a library that lacks a function; each
 * answered once and the same way on every later call. */
#include "tap.h"
#include "util/dl.h"

#include <errno.h>
#include <zlib.h>

static struct {
    BI_DL_POINTER(zlibVersion)
    BI_DL_POINTER(crc32)
} z;

static int resolve_zlib(struct bi_dl *dl)
{
    BI_DL_RESOLVE(dl, z, zlibVersion);
    BI_DL_RESOLVE(dl, z, crc32);
    return 0;
}

static int resolve_lacking(struct bi_dl *dl)
{
    void *p = bi_dl_sym(dl, "bi_no_such_function");
    if (!p)
        snprintf(dl->error, sizeof(dl->error), "it lacks %s",
                 "bi_no_such_function");
    return p ? 0 : -1;
}

static int calls;
static int resolve_counted(struct bi_dl *dl)
{
    calls++;
    return resolve_zlib(dl);
}

int main(void)
{
    bi_error err;
    struct bi_dl good = BI_DL_INIT("zlib", resolve_zlib, "libz.so.1");
    bi_error_init(&err);
    ok(bi_dl_load(&good, &err) == 0, "a library that is there loads");
    ok(!strcmp(z.zlibVersion(), zlibVersion()),
       "its function is the one linked");
    ok(z.crc32(0, (const Bytef *)"abc", 3) == 0x352441c2,
       "and computes (crc32 of abc)");

    struct bi_dl missing =
        BI_DL_INIT("libnothing", resolve_zlib, "libbi-nothing.so.9");
    bi_error_init(&err);
    ok(bi_dl_load(&missing, &err) == -ENOTSUP, "a missing library: ENOTSUP");
    ok(!strncmp(err.msg, "Could not load libnothing: libbi-nothing.so.9", 45),
       "named with dlerror's words: %s", err.msg);
    bi_error_init(&err);
    ok(bi_dl_load(&missing, &err) == -ENOTSUP &&
           strstr(err.msg, "libbi-nothing.so.9"),
       "and again on the next call");

    struct bi_dl lacking = BI_DL_INIT("zlib", resolve_lacking, "libz.so.1");
    bi_error_init(&err);
    ok(bi_dl_load(&lacking, &err) == -ENOTSUP &&
           !strcmp(err.msg,
                   "Could not load zlib: it lacks bi_no_such_function"),
       "a library without a function: %s", err.msg);

    struct bi_dl once = BI_DL_INIT("zlib", resolve_counted, "libz.so.1");
    ok(bi_dl_load(&once, NULL) == 0 && bi_dl_load(&once, NULL) == 0 &&
           calls == 1,
       "loaded once, however often asked");
    return tap_done();
}
