/* SPDX-License-Identifier: MIT */
/*
 * The "nbd" protocol driver: an NBD export through libnbd, in the block
 * layer's event loop (nbd_conn.c). Requests arrive aligned to the server's
 * minimum block size and split at its maximum (the node's limits); each
 * goes out as one NBD command per buffer segment, many in flight per
 * connection and spread over several connections where the server allows
 * multi-conn. Block status comes from base:allocation (or the context
 * x-dirty-bitmap names), refined by qemu:allocation-depth where offered.
 */
#include "protocol/nbd/nbd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NBD_MAX_BUFFER_SIZE: the most one request carries unless the server
 * states less (QEMU's limit too; libnbd refuses 64 MiB and more). */
#define NBD_MAX_REQUEST (32u << 20)
/* Write zeroes, trim and block status carry 32-bit lengths. */
#define NBD_MAX_LENGTH (1u << 30)
#define MAX_CONNS 16

struct nbd_state {
    struct nbd_target t;
    struct nbd_conn conns[MAX_CONNS];
    int n_conns;
    uint64_t size;
    uint32_t min_block, pref_block, max_block;
    bool can_flush, can_fua, can_trim, can_zero, can_fast_zero;
    bool has_status; /* base:allocation or the bitmap was negotiated */
    bool has_depth;  /* qemu:allocation-depth too */
    const char *status_ctx;
};

/* Wraps a completion so that several commands can be waited for as one:
 * left counts the commands in flight, err keeps the first error. */
struct nbd_batch {
    bi_co *co;
    int left;
    int err;
};
struct nbd_part {
    struct nbd_batch *b;
    struct nbd_conn *c;
};

static int part_done(void *user_data, int *error)
{
    struct nbd_part *p = user_data;

    p->c->in_flight--;
    if (*error && !p->b->err) {
        p->b->err = *error;
    }
    if (--p->b->left == 0 && p->b->co) {
        bi_co_wake(p->b->co);
    }
    return 1;
}

/* The ready connection with the fewest commands in flight, or NULL when
 * every connection is gone. */
static struct nbd_conn *pick_conn(struct nbd_state *s)
{
    struct nbd_conn *best = NULL;

    for (int i = 0; i < s->n_conns; i++) {
        struct nbd_conn *c = &s->conns[i];
        if (c->ready && !c->dead && (!best || c->in_flight < best->in_flight)) {
            best = c;
        }
    }
    return best;
}

/* libnbd fails the commands in flight on a connection that dies with
 * ENOTCONN: QEMU 7.2 reports those as EIO (and requests made after the
 * death as ESHUTDOWN, see issue()). */
static int io_errno(int e)
{
    switch (e) {
    case 0:
        return 0;
    case ENOTCONN:
    case ECONNRESET:
    case EPIPE:
        return -EIO;
    default:
        return -e;
    }
}

enum nbd_op { OP_READ, OP_WRITE, OP_ZERO, OP_TRIM, OP_FLUSH };

/* Issues one command on a connection, counted in b (part is its slot). */
static void issue(struct nbd_state *s, struct nbd_batch *b,
                  struct nbd_part *part, enum nbd_op op, void *buf,
                  uint64_t off, uint64_t len, uint32_t flags)
{
    struct nbd_conn *c = pick_conn(s);
    int64_t cookie = -1;

    if (!c) {
        if (!b->err) {
            b->err = ESHUTDOWN; /* every connection is gone */
        }
        return;
    }
    part->b = b;
    part->c = c;
    nbd_completion_callback cb = {.callback = part_done, .user_data = part};
    switch (op) {
    case OP_READ:
        cookie = nbd_aio_pread(c->h, buf, len, off, cb, 0);
        break;
    case OP_WRITE:
        cookie = nbd_aio_pwrite(c->h, buf, len, off, cb, flags);
        break;
    case OP_ZERO:
        cookie = nbd_aio_zero(c->h, len, off, cb, flags);
        break;
    case OP_TRIM:
        cookie = nbd_aio_trim(c->h, len, off, cb, flags);
        break;
    case OP_FLUSH:
        cookie = nbd_aio_flush(c->h, cb, 0);
        break;
    }
    if (cookie < 0) {
        /* refused at once: on a dead connection, "transport endpoint
         * shutdown" as QEMU says */
        int e = nbd_get_errno() ? nbd_get_errno() : EIO;
        if (!b->err) {
            b->err = c->dead || e == ENOTCONN ? ESHUTDOWN : e;
        }
    } else {
        b->left++;
        c->in_flight++;
    }
    bi_nbd_conn_update(c);
}

static int batch_wait(struct nbd_batch *b)
{
    while (b->left) {
        bi_co_yield();
    }
    return io_errno(b->err);
}

/* ------------------------------------------------------------ read/write */

/* Moves [off, off+len) in one command per iov segment, all in flight at
 * once. Reads past the end of the export are zeroes; writes there fail. */
static int nbd_rw(bi_node *n, bool write, uint64_t off, uint64_t len,
                  const struct iovec *iov, int iovcnt, uint32_t flags)
{
    struct nbd_state *s = n->opaque;
    struct nbd_part stack[16];
    struct nbd_part *parts =
        iovcnt <= 16 ? stack : bi_xmalloc(sizeof(*parts) * (size_t)iovcnt);
    struct nbd_batch b = {.co = bi_co_self()};
    uint64_t pos = off;

    for (int i = 0; i < iovcnt && pos < off + len; i++) {
        uint64_t l = BI_MIN((uint64_t)iov[i].iov_len, off + len - pos);
        uint64_t in = pos < s->size ? BI_MIN(l, s->size - pos) : 0;
        if (in < l) {
            if (write) {
                b.err = ENOSPC;
                break;
            }
            memset((char *)iov[i].iov_base + in, 0, l - in);
        }
        if (in) {
            issue(s, &b, &parts[i], write ? OP_WRITE : OP_READ, iov[i].iov_base,
                  pos, in, flags);
        }
        pos += l;
    }
    int ret = batch_wait(&b);
    if (parts != stack) {
        free(parts);
    }
    if (ret == 0) {
        bi_stats_io(n, write ? 0 : len, write ? len : 0);
    }
    return ret;
}

static int nbd_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                         const struct iovec *iov, int iovcnt)
{
    return nbd_rw(n, false, off, len, iov, iovcnt, 0);
}

