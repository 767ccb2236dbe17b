/* SPDX-License-Identifier: MIT */
/*
 * The http and https protocol drivers (read-only, on libcurl): private
 * interfaces shared by http.c (the driver tables: open, reads, limits),
 * http_multi.c (libcurl's multi interface driven by the block layer's
 * event loop) and http_opts.c (options).
 *
 * Options, as QEMU 7.2's curl driver names them: url, readahead (accepted
 * and checked; reads fetch exactly what is asked), timeout (seconds, default
 * 5: connecting, a stalled transfer, and the time failed reads are retried
 * for), sslverify (default on), cookie, username, proxy-username, and
 * cookie-secret, password-secret, proxy-password-secret (ids of secret
 * objects, read as UTF-8 text when the node opens).
 */
#ifndef BI_PROTOCOL_HTTP_H
#define BI_PROTOCOL_HTTP_H

#include "block/block.h"
#include "io/aio.h"
#include "protocol/http/curl_lib.h"
#include "util/util.h"

#include <stdbool.h>
#include <stdint.h>

/* QEMU's defaults and bounds. */
#define BI_HTTP_READAHEAD_DEFAULT (256u * 1024)
#define BI_HTTP_TIMEOUT_DEFAULT 5
#define BI_HTTP_TIMEOUT_MAX 10000

/* The option keys an open takes (the drivers' runtime_opts). */
extern const struct bi_opt_desc bi_http_runtime_opts[];

/* What one open asks for: the options, checked. */
struct http_conf {
    char *url;
    uint64_t readahead;
    long timeout; /* seconds; 0: none */
    bool sslverify;
    /* Options changing what is read, given: QEMU then names the node by
     * them (json:{"driver": ..., "url": ..., ...}); NULL when it names it
     * by its URL. */
    bi_value *name;
    char *cookie, *username, *proxy_username;
    /* From secret objects (bi_secret_free wipes them), or NULL. */
    char *cookie_secret, *password, *proxy_password;
};

/* Reads the options of an open of driver proto ("http", "https") into c
 * (zeroed first). Returns 0 or -EINVAL with err set to QEMU's words. */
int bi_http_conf_parse(const char *proto, const char *const *opts,
                       struct http_conf *c, bi_error *err);
void bi_http_conf_free(struct http_conf *c);
/* The driver's parse_filename: the whole name is the url. */
int bi_http_parse_filename(const char *filename, struct bi_optlist *l,
                           bi_error *err);

/* ------------------------------------------------------------ transfers */

struct http_sock;

/* A multi handle in the loop: its sockets are bi_fd_watches, its timer a
 * timerfd watched the same way. */
struct http_multi {
    CURLM *m;
    int timer_fd;
    struct bi_fd_watch timer;
    bool timer_armed;        /* libcurl wants a timeout */
    struct http_sock *socks; /* live and cancelled (being reaped) */
};

/* One transfer: set up on easy, waited for by co. A transfer that moves
 * no byte for stall_ms (0: no limit) is aborted (CURLE_ABORTED_BY_CALLBACK):
 * libcurl's own low-speed check averages over seconds and notices a
 * stopped server late. */
struct http_xfer {
    CURL *easy;
    bi_co *co;
    bool done;
    CURLcode result;
    char errbuf[CURL_ERROR_SIZE];
    long stall_ms;
    /* private */
    int64_t moved_ms; /* when the last bytes came */
    curl_off_t moved; /* bytes then */
};

/* Creates the multi handle and its timer. 0 or -errno with err set. */
int bi_http_multi_init(struct http_multi *hm, bi_error *err);
/* Runs x (its easy handle configured, private data unused) to its end in
 * the calling coroutine; x->result and x->errbuf say how it went. */
void bi_http_multi_run(struct http_multi *hm, struct http_xfer *x);
/* Ends everything (in a coroutine or outside one): stops the watches,
 * then frees the multi handle. */
void bi_http_multi_close(struct http_multi *hm);
/* CLOCK_MONOTONIC in milliseconds. */
int64_t bi_http_now_ms(void);
/* Waits (in a coroutine) for ms milliseconds. */
void bi_http_sleep(int ms);

#endif
