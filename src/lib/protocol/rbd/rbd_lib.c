/* SPDX-License-Identifier: MIT */
/*
 * Loading librbd and librados on first use (see rbd_lib.h).
 */
#include "protocol/rbd/rbd_lib.h"

/* The sonames of Ceph's C libraries (packages librbd1, librados2): their
 * ABI versions have not changed since they were first released. */
#define LIBRADOS_SONAME "librados.so.2"
#define LIBRBD_SONAME "librbd.so.1"

BI_DL_DEFINE(struct bi_rbd_lib, bi_rbd, BI_RBD_FUNCTIONS, bi_rbd_load,
             "the rbd libraries", LIBRADOS_SONAME, LIBRBD_SONAME)