static int nbd_co_flush(bi_node *n);

static int nbd_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                          const struct iovec *iov, int iovcnt, int flags)
{
    struct nbd_state *s = n->opaque;
    bool fua = (flags & BI_REQ_FUA) != 0;
    int ret = nbd_rw(n, true, off, len, iov, iovcnt,
                     fua && s->can_fua ? LIBNBD_CMD_FLAG_FUA : 0);

    if (ret == 0 && fua && !s->can_fua) {
        ret = nbd_co_flush(n);
    }
    return ret;
}

/* One command of a kind that carries no data, cut at NBD_MAX_LENGTH. */
static int nbd_ranged(struct nbd_state *s, enum nbd_op op, uint64_t off,
                      uint64_t len, uint32_t flags)
{
    uint64_t step = bi_align_down(NBD_MAX_LENGTH, BI_MAX(s->min_block, 1u));
    int ret = 0;

    while (len && ret == 0) {
        struct nbd_batch b = {.co = bi_co_self()};
        struct nbd_part part;
        uint64_t l = BI_MIN(len, step);
        issue(s, &b, &part, op, NULL, off, l, flags);
        ret = batch_wait(&b);
        off += l;
        len -= l;
    }
    return ret;
}

static int nbd_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                                int flags)
{
    struct nbd_state *s = n->opaque;
    uint32_t f = 0;
    int ret;

    if (!s->can_zero) {
        return -ENOTSUP;
    }
    if (off + len > s->size) {
        return -ENOSPC;
    }
    if (flags & BI_REQ_NO_FALLBACK) {
        /* must be fast: only a server that promises fast zeroes */
        if (!s->can_fast_zero) {
            return -ENOTSUP;
        }
        f |= LIBNBD_CMD_FLAG_FAST_ZERO;
    }
    if (!(flags & BI_REQ_MAY_UNMAP)) {
        f |= LIBNBD_CMD_FLAG_NO_HOLE;
    }
    if ((flags & BI_REQ_FUA) && s->can_fua) {
        f |= LIBNBD_CMD_FLAG_FUA;
    }
    ret = nbd_ranged(s, OP_ZERO, off, len, f);
    if (ret == 0 && (flags & BI_REQ_FUA) && !s->can_fua) {
        ret = nbd_co_flush(n);
    }
    return ret == -EOPNOTSUPP ? -ENOTSUP : ret;
}

