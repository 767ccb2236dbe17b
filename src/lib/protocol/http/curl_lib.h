/* SPDX-License-Identifier: MIT */
/*
 * libcurl, loaded with dlopen when the first http or https node is
 * opened (curl_lib.c). Linked, it and what it brings (GnuTLS, Kerberos,
 * LDAP, SSH, RTMP, IDN...) are paged in and relocated on every start of
 * blkimg, blkimg-io and the nbdkit plugin, http or not: the larger part
 * of a cold start. The driver calls libcurl through bi_curl.NAME(...),
 * NAME being the library function; the pointers are set once
 * bi_curl_load returned 0.
 */
#ifndef BI_PROTOCOL_HTTP_CURL_LIB_H
#define BI_PROTOCOL_HTTP_CURL_LIB_H

#include "util/dl.h"
#include "util/util.h"

/* curl.h's type-checking wrappers are function-like macros named as the
 * functions, which would expand inside bi_curl.NAME(...) */
#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

/* Every library function the driver calls. */
#define BI_CURL_FUNCTIONS(X)                                                   \
    X(curl_easy_cleanup)                                                       \
    X(curl_easy_getinfo)                                                       \
    X(curl_easy_init)                                                          \
    X(curl_easy_setopt)                                                        \
    X(curl_easy_strerror)                                                      \
    X(curl_global_init)                                                        \
    X(curl_multi_add_handle)                                                   \
    X(curl_multi_assign)                                                       \
    X(curl_multi_cleanup)                                                      \
    X(curl_multi_info_read)                                                    \
    X(curl_multi_init)                                                         \
    X(curl_multi_remove_handle)                                                \
    X(curl_multi_setopt)                                                       \
    X(curl_multi_socket_action)

struct bi_curl_lib {
    BI_CURL_FUNCTIONS(BI_DL_POINTER)
};

extern struct bi_curl_lib bi_curl;

/* Loads libcurl and fills bi_curl, once per process (thread-safe); 0, or
 * -ENOTSUP with err set when it is missing or lacks a function. */
int bi_curl_load(bi_error *err);

#endif
