/* SPDX-License-Identifier: MIT */
/*
 * The "http" and "https" protocol drivers: a web server's file, read with
 * byte-range GETs (libcurl, in the block layer's event loop: http_multi.c).
 * Read-only, as QEMU 7.2's curl driver: open asks for the headers (HEAD)
 * and wants a size and "Accept-Ranges: bytes"; each read is one ranged
 * GET, several in flight at once, its reply checked (206 with the range
 * asked for, or 200 only when that range is the whole file, and exactly
 * the bytes asked for). A read that fails on the way (connection refused
 * or lost, a short body, a server error) is tried again until the timeout
 * has passed since the reads began to fail; then it fails with EIO.
 */
#include "protocol/http/http.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Transfers in flight per node (QEMU's CURL_NUM_STATES) and the most one
 * read asks for. */
#define MAX_XFERS 8
#define HTTP_MAX_TRANSFER (4u << 20)
/* Pauses between the tries of a failed read (ms): doubling, at most. */
#define RETRY_FIRST_MS 50
#define RETRY_MAX_MS 1000

struct http_waiter {
    bi_co *co;
    bool granted;
    struct http_waiter *next;
};

struct http_state {
    struct http_conf c;
    struct http_multi hm;
    uint64_t size;
    CURL *idle[MAX_XFERS]; /* configured handles kept for the next reads */
    int n_idle;
    int busy; /* transfer slots taken */
    /* When the reads began to fail (ms, bi_http_now_ms()), 0 after a success:
     * the reads failing after it try again until the timeout has passed since
     * then, so a server that is gone ends them all within the timeout */
    int64_t failing_since;
    struct http_waiter *wait_head, **wait_tail;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_ret;

static void global_init(void)
{
    global_ret = bi_curl.curl_global_init(CURL_GLOBAL_ALL);
}

/* --------------------------------------------------------------- handles */

/* A handle set up for the node's URL and options (QEMU's, but a stalled
 * transfer rather than a long one times out). NULL when out of memory. */
static CURL *easy_new(const struct http_state *s)
{
    const struct http_conf *c = &s->c;
    CURL *e = bi_curl.curl_easy_init();

    if (!e) {
        return NULL;
    }
    bi_curl.curl_easy_setopt(e, CURLOPT_URL, c->url);
    bi_curl.curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, (long)c->sslverify);
    bi_curl.curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, c->sslverify ? 2L : 0L);
    if (c->cookie || c->cookie_secret) {
        bi_curl.curl_easy_setopt(e, CURLOPT_COOKIE,
                                 c->cookie ? c->cookie : c->cookie_secret);
    }
    if (c->username) {
        bi_curl.curl_easy_setopt(e, CURLOPT_USERNAME, c->username);
    }
    if (c->password) {
        bi_curl.curl_easy_setopt(e, CURLOPT_PASSWORD, c->password);
    }
    if (c->proxy_username) {
        bi_curl.curl_easy_setopt(e, CURLOPT_PROXYUSERNAME, c->proxy_username);
    }
    if (c->proxy_password) {
        bi_curl.curl_easy_setopt(e, CURLOPT_PROXYPASSWORD, c->proxy_password);
    }
    if (c->timeout) {
        bi_curl.curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, c->timeout);
        bi_curl.curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
        bi_curl.curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, c->timeout);
    }
    bi_curl.curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    bi_curl.curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    bi_curl.curl_easy_setopt(e, CURLOPT_AUTOREFERER, 1L);
    bi_curl.curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L);
    bi_curl.curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    bi_curl.curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    return e;
}

/* Takes a transfer slot, waiting in line for one when all are taken. */
static void slot_get(struct http_state *s)
{
    struct http_waiter w = {.co = bi_co_self()};

    if (s->busy < MAX_XFERS && !s->wait_head) {
        s->busy++;
        return;
    }
    *s->wait_tail = &w;
    s->wait_tail = &w.next;
    while (!w.granted) {
        bi_co_yield();
    }
}