static int nbd_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    struct nbd_state *s = n->opaque;

    if (!s->can_trim || off >= s->size) {
        return -ENOTSUP;
    }
    return nbd_ranged(s, OP_TRIM, off, BI_MIN(len, s->size - off), 0);
}

static int nbd_co_flush(bi_node *n)
{
    struct nbd_state *s = n->opaque;
    struct nbd_batch b = {.co = bi_co_self()};
    struct nbd_part part;

    if (!s->can_flush || n->read_only) {
        return 0;
    }
    /* with multi-conn, one flush covers the writes of every connection */
    issue(s, &b, &part, OP_FLUSH, NULL, 0, 0, 0);
    return batch_wait(&b);
}

/* --------------------------------------------------------- block status */

/* The first run of one kind that one context reported. */
struct nbd_run {
    bool set;
    uint64_t len;
    uint32_t flags;
};
struct nbd_status_args {
    struct nbd_state *s;
    struct nbd_run base, depth;
};

/* Extent callback: the leading entries with the flags of the first, as
 * one run (entries are length, flags pairs). */
static int status_extents(void *user_data, const char *ctx, uint64_t offset,
                          uint32_t *entries, size_t nr, int *error)
{
    struct nbd_status_args *a = user_data;
    struct nbd_run *r;

    (void)offset;
    (void)error;
    if (!strcmp(ctx, a->s->status_ctx)) {
        r = &a->base;
    } else if (!strcmp(ctx, "qemu:allocation-depth")) {
        r = &a->depth;
    } else {
        return 0;
    }
    if (r->set || nr < 2) {
        return 0;
    }
    r->set = true;
    r->flags = entries[1];
    for (size_t i = 0; i + 1 < nr && entries[i + 1] == r->flags; i += 2) {
        r->len += entries[i];
    }
    return 0;
}

/* Status of [off, off+len): base:allocation's hole and zero bits (QEMU's
 * reading: not a hole is data); qemu:allocation-depth 0 marks the run
 * unallocated in the server's image, which reads as zeroes. */
