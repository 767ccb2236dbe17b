/* SPDX-License-Identifier: MIT */
/*
 * Loading libcurl on first use (see curl_lib.h).
 */
#include "protocol/http/curl_lib.h"

/* Debian's libcurl built with GnuTLS (package libcurl3-gnutls), the one
 * libcurl4-gnutls-dev builds against: its ABI has been stable since
 * libcurl 7.16. */
#define LIBCURL_GNUTLS_SONAME "libcurl-gnutls.so.4"

BI_DL_DEFINE(struct bi_curl_lib, bi_curl, BI_CURL_FUNCTIONS, bi_curl_load,
             "libcurl", LIBCURL_GNUTLS_SONAME)