/* Gives the slot to the first in line, or back. */
static void slot_put(struct http_state *s)
{
    struct http_waiter *w = s->wait_head;

    if (!w) {
        s->busy--;
        return;
    }
    s->wait_head = w->next;
    if (!s->wait_head) {
        s->wait_tail = &s->wait_head;
    }
    w->granted = true;
    bi_co_wake(w->co);
}

static CURL *easy_get(struct http_state *s)
{
    slot_get(s);
    return s->n_idle ? s->idle[--s->n_idle] : easy_new(s);
}

static void easy_put(struct http_state *s, CURL *e)
{
    if (e && s->n_idle < MAX_XFERS) {
        s->idle[s->n_idle++] = e;
    } else if (e) {
        bi_curl.curl_easy_cleanup(e);
    }
    slot_put(s);
}

/* ------------------------------------------------------------------ reads */

/* One ranged GET of [off, off+want) into iov. */
struct range_read {
    struct http_xfer x;
    const struct iovec *iov;
    int iovcnt;
    uint64_t off, want, got;
    bool whole;    /* the range is the whole file: a 200 is the answer too */
    bool range_ok; /* the reply's Content-Range is the one asked for */
    bool checked;  /* the status was checked (at the first byte) */
    bool refused;  /* a reply that trying again will not change */
};

/* Content-Range: bytes A-B/N must be the range asked for. */
static size_t range_header(char *p, size_t size, size_t nmemb, void *opaque)
{
    struct range_read *r = opaque;
    size_t n = size * nmemb;
    uint64_t a, b;
    char line[128];

    if (n >= 5 && !strncmp(p, "HTTP/", 5)) {
        r->range_ok = false; /* a new reply (after a redirect) */
    } else if (n > 14 && n < sizeof(line) &&
               !strncasecmp(p, "Content-Range:", 14)) {
        memcpy(line, p, n);
        line[n] = 0;
        r->range_ok =
            sscanf(line + 14, " bytes %" SCNu64 "-%" SCNu64, &a, &b) == 2 &&
            a == r->off && b == r->off + r->want - 1;
    }
    return n;
}

/* The reply is the one asked for: 206 with the range, or a 200 for the
 * whole file. */
static bool status_ok(struct range_read *r)
{
    long code = 0;

    bi_curl.curl_easy_getinfo(r->x.easy, CURLINFO_RESPONSE_CODE, &code);
    return (code == 206 && r->range_ok) || (code == 200 && r->whole);
}

static size_t range_body(char *p, size_t size, size_t nmemb, void *opaque)
{
    struct range_read *r = opaque;
    size_t n = size * nmemb;

    if (!r->checked) {
        r->checked = true;
        if (!status_ok(r)) {
            r->refused = true;
            return 0; /* abort the transfer */
        }
    }
    if (n > r->want - r->got) {
        r->refused = true; /* more than asked for */
        return 0;
    }
    bi_iov_from_buf(r->iov, r->iovcnt, r->got, p, n);
    r->got += n;
    return n;
}

/* Whether a failed try may be repeated: the connection or the server
 * failed, not the request. */
static bool transient(const struct range_read *r)
{
    long code = 0;

    if (r->refused) {
        return false;
    }
    switch (r->x.result) {
    case CURLE_OK: /* a short body */
    case CURLE_COULDNT_CONNECT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_ABORTED_BY_CALLBACK: /* a stall (http_xfer) */
        return true;
    case CURLE_HTTP_RETURNED_ERROR:
        bi_curl.curl_easy_getinfo(r->x.easy, CURLINFO_RESPONSE_CODE, &code);
        return code >= 500;
    default:
        return false;
    }
}