static int nbd_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                               struct bi_status *st)
{
    struct nbd_state *s = n->opaque;
    struct nbd_status_args a = {.s = s};
    struct nbd_cmd cmd;
    struct nbd_conn *c;
    int ret;

    memset(st, 0, sizeof(*st));
    st->offset = off;
    st->file = n;
    if (off >= s->size) {
        st->len = len;
        st->flags = BI_BS_ZERO | BI_BS_OFFSET_VALID | BI_BS_EOF;
        return 0;
    }
    len = BI_MIN(len, s->size - off);
    st->len = len;
    st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
    if (!s->has_status) {
        return 0; /* the server says nothing: all data */
    }
    len = BI_MIN(len, bi_align_down(NBD_MAX_LENGTH, BI_MAX(s->min_block, 1u)));
    c = pick_conn(s);
    if (!c) {
        return -ESHUTDOWN;
    }
    nbd_extent_callback ecb = {.callback = status_extents, .user_data = &a};
    ret = bi_nbd_cmd_wait(c, &cmd,
                          nbd_aio_block_status(c->h, len, off, ecb,
                                               bi_nbd_cmd_callback(&cmd), 0));
    if (ret < 0) {
        return io_errno(-ret);
    }
    if (!a.base.set || a.base.len == 0) {
        return -EIO; /* the server broke the protocol */
    }
    st->len = BI_MIN(a.base.len, len);
    st->flags = (a.base.flags & LIBNBD_STATE_HOLE ? 0 : BI_BS_DATA) |
                (a.base.flags & LIBNBD_STATE_ZERO ? BI_BS_ZERO : 0) |
                BI_BS_OFFSET_VALID;
    if (a.depth.set && a.depth.len) {
        st->len = BI_MIN(st->len, a.depth.len);
        if (a.depth.flags == 0) {
            st->flags = BI_BS_ZERO | BI_BS_OFFSET_VALID | BI_BS_NOT_ALLOCATED;
        }
    }
    if (off + st->len >= s->size) {
        st->flags |= BI_BS_EOF;
    }
    return 0;
}

/* ------------------------------------------------------------ open/close */

/* What the first connection learnt about the export. */
static void read_export(struct nbd_state *s, struct nbd_handle *h)
{
    int64_t v;

    s->size = (uint64_t)BI_MAX(nbd_get_size(h), 0);
    s->can_flush = nbd_can_flush(h) > 0;
    s->can_fua = nbd_can_fua(h) > 0;
    s->can_trim = nbd_can_trim(h) > 0;
    s->can_zero = nbd_can_zero(h) > 0;
    s->can_fast_zero = nbd_can_fast_zero(h) > 0;
    s->status_ctx = s->t.bitmap ? s->t.bitmap : LIBNBD_CONTEXT_BASE_ALLOCATION;
    s->has_status = nbd_can_meta_context(h, s->status_ctx) > 0;
    s->has_depth =
        !s->t.bitmap && nbd_can_meta_context(h, "qemu:allocation-depth") > 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
    s->min_block = v > 0 ? (uint32_t)v : 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
    s->pref_block = v > 0 ? (uint32_t)v : 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
    s->max_block = v > 0 ? (uint32_t)v : 0;
}

struct open_args {
    bi_node *n;
    bool read_write;
    bi_error *err;
};

/* Connects (in a coroutine): the first connection with its handshake
 * waited for, then the extra ones of multi-conn, which join as they
 * become ready. */
static int open_co(void *opaque)
{
    struct open_args *a = opaque;
    struct nbd_state *s = a->n->opaque;
    struct nbd_handle *h;
    int ret;

    s->n_conns = 1;
    ret = bi_nbd_conn_start(&s->conns[0], &s->t, true, a->err);
    if (ret == 0) {
        ret = bi_nbd_conn_finish(&s->conns[0], &s->t, a->err);
    }
    if (ret < 0) {
        return ret;
    }
    h = s->conns[0].h;
    read_export(s, h);
    if (a->read_write && nbd_is_read_only(h) > 0) {
        bi_error_set(a->err, EACCES, "Could not open image");
        return -EACCES;
    }
    if (nbd_can_multi_conn(h) > 0) {
        for (int i = 1; i < s->t.multi_conn && i < MAX_CONNS; i++) {
            if (bi_nbd_conn_start(&s->conns[i], &s->t, false, a->err) < 0) {
                break;
            }
            s->n_conns++;
        }
    }
    return 0;
}

static void nbd_close_conns(struct nbd_state *s);

static int nbd_parse_filename(const char *filename, struct bi_optlist *l,
                              bi_error *err)
{
    return bi_nbd_parse_filename(filename, l, err);
}

static int nbd_drv_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct nbd_state *s = n->opaque;
    struct open_args a = {n, o->read_write, err};
    int ret = bi_nbd_target_parse(o->protocol_opts, &s->t, err);

    if (ret < 0) {
        return ret;
    }
    ret = bi_run_co(open_co, &a);
    if (ret < 0) {
        nbd_close_conns(s);
        bi_nbd_target_free(&s->t);
        return ret;
    }
    n->size = s->size;
    free(n->filename);
    n->filename = bi_nbd_target_name(&s->t); /* QEMU shows this name */
    return 0;
}

