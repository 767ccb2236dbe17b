/* SPDX-License-Identifier: MIT */
/*
 * Loading libcurl on first use (see curl_lib.h).
 */
#include "protocol/http/curl_lib.h"

/* Debian's libcurl built with GnuTLS (package libcurl3-gnutls), the one
 * libcurl4-gnutls-dev builds against: its ABI has been stable since
 * libcurl 7.16. */
#define LIBCURL_GNUTLS_SONAME "libcurl-gnutls.so.4"

struct bi_curl_lib bi_curl;

static int resolve(struct bi_dl *dl)
{
#define BI_CURL_RESOLVE(name) BI_DL_RESOLVE(dl, bi_curl, name);
    BI_CURL_FUNCTIONS(BI_CURL_RESOLVE)
#undef BI_CURL_RESOLVE
    return 0;
}

static struct bi_dl lib = BI_DL_INIT("libcurl", resolve, LIBCURL_GNUTLS_SONAME);

int bi_curl_load(bi_error *err)
{
    return bi_dl_load(&lib, err);
}
