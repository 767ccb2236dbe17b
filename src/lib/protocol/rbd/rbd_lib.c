/* SPDX-License-Identifier: MIT */
/*
 * Loading librbd and librados on first use (see rbd_lib.h).
 */
#include "protocol/rbd/rbd_lib.h"

/* The sonames of Ceph's C libraries (packages librbd1, librados2): their
 * ABI versions have not changed since they were first released. */
#define LIBRADOS_SONAME "librados.so.2"
#define LIBRBD_SONAME "librbd.so.1"

struct bi_rbd_lib bi_rbd;

static int resolve(struct bi_dl *dl)
{
#define BI_RBD_RESOLVE(name) BI_DL_RESOLVE(dl, bi_rbd, name);
    BI_RBD_FUNCTIONS(BI_RBD_RESOLVE)
#undef BI_RBD_RESOLVE
    return 0;
}

static struct bi_dl lib =
    BI_DL_INIT("the rbd libraries", resolve, LIBRADOS_SONAME, LIBRBD_SONAME);

int bi_rbd_load(bi_error *err)
{
    return bi_dl_load(&lib, err);
}
