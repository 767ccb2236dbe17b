/* SPDX-License-Identifier: MIT */
/*
 * NBD connections in the block layer's event loop. libnbd runs in its
 * asynchronous mode: it says which way its socket must become ready
 * (nbd_aio_get_direction), the loop polls that (a bi_fd_watch: io_uring
 * poll requests, or poll(2) in the thread engine, alongside file I/O), and
 * the watch's callback tells libnbd (nbd_aio_notify_read/write), which
 * then runs completion callbacks that wake the waiting coroutines. Nothing
 * here blocks the loop thread: connecting, TLS and the handshake go the
 * same way.
 */
#include "protocol/nbd/nbd.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define conn_of(w)                                                             \
    ((struct nbd_conn *)((char *)(w)-offsetof(struct nbd_conn, watch)))

/* Keeps libnbd's last error (the one of the call that just failed). */
static void conn_failed(struct nbd_conn *c)
{
    const char *msg = bi_nbd.nbd_get_error();

    if (c->err == 0) {
        c->err = bi_nbd.nbd_get_errno() ? bi_nbd.nbd_get_errno() : EIO;
        free(c->errmsg);
        c->errmsg = bi_xstrdup(msg ? msg : "connection failed");
    }
}

static void conn_event(struct bi_fd_watch *w, unsigned revents)
{
    struct nbd_conn *c = conn_of(w);
    unsigned dir;
    int r = 0;

    if (!c->h || c->dead) {
        return;
    }
    dir = bi_nbd.nbd_aio_get_direction(c->h);
    if ((revents & (POLLIN | POLLHUP | POLLERR)) &&
        (dir & LIBNBD_AIO_DIRECTION_READ)) {
        r = bi_nbd.nbd_aio_notify_read(c->h);
    } else if ((revents & (POLLOUT | POLLHUP | POLLERR)) &&
               (dir & LIBNBD_AIO_DIRECTION_WRITE)) {
        r = bi_nbd.nbd_aio_notify_write(c->h);
    }
    if (r < 0) {
        conn_failed(c);
    }
    bi_nbd_conn_update(c);
}

void bi_nbd_conn_update(struct nbd_conn *c)
{
    if (!c->h) {
        return;
    }
    if (bi_nbd.nbd_aio_is_dead(c->h) || bi_nbd.nbd_aio_is_closed(c->h)) {
        /* libnbd has failed every command in flight (their callbacks ran)
         * and closed the socket: nothing more to watch */
        if (!c->dead) {
            conn_failed(c); /* libnbd's last error tells why */
        }
        c->dead = true;
        c->ready = false;
        bi_fd_watch_cancel(&c->watch);
    } else {
        if (!c->ready && c->auto_go && bi_nbd.nbd_aio_is_ready(c->h)) {
            c->ready = true; /* an extra connection joins */
        }
        int fd = bi_nbd.nbd_aio_get_fd(c->h);
        unsigned dir = bi_nbd.nbd_aio_get_direction(c->h);
        /* a ready connection with nothing in flight waits for nothing */
        bool busy = !bi_nbd.nbd_aio_is_ready(c->h) ||
                    bi_nbd.nbd_aio_in_flight(c->h) > 0;
        if (fd >= 0) {
            bi_fd_watch_arm(&c->watch, fd,
                            busy && (dir & LIBNBD_AIO_DIRECTION_READ),
                            (dir & LIBNBD_AIO_DIRECTION_WRITE) != 0);
        }
    }
    if (c->waiter) {
        bi_co_wake(c->waiter);
    }
}

/* Sets up TLS on h for t. 0 or -1 (libnbd's error). */
static int conn_tls(struct nbd_handle *h, const struct nbd_target *t)
{
    if (!t->tls) {
        return bi_nbd.nbd_set_tls(h, LIBNBD_TLS_DISABLE);
    }
    if (bi_nbd.nbd_set_tls(h, LIBNBD_TLS_REQUIRE) < 0) {
        return -1;
    }
    if (t->psk_file) {
        if (bi_nbd.nbd_set_tls_psk_file(h, t->psk_file) < 0 ||
            bi_nbd.nbd_set_tls_username(h, t->username) < 0) {
            return -1;
        }
        return 0;
    }
    if (t->certificates &&
        bi_nbd.nbd_set_tls_certificates(h, t->certificates) < 0) {
        return -1;
    }
    return bi_nbd.nbd_set_tls_verify_peer(h, t->verify_peer);
}

