/* SPDX-License-Identifier: MIT */
/*
 * libnbd, loaded with dlopen when the first NBD connection is made
 * (nbd_lib.c). Linked, it and what it brings (libxml2 and ICU's 30 MiB
 * of data, GnuTLS) are paged in and relocated on every start of blkimg,
 * blkimg-io and the nbdkit plugin, NBD or not: about 20 ms of a cold
 * start. The driver calls libnbd through bi_nbd.NAME(...), NAME being the
 * library function; the pointers are set once bi_nbd_load returned 0.
 */
#ifndef BI_PROTOCOL_NBD_LIB_H
#define BI_PROTOCOL_NBD_LIB_H

#include "util/dl.h"
#include "util/util.h"

#include <libnbd.h>

/* Every library function the driver calls. */
#define BI_NBD_FUNCTIONS(X)                                                    \
    X(nbd_add_meta_context)                                                    \
    X(nbd_aio_block_status)                                                    \
    X(nbd_aio_connect_tcp)                                                     \
    X(nbd_aio_connect_unix)                                                    \
    X(nbd_aio_disconnect)                                                      \
    X(nbd_aio_flush)                                                           \
    X(nbd_aio_get_direction)                                                   \
    X(nbd_aio_get_fd)                                                          \
    X(nbd_aio_in_flight)                                                       \
    X(nbd_aio_is_closed)                                                       \
    X(nbd_aio_is_connecting)                                                   \
    X(nbd_aio_is_dead)                                                         \
    X(nbd_aio_is_negotiating)                                                  \
    X(nbd_aio_is_ready)                                                        \
    X(nbd_aio_notify_read)                                                     \
    X(nbd_aio_notify_write)                                                    \
    X(nbd_aio_opt_abort)                                                       \
    X(nbd_aio_opt_go)                                                          \
    X(nbd_aio_pread)                                                           \
    X(nbd_aio_pwrite)                                                          \
    X(nbd_aio_trim)                                                            \
    X(nbd_aio_zero)                                                            \
    X(nbd_can_fast_zero)                                                       \
    X(nbd_can_flush)                                                           \
    X(nbd_can_fua)                                                             \
    X(nbd_can_meta_context)                                                    \
    X(nbd_can_multi_conn)                                                      \
    X(nbd_can_trim)                                                            \
    X(nbd_can_zero)                                                            \
    X(nbd_close)                                                               \
    X(nbd_create)                                                              \
    X(nbd_get_block_size)                                                      \
    X(nbd_get_errno)                                                           \
    X(nbd_get_error)                                                           \
    X(nbd_get_size)                                                            \
    X(nbd_is_read_only)                                                        \
    X(nbd_set_export_name)                                                     \
    X(nbd_set_opt_mode)                                                        \
    X(nbd_set_pread_initialize)                                                \
    X(nbd_set_tls)                                                             \
    X(nbd_set_tls_certificates)                                                \
    X(nbd_set_tls_psk_file)                                                    \
    X(nbd_set_tls_username)                                                    \
    X(nbd_set_tls_verify_peer)

struct bi_nbd_lib {
    BI_NBD_FUNCTIONS(BI_DL_POINTER)
};

extern struct bi_nbd_lib bi_nbd;

/* Loads libnbd and fills bi_nbd, once per process (thread-safe); 0, or
 * -ENOTSUP with err set when it is missing or lacks a function. */
int bi_nbd_load(bi_error *err);

#endif