/* One try of r on e. True when r has all its bytes. */
static bool range_try(struct http_state *s, struct range_read *r, CURL *e)
{
    char range[64];

    snprintf(range, sizeof(range), "%" PRIu64 "-%" PRIu64, r->off,
             r->off + r->want - 1);
    r->x.easy = e;
    r->x.stall_ms = s->c.timeout * 1000;
    r->got = 0;
    r->range_ok = r->checked = r->refused = false;
    bi_curl.curl_easy_setopt(e, CURLOPT_RANGE, range);
    bi_curl.curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, range_header);
    bi_curl.curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    bi_curl.curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, range_body);
    bi_curl.curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    bi_http_multi_run(&s->hm, &r->x);
    return r->x.result == CURLE_OK && !r->refused && r->got == r->want;
}

/* Reads [off, off+len) of the file (inside it) into iov, trying again
 * for up to the timeout after the reads began to fail. 0 or -EIO. */
static int range_read(struct http_state *s, uint64_t off, uint64_t len,
                      const struct iovec *iov, int iovcnt)
{
    struct range_read r = {.iov = iov,
                           .iovcnt = iovcnt,
                           .off = off,
                           .want = len,
                           .whole = off == 0 && len == s->size};
    int pause = RETRY_FIRST_MS;
    CURL *e = easy_get(s);
    int ret = -EIO;

    while (e) {
        if (range_try(s, &r, e)) {
            s->failing_since = 0;
            ret = 0;
            break;
        }
        if (!s->failing_since) {
            s->failing_since = bi_http_now_ms();
        }
        int64_t left =
            s->failing_since + (int64_t)s->c.timeout * 1000 - bi_http_now_ms();
        if (!transient(&r) || left <= 0) {
            break;
        }
        bi_http_sleep((int)BI_MIN((int64_t)pause, left));
        pause = BI_MIN(2 * pause, RETRY_MAX_MS);
    }
    if (e) {
        bi_curl.curl_easy_setopt(e, CURLOPT_HEADERDATA, NULL);
        bi_curl.curl_easy_setopt(e, CURLOPT_WRITEDATA, NULL);
    }
    easy_put(s, e);
    return ret;
}

/* Reads past the end of the file are zeroes. */
static int http_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                          const struct iovec *iov, int iovcnt)
{
    struct http_state *s = n->opaque;
    uint64_t in = off < s->size ? BI_MIN(len, s->size - off) : 0;
    int ret = 0;

    if (in < len) {
        bi_iov_memset(iov, iovcnt, in, 0, len - in);
    }
    if (in) {
        ret = range_read(s, off, in, iov, iovcnt);
    }
    if (ret == 0) {
        bi_stats_io(n, len, 0);
    }
    return ret;
}

/* ------------------------------------------------------------ open/close */

struct head_req {
    struct http_xfer x;
    bool accept_ranges;
};

static size_t head_header(char *p, size_t size, size_t nmemb, void *opaque)
{
    struct head_req *h = opaque;
    size_t n = size * nmemb;

    if (n >= 5 && !strncmp(p, "HTTP/", 5)) {
        h->accept_ranges = false; /* a new reply (after a redirect) */
    } else if (n > 14 && !strncasecmp(p, "Accept-Ranges:", 14)) {
        const char *v = p + 14;
        while (v < p + n && (*v == ' ' || *v == '\t')) {
            v++;
        }
        h->accept_ranges = (size_t)(p + n - v) >= 5 && !strncmp(v, "bytes", 5);
    }
    return n;
}

static void open_error(bi_error *err, const char *why)
{
    bi_error_set(err, 0, "CURL: Error opening file: %s", why);
}

