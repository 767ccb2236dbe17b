/* SPDX-License-Identifier: MIT */
/*
 * Loading libnbd on first use (see nbd_lib.h).
 */
#include "protocol/nbd/nbd_lib.h"

/* libnbd's soname (package libnbd0): its ABI is kept stable. */
#define LIBNBD_SONAME "libnbd.so.0"

struct bi_nbd_lib bi_nbd;

static int resolve(struct bi_dl *dl)
{
#define BI_NBD_RESOLVE(name) BI_DL_RESOLVE(dl, bi_nbd, name);
    BI_NBD_FUNCTIONS(BI_NBD_RESOLVE)
#undef BI_NBD_RESOLVE
    return 0;
}

static struct bi_dl lib = BI_DL_INIT("libnbd", resolve, LIBNBD_SONAME);

int bi_nbd_load(bi_error *err)
{
    return bi_dl_load(&lib, err);
}
