/* SPDX-License-Identifier: MIT */
/*
 * libcurl's multi interface in the block layer's event loop. libcurl says
 * which sockets it waits on and how (CURLMOPT_SOCKETFUNCTION) and when it
 * wants to be called back (CURLMOPT_TIMERFUNCTION); each socket becomes a
 * bi_fd_watch, the timer a timerfd watched the same way, and every event
 * goes back to libcurl through curl_multi_socket_action, which then
 * finishes transfers: their coroutines are woken. Polls are one-shot, so
 * a socket is armed again after each event for what libcurl last asked.
 * Nothing here blocks the loop thread, and any number of transfers run at
 * once on one multi handle (which also keeps the connections for reuse).
 */
#include "protocol/http/http.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* A socket libcurl watches. Once libcurl lets it go (CURL_POLL_REMOVE) it
 * is dead: its polls are cancelled and it is freed when they ended. */
struct http_sock {
    struct http_multi *hm;
    struct bi_fd_watch w;
    int fd;
    int what; /* CURL_POLL_IN / OUT / INOUT */
    bool dead;
    struct http_sock *next;
};

#define sock_of(wp)                                                            \
    ((struct http_sock *)((char *)(wp)-offsetof(struct http_sock, w)))
#define multi_of(wp)                                                           \
    ((struct http_multi *)((char *)(wp)-offsetof(struct http_multi, timer)))

/* Frees the dead sockets whose polls have all ended. */
static void reap(struct http_multi *hm)
{
    struct http_sock **pp = &hm->socks;

    while (*pp) {
        struct http_sock *s = *pp;
        if (s->dead && bi_fd_watch_idle(&s->w)) {
            *pp = s->next;
            free(s);
        } else {
            pp = &s->next;
        }
    }
}

static void sock_arm(struct http_sock *s)
{
    if (!s->dead) {
        bi_fd_watch_arm(&s->w, s->fd, (s->what & CURL_POLL_IN) != 0,
                        (s->what & CURL_POLL_OUT) != 0);
    }
}

/* Hands the finished transfers to their coroutines. */
static void check_done(struct http_multi *hm)
{
    CURLMsg *msg;
    int left;

    while ((msg = bi_curl.curl_multi_info_read(hm->m, &left))) {
        struct http_xfer *x = NULL;
        if (msg->msg != CURLMSG_DONE) {
            continue;
        }
        CURL *e = msg->easy_handle;
        CURLcode r = msg->data.result; /* msg dies with the removal */
        bi_curl.curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
        bi_curl.curl_multi_remove_handle(hm->m, e);
        x->result = r;
        x->done = true;
        bi_co_wake(x->co);
    }
}

/* Tells libcurl about an event (fd, or CURL_SOCKET_TIMEOUT). */
static void action(struct http_multi *hm, curl_socket_t fd, int mask)
{
    int running;

    (void)bi_curl.curl_multi_socket_action(hm->m, fd, mask, &running);
    check_done(hm);
    reap(hm);
}

static void sock_event(struct bi_fd_watch *w, unsigned revents)
{
    struct http_sock *s = sock_of(w);
    struct http_multi *hm = s->hm;
    int mask = 0;

    if (s->dead) {
        reap(hm);
        return;
    }
    if (revents == 0) {
        sock_arm(s); /* a poll was cancelled: arm again */
        return;
    }
    if (revents & (POLLIN | POLLHUP)) {
        mask |= CURL_CSELECT_IN;
    }
    if (revents & POLLOUT) {
        mask |= CURL_CSELECT_OUT;
    }
    if (revents & (POLLERR | POLLNVAL)) {
        mask |= CURL_CSELECT_ERR;
    }
    action(hm, s->fd, mask);
    /* s may have died in there, and been freed if no other poll of it
     * was armed: look it up before arming it again */
    for (struct http_sock *p = hm->socks; p; p = p->next) {
        if (p == s) {
            sock_arm(s);
            break;
        }
    }
}

static int sock_cb(CURL *e, curl_socket_t fd, int what, void *userp,
                   void *socketp)
{
    struct http_multi *hm = userp;
    struct http_sock *s = socketp;

    (void)e;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            s->dead = true;
            bi_fd_watch_cancel(&s->w);
            bi_curl.curl_multi_assign(hm->m, fd, NULL);
        }
        return 0;
    }
    if (!s) {
        s = bi_xzalloc(sizeof(*s));
        s->hm = hm;
        s->fd = fd;
        bi_fd_watch_init(&s->w, sock_event);
        s->next = hm->socks;
        hm->socks = s;
        bi_curl.curl_multi_assign(hm->m, fd, s);
    }
    s->what = what;
    sock_arm(s);
    return 0;
}

/* ----------------------------------------------------------------- timer */

static void timer_event(struct bi_fd_watch *w, unsigned revents)
{
    struct http_multi *hm = multi_of(w);
    uint64_t ticks;

    if (revents == 0) {
        if (hm->timer_armed) {
            bi_fd_watch_arm(&hm->timer, hm->timer_fd, true, false);
        }
        return;
    }
    if (read(hm->timer_fd, &ticks, sizeof(ticks)) < 0) {
        /* EAGAIN: set again meanwhile; libcurl is asked anyway */
    }
    hm->timer_armed = false;
    action(hm, CURL_SOCKET_TIMEOUT, 0);
    if (hm->timer_armed) {
        bi_fd_watch_arm(&hm->timer, hm->timer_fd, true, false);
    }
}

/* Sets fd to expire in ms milliseconds (0: at once; -1: never). */
static void timerfd_in(int fd, long ms)
{
    struct itimerspec its = {0};

    if (ms >= 0) {
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (ms % 1000) * 1000000L;
        if (ms == 0) {
            its.it_value.tv_nsec = 1; /* zero would disarm it */
        }
    }
    (void)timerfd_settime(fd, 0, &its, NULL);
}

