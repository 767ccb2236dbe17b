/* SPDX-License-Identifier: MIT */
/*
 * librbd and librados, loaded with dlopen when the first rbd image is
 * opened or created (rbd_lib.c). Linked, they cost every run of blkimg
 * and blkimg-io, rbd or not, about 36 ms of CPU and 20 MiB of memory
 * (Ceph's libraries and their static constructors); QEMU keeps its rbd
 * driver in a module loaded on demand for the same reason.
 *
 * The rbd driver calls the libraries through bi_rbd.NAME(...), NAME being
 * the library function; the pointers are set once bi_rbd_load returned 0.
 */
#ifndef BI_PROTOCOL_RBD_LIB_H
#define BI_PROTOCOL_RBD_LIB_H

#include "util/dl.h"
#include "util/util.h"

#include <rados/librados.h>
#include <rbd/librbd.h>

/* Every library function the driver calls. */
#define BI_RBD_FUNCTIONS(X)                                                    \
    X(rados_conf_read_file)                                                    \
    X(rados_conf_set)                                                          \
    X(rados_connect)                                                           \
    X(rados_create)                                                            \
    X(rados_ioctx_create)                                                      \
    X(rados_ioctx_destroy)                                                     \
    X(rados_ioctx_set_namespace)                                               \
    X(rados_shutdown)                                                          \
    X(rbd_aio_create_completion)                                               \
    X(rbd_aio_discard)                                                         \
    X(rbd_aio_flush)                                                           \
    X(rbd_aio_get_return_value)                                                \
    X(rbd_aio_readv)                                                           \
    X(rbd_aio_release)                                                         \
    X(rbd_aio_write_zeroes)                                                    \
    X(rbd_aio_writev)                                                          \
    X(rbd_close)                                                               \
    X(rbd_create)                                                              \
    X(rbd_diff_iterate2)                                                       \
    X(rbd_get_features)                                                        \
    X(rbd_get_flags)                                                           \
    X(rbd_get_size)                                                            \
    X(rbd_open)                                                                \
    X(rbd_open_read_only)                                                      \
    X(rbd_resize)                                                              \
    X(rbd_snap_create)                                                         \
    X(rbd_snap_list)                                                           \
    X(rbd_snap_list_end)                                                       \
    X(rbd_snap_remove)                                                         \
    X(rbd_snap_rollback)                                                       \
    X(rbd_stat)

struct bi_rbd_lib {
    BI_RBD_FUNCTIONS(BI_DL_POINTER)
};

extern struct bi_rbd_lib bi_rbd;

/* Loads the libraries and fills bi_rbd, once per process (thread-safe);
 * returns 0, or -ENOTSUP with err set when they are missing or lack a
 * function. */
int bi_rbd_load(bi_error *err);

#endif
