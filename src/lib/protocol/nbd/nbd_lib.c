/* SPDX-License-Identifier: MIT */
/*
 * Loading libnbd on first use (see nbd_lib.h).
 */
#include "protocol/nbd/nbd_lib.h"

/* libnbd's soname (package libnbd0): its ABI is kept stable. */
#define LIBNBD_SONAME "libnbd.so.0"

BI_DL_DEFINE(struct bi_nbd_lib, bi_nbd, BI_NBD_FUNCTIONS, bi_nbd_load, "libnbd",
             LIBNBD_SONAME)