static int timer_cb(CURLM *m, long timeout_ms, void *userp)
{
    struct http_multi *hm = userp;

    (void)m;
    timerfd_in(hm->timer_fd, timeout_ms);
    hm->timer_armed = timeout_ms >= 0;
    if (hm->timer_armed) {
        bi_fd_watch_arm(&hm->timer, hm->timer_fd, true, false);
    } else {
        bi_fd_watch_cancel(&hm->timer);
    }
    return 0;
}

/* ------------------------------------------------------------- interface */

int bi_http_multi_init(struct http_multi *hm, bi_error *err)
{
    memset(hm, 0, sizeof(*hm));
    bi_fd_watch_init(&hm->timer, timer_event);
    hm->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (hm->timer_fd < 0) {
        int e = errno;
        bi_error_set(err, e, "Could not create a timer");
        return -e;
    }
    hm->m = bi_curl.curl_multi_init();
    if (!hm->m) {
        close(hm->timer_fd);
        hm->timer_fd = -1;
        bi_error_set(err, 0, "libcurl initialization failed");
        return -ENOMEM;
    }
    bi_curl.curl_multi_setopt(hm->m, CURLMOPT_SOCKETFUNCTION, sock_cb);
    bi_curl.curl_multi_setopt(hm->m, CURLMOPT_SOCKETDATA, hm);
    bi_curl.curl_multi_setopt(hm->m, CURLMOPT_TIMERFUNCTION, timer_cb);
    bi_curl.curl_multi_setopt(hm->m, CURLMOPT_TIMERDATA, hm);
    return 0;
}

int64_t bi_http_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* libcurl's progress callback (at least once a second while a transfer
 * runs, the low-speed check's timer seeing to it): aborts a stall. */
static int xfer_progress(void *p, curl_off_t dltotal, curl_off_t dlnow,
                         curl_off_t ultotal, curl_off_t ulnow)
{
    struct http_xfer *x = p;
    int64_t t = bi_http_now_ms();

    (void)dltotal;
    (void)ultotal;
    if (dlnow + ulnow != x->moved) {
        x->moved = dlnow + ulnow;
        x->moved_ms = t;
    }
    return x->stall_ms && t - x->moved_ms >= x->stall_ms;
}

void bi_http_multi_run(struct http_multi *hm, struct http_xfer *x)
{
    x->co = bi_co_self();
    x->done = false;
    x->errbuf[0] = 0;
    assert(x->co);
    bi_curl.curl_easy_setopt(x->easy, CURLOPT_PRIVATE, (char *)x);
    bi_curl.curl_easy_setopt(x->easy, CURLOPT_ERRORBUFFER, x->errbuf);
    x->moved = 0;
    x->moved_ms = bi_http_now_ms();
    bi_curl.curl_easy_setopt(x->easy, CURLOPT_XFERINFOFUNCTION, xfer_progress);
    bi_curl.curl_easy_setopt(x->easy, CURLOPT_XFERINFODATA, x);
    bi_curl.curl_easy_setopt(x->easy, CURLOPT_NOPROGRESS, 0L);
    if (bi_curl.curl_multi_add_handle(hm->m, x->easy) != CURLM_OK) {
        x->result = CURLE_FAILED_INIT;
        x->done = true;
        return;
    }
    action(hm, CURL_SOCKET_TIMEOUT, 0); /* start it now */
    while (!x->done) {
        bi_co_yield();
    }
    if (x->result == CURLE_ABORTED_BY_CALLBACK) {
        /* the stall: in libcurl's words for a timeout */
        snprintf(x->errbuf, sizeof(x->errbuf),
                 "Operation timed out after %ld milliseconds with %" PRId64
                 " bytes received",
                 (long)(bi_http_now_ms() - x->moved_ms), (int64_t)x->moved);
    }
}

void bi_http_multi_close(struct http_multi *hm)
{
    if (!hm->m) {
        return;
    }
    /* libcurl may still call back while it closes its connections: the
     * callbacks only cancel from now on */
    bi_curl.curl_multi_setopt(hm->m, CURLMOPT_SOCKETFUNCTION, NULL);
    bi_curl.curl_multi_setopt(hm->m, CURLMOPT_TIMERFUNCTION, NULL);
    hm->timer_armed = false;
    for (struct http_sock *s = hm->socks; s; s = s->next) {
        s->dead = true;
        bi_fd_watch_stop(&s->w);
    }
    bi_fd_watch_stop(&hm->timer);
    bi_curl.curl_multi_cleanup(hm->m);
    hm->m = NULL;
    reap(hm);
    close(hm->timer_fd);
    hm->timer_fd = -1;
}

/* ----------------------------------------------------------------- sleep */

struct sleeper {
    struct bi_fd_watch w;
    int fd;
    bi_co *co;
    bool fired;
};

static void sleep_event(struct bi_fd_watch *w, unsigned revents)
{
    struct sleeper *s = (struct sleeper *)w; /* w is its first member */

    if (revents == 0) {
        bi_fd_watch_arm(w, s->fd, true, false);
        return;
    }
    s->fired = true;
    bi_co_wake(s->co);
}

void bi_http_sleep(int ms)
{
    struct sleeper s = {.co = bi_co_self()};

    s.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (s.fd < 0) {
        return; /* no timer: no pause */
    }
    bi_fd_watch_init(&s.w, sleep_event);
    timerfd_in(s.fd, ms);
    bi_fd_watch_arm(&s.w, s.fd, true, false);
    while (!s.fired) {
        bi_co_yield();
    }
    bi_fd_watch_stop(&s.w);
    close(s.fd);
}