struct close_args {
    struct nbd_state *s;
};

/* Ends the connections politely (NBD_CMD_DISC), without waiting for the
 * server: the watches are stopped and the handles closed. */
static int close_co(void *opaque)
{
    struct nbd_state *s = opaque;

    for (int i = 0; i < s->n_conns; i++) {
        struct nbd_conn *c = &s->conns[i];
        if (c->ready && !c->dead && c->in_flight == 0) {
            (void)nbd_aio_disconnect(c->h, 0);
        }
        bi_nbd_conn_close(c);
    }
    return 0;
}

static void nbd_close_conns(struct nbd_state *s)
{
    bi_run_co(close_co, s);
    s->n_conns = 0;
}

static void nbd_drv_close(bi_node *n)
{
    struct nbd_state *s = n->opaque;

    if (!s) {
        return;
    }
    nbd_close_conns(s);
    bi_nbd_target_free(&s->t);
}

/* The server's block-size constraints are the node's limits: minimum ->
 * request alignment, preferred -> optimal transfer, maximum -> max
 * transfer (at most 32 MiB, NBD's usual bound). */
static void nbd_refresh_limits(bi_node *n)
{
    struct nbd_state *s = n->opaque;
    struct bi_limits *l = &n->limits;

    memset(l, 0, sizeof(*l));
    l->request_alignment = s->min_block ? s->min_block : 1;
    l->request_alignment_source = s->min_block ? BI_SRC_SERVER : BI_SRC_DRIVER;
    l->min_mem_alignment = 1; /* a socket takes any buffer */
    l->mem_alignment_source = BI_SRC_DRIVER;
    l->opt_transfer = s->pref_block;
    l->max_transfer =
        s->max_block ? BI_MIN(s->max_block, NBD_MAX_REQUEST) : NBD_MAX_REQUEST;
}

/* An export has the size its server gives it: QEMU's rules and words. */
static int nbd_co_truncate(bi_node *n, uint64_t size, bool exact,
                           enum bi_prealloc prealloc, bi_error *err)
{
    struct nbd_state *s = n->opaque;

    (void)prealloc;
    if (size != s->size && exact) {
        bi_error_set(err, 0, "Cannot resize NBD nodes");
        return -ENOTSUP;
    }
    if (size > s->size) {
        bi_error_set(err, 0, "Cannot grow NBD nodes");
        return -EINVAL;
    }
    return 0;
}

static int nbd_storage_info(bi_node *n, struct bi_storage_info *out)
{
    struct nbd_state *s = n->opaque;

    snprintf(out->filesystem, sizeof(out->filesystem), "nbd (%s)",
             s->t.is_unix ? "unix" : "inet");
    return 0;
}

static const char *const nbd_prefixes[] = {
    "nbd", "nbd+tcp", "nbd+unix", "nbds", "nbds+tcp", "nbds+unix", NULL,
};

const struct bi_driver bi_drv_nbd = {
    .name = "nbd",
    .is_protocol = true,
    .state_size = sizeof(struct nbd_state),
    .prefixes = nbd_prefixes,
    .parse_filename = nbd_parse_filename,
    .open = nbd_drv_open,
    .close = nbd_drv_close,
    .refresh_limits = nbd_refresh_limits,
    .co_preadv = nbd_co_preadv,
    .co_pwritev = nbd_co_pwritev,
    .co_pwrite_zeroes = nbd_co_pwrite_zeroes,
    .co_pdiscard = nbd_co_pdiscard,
    .co_flush = nbd_co_flush,
    .co_truncate = nbd_co_truncate,
    .co_block_status = nbd_co_block_status,
    .storage_info = nbd_storage_info,
};