/* Asks for the headers (in a coroutine): the size and range support. */
static int head_co(void *opaque)
{
    bi_node *n = ((void **)opaque)[0];
    bi_error *err = ((void **)opaque)[1];
    struct http_state *s = n->opaque;
    struct head_req h = {.x.easy = easy_new(s),
                         .x.stall_ms = s->c.timeout * 1000};
    curl_off_t len = -1;
    int ret = -EINVAL;

    if (!h.x.easy) {
        bi_error_set(err, 0, "libcurl initialization failed");
        return -ENOMEM;
    }
    bi_curl.curl_easy_setopt(h.x.easy, CURLOPT_NOBODY, 1L);
    bi_curl.curl_easy_setopt(h.x.easy, CURLOPT_HEADERFUNCTION, head_header);
    bi_curl.curl_easy_setopt(h.x.easy, CURLOPT_HEADERDATA, &h);
    bi_http_multi_run(&s->hm, &h.x);
    if (h.x.result != CURLE_OK) {
        open_error(err, h.x.errbuf[0] ? h.x.errbuf
                                      : bi_curl.curl_easy_strerror(h.x.result));
    } else if (bi_curl.curl_easy_getinfo(h.x.easy,
                                         CURLINFO_CONTENT_LENGTH_DOWNLOAD_T,
                                         &len) != CURLE_OK ||
               len < 0) {
        open_error(err, "Server didn't report file size.");
    } else if (!h.accept_ranges) {
        open_error(err, "Server does not support 'range' (byte ranges).");
    } else {
        s->size = (uint64_t)len;
        ret = 0;
    }
    bi_curl.curl_easy_cleanup(h.x.easy);
    return ret;
}

static int close_co(void *opaque)
{
    struct http_state *s = opaque;

    bi_http_multi_close(&s->hm);
    while (s->n_idle) {
        bi_curl.curl_easy_cleanup(s->idle[--s->n_idle]);
    }
    return 0;
}

static void http_close(bi_node *n)
{
    struct http_state *s = n->opaque;

    if (s && s->c.url) {
        bi_run_co(close_co, s);
        bi_http_conf_free(&s->c);
    }
}

static int http_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct http_state *s = n->opaque;
    void *args[2] = {n, err};
    int ret;

    if (o->read_write) {
        bi_error_set(err, 0, "curl driver does not support writes");
        return -EACCES;
    }
    ret = bi_curl_load(err);
    if (ret < 0)
        return ret;
    pthread_once(&global_once, global_init);
    if (global_ret != CURLE_OK) {
        bi_error_set(err, 0, "libcurl initialization failed with %d",
                     (int)global_ret);
        return -EIO;
    }
    ret = bi_http_conf_parse(n->drv->name, o->protocol_opts, &s->c, err);
    if (ret < 0) {
        return ret;
    }
    s->wait_tail = &s->wait_head;
    ret = bi_http_multi_init(&s->hm, err);
    if (ret == 0) {
        ret = bi_run_co(head_co, args);
    }
    if (ret < 0) {
        http_close(n);
        return ret;
    }
    n->size = s->size;
    free(n->filename);
    if (s->c.name) {
        n->name_opts = s->c.name; /* the node's now */
        s->c.name = NULL;
        n->filename = bi_json_name(n->name_opts);
    } else {
        n->filename = bi_xstrdup(s->c.url);
    }
    return 0;
}

/* Any range may be asked for; a read is one GET of at most 4 MiB. */
static void http_refresh_limits(bi_node *n)
{
    bi_limits_any_buffer(&n->limits, HTTP_MAX_TRANSFER);
}

static int http_storage_info(bi_node *n, struct bi_storage_info *out)
{
    out->filesystem = n->drv->name;
    return 0;
}

static const char *const http_prefixes[] = {"http", NULL};
static const char *const https_prefixes[] = {"https", NULL};

#define HTTP_DRIVER(NAME)                                                      \
    {                                                                          \
        .name = #NAME, .is_protocol = true,                                    \
        .state_size = sizeof(struct http_state), .prefixes = NAME##_prefixes,  \
        .runtime_opts = bi_http_runtime_opts,                                  \
        .parse_filename = bi_http_parse_filename, .open = http_open,           \
        .close = http_close, .refresh_limits = http_refresh_limits,            \
        .co_preadv = http_co_preadv, .storage_info = http_storage_info,        \
    }

const struct bi_driver bi_drv_http = HTTP_DRIVER(http);
const struct bi_driver bi_drv_https = HTTP_DRIVER(https);