int bi_nbd_conn_start(struct nbd_conn *c, const struct nbd_target *t,
                      bool first, bi_error *err)
{
    int r;

    memset(c, 0, sizeof(*c));
    bi_fd_watch_init(&c->watch, conn_event);
    r = bi_nbd_load(err);
    if (r < 0)
        return r;
    struct nbd_handle *h = bi_nbd.nbd_create();
    if (!h) {
        bi_error_set(err, 0, "%s", bi_nbd.nbd_get_error());
        return -ENOMEM;
    }
    c->h = h;
    c->auto_go = !first;
    /* the first connection stops before NBD_OPT_GO so that a refused
     * export is told apart from a failed connection */
    r = bi_nbd.nbd_set_opt_mode(h, first);
    if (r == 0) {
        r = bi_nbd.nbd_set_export_name(h, t->export);
    }
    if (r == 0) {
        r = bi_nbd.nbd_set_pread_initialize(h, false);
    }
    if (r == 0 && t->bitmap) {
        r = bi_nbd.nbd_add_meta_context(h, t->bitmap);
    } else if (r == 0) {
        r = bi_nbd.nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION);
        if (r == 0) {
            r = bi_nbd.nbd_add_meta_context(h, "qemu:allocation-depth");
        }
    }
    if (r == 0) {
        r = conn_tls(h, t);
    }
    if (r == 0) {
        r = t->is_unix ? bi_nbd.nbd_aio_connect_unix(h, t->path)
                       : bi_nbd.nbd_aio_connect_tcp(h, t->host, t->port);
    }
    if (r < 0) {
        conn_failed(c);
    }
    bi_nbd_conn_update(c);
    return 0;
}

/* QEMU's words for a connection that ended before negotiating. */
static void connect_error(const struct nbd_conn *c, const struct nbd_target *t,
                          bi_error *err)
{
    const char *msg = c->errmsg ? c->errmsg : "connection closed";

    if (strstr(msg, "connect: ")) {
        if (t->is_unix) {
            bi_error_set(err, c->err, "Failed to connect to '%s'", t->path);
        } else {
            bi_error_set(err, c->err, "Failed to connect to '%s:%s'", t->host,
                         t->port);
        }
    } else if (t->tls && c->err == ENOTSUP && strstr(msg, "TLS")) {
        bi_error_set(err, 0, "Denied by server for option 5 (starttls)");
    } else {
        /* libnbd's own description, without its function name */
        const char *p = strstr(msg, ": ");
        bi_error_set(err, 0, "%s", p ? p + 2 : msg);
    }
}

/* QEMU's words for NBD_OPT_GO refused. */
static void go_error(int e, const struct nbd_conn *c,
                     const struct nbd_target *t, bi_error *err)
{
    if (e == ENOENT) {
        bi_error_set(err, 0, "Requested export not available");
    } else if (e == ENOTSUP && !t->tls) {
        bi_error_set(err, 0, "TLS negotiation required before option 7 (go)");
    } else if (e == EPERM || e == EACCES) {
        bi_error_set(err, 0, "Denied by server for option 7 (go)");
    } else if (c->dead) {
        connect_error(c, t, err);
    } else {
        bi_error_set(err, e, "Server refused option 7 (go)");
    }
}

static int cmd_done(void *user_data, int *error)
{
    struct nbd_cmd *cmd = user_data;

    cmd->err = *error;
    cmd->done = true;
    if (cmd->co) {
        bi_co_wake(cmd->co);
    }
    return 1; /* retire the command */
}

nbd_completion_callback bi_nbd_cmd_callback(struct nbd_cmd *cmd)
{
    cmd->co = bi_co_self();
    cmd->done = false;
    cmd->err = 0;
    return (nbd_completion_callback){.callback = cmd_done, .user_data = cmd};
}

int bi_nbd_conn_finish(struct nbd_conn *c, const struct nbd_target *t,
                       bi_error *err)
{
    struct nbd_cmd go;

    c->waiter = bi_co_self();
    while (!c->dead && bi_nbd.nbd_aio_is_connecting(c->h)) {
        bi_co_yield();
    }
    c->waiter = NULL;
    if (c->dead || !bi_nbd.nbd_aio_is_negotiating(c->h)) {
        connect_error(c, t, err);
        return -(c->err ? c->err : EIO);
    }
    nbd_completion_callback cb = bi_nbd_cmd_callback(&go);
    if (bi_nbd.nbd_aio_opt_go(c->h, cb) < 0) {
        conn_failed(c);
        go_error(c->err, c, t, err);
        return -EIO;
    }
    bi_nbd_conn_update(c);
    c->waiter = bi_co_self();
    while (!go.done && !c->dead) {
        bi_co_yield();
    }
    c->waiter = NULL;
    if (!go.done || go.err || !bi_nbd.nbd_aio_is_ready(c->h)) {
        go_error(go.done ? go.err : c->err, c, t, err);
        return -EIO;
    }
    c->ready = true;
    bi_nbd_conn_update(c);
    return 0;
}

int bi_nbd_cmd_wait(struct nbd_conn *c, struct nbd_cmd *cmd, int64_t cookie)
{
    if (cookie < 0) {
        int e = bi_nbd.nbd_get_errno();
        bi_nbd_conn_update(c);
        return -(e ? e : EIO);
    }
    c->in_flight++;
    bi_nbd_conn_update(c);
    while (!cmd->done) {
        bi_co_yield();
    }
    c->in_flight--;
    return -cmd->err;
}

void bi_nbd_conn_close(struct nbd_conn *c)
{
    bi_fd_watch_stop(&c->watch);
    if (c->h) {
        bi_nbd.nbd_close(c->h);
        c->h = NULL;
    }
    free(c->errmsg);
    c->errmsg = NULL;
}
