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

/* The runs of the last block-status reply, from start to end. */
struct nbd_status_cache {
    uint64_t start, end;
    struct nbd_status_run {
        uint64_t len;
        unsigned flags;
    } * runs;
    size_t n, cap;
    size_t hint; /* the run the last lookup found */
};

struct nbd_state {
    struct nbd_target t;
    struct nbd_status_cache cache;
    uint64_t cache_gen; /* changed by every write, zero and trim */
    int writes;         /* writes, zeroes and trims in flight */
    struct nbd_conn conns[MAX_CONNS];
    int n_conns;
    uint64_t size;
    uint32_t min_block, pref_block, max_block;
    bool can_flush, can_fua, can_trim, can_zero, can_fast_zero;
    bool has_status;    /* base:allocation or the bitmap was negotiated */
    bool has_depth;     /* qemu:allocation-depth too */
    bool depth_as_bits; /* x-dirty-bitmap=qemu:allocation-depth */
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
        cookie = bi_nbd.nbd_aio_pread(c->h, buf, len, off, cb, 0);
        break;
    case OP_WRITE:
        cookie = bi_nbd.nbd_aio_pwrite(c->h, buf, len, off, cb, flags);
        break;
    case OP_ZERO:
        cookie = bi_nbd.nbd_aio_zero(c->h, len, off, cb, flags);
        break;
    case OP_TRIM:
        cookie = bi_nbd.nbd_aio_trim(c->h, len, off, cb, flags);
        break;
    case OP_FLUSH:
        cookie = bi_nbd.nbd_aio_flush(c->h, cb, 0);
        break;
    }
    if (cookie < 0) {
        /* refused at once: on a dead connection, "transport endpoint
         * shutdown" as QEMU says */
        int e = bi_nbd.nbd_get_errno() ? bi_nbd.nbd_get_errno() : EIO;
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

/* A write, zero or trim starts or ends: block status cached before it, or
 * asked while it runs, may be stale (nbd_co_block_status). */
static void change_begin(struct nbd_state *s)
{
    s->writes++;
    s->cache.start = s->cache.end = 0;
    s->cache_gen++;
}

static void change_end(struct nbd_state *s)
{
    s->writes--;
    s->cache.start = s->cache.end = 0;
    s->cache_gen++;
}

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

    if (write) {
        change_begin(s);
    }
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
    if (write) {
        change_end(s);
    }
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

    change_begin(s);
    while (len && ret == 0) {
        struct nbd_batch b = {.co = bi_co_self()};
        struct nbd_part part;
        uint64_t l = BI_MIN(len, step);
        issue(s, &b, &part, op, NULL, off, l, flags);
        ret = batch_wait(&b);
        off += l;
        len -= l;
    }
    change_end(s);
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

/* What the server reported for one context: (length, flags) pairs from
 * the queried offset (libnbd's entries, copied). */
struct nbd_extents {
    uint32_t *v;
    size_t n; /* entries: n / 2 pairs */
};
struct nbd_status_args {
    struct nbd_state *s;
    struct nbd_extents base, depth;
};

static int status_extents(void *user_data, const char *ctx, uint64_t offset,
                          uint32_t *entries, size_t nr, int *error)
{
    struct nbd_status_args *a = user_data;
    struct nbd_extents *e;

    (void)offset;
    (void)error;
    if (!strcmp(ctx, a->s->status_ctx)) {
        e = &a->base;
    } else if (!strcmp(ctx, "qemu:allocation-depth")) {
        e = &a->depth;
    } else {
        return 0;
    }
    if (e->v || nr < 2) {
        return 0; /* one reply per context is all a server sends */
    }
    e->v = bi_xmalloc(nr * sizeof(*e->v));
    memcpy(e->v, entries, nr * sizeof(*e->v));
    e->n = nr & ~(size_t)1;
    for (size_t i = 1; a->s->depth_as_bits && i < e->n; i += 2) {
        e->v[i] = BI_MIN(e->v[i], 2u);
    }
    return 0;
}

/* The node's flags for a run: base:allocation's hole and zero bits (QEMU's
 * reading: what is not a hole is data); allocation depth 0 (allocated
 * nowhere in the server's image) reads as zeroes, unallocated. */
static unsigned run_flags(uint32_t base, bool has_depth, uint32_t depth)
{
    unsigned f;

    if (has_depth && depth == 0) {
        return BI_BS_ZERO | BI_BS_NOT_ALLOCATED;
    }
    f = (base & LIBNBD_STATE_HOLE ? 0 : BI_BS_DATA) |
        (base & LIBNBD_STATE_ZERO ? BI_BS_ZERO : 0);
    /* what is neither data nor zeroes is unallocated: QEMU shows no
     * offset for it (a hole bit alone, as x-dirty-bitmap reads) */
    return f ? f | BI_BS_OFFSET_VALID : 0;
}

static void cache_push(struct nbd_status_cache *c, uint64_t len, unsigned flags)
{
    if (c->n && c->runs[c->n - 1].flags == flags) {
        c->runs[c->n - 1].len += len;
    } else {
        c->runs = bi_xgrow(c->runs, &c->cap, c->n, sizeof(*c->runs));
        c->runs[c->n].len = len;
        c->runs[c->n].flags = flags;
        c->n++;
    }
    c->end += len;
}

/* Replaces the cache with the runs of one reply from off, at most len
 * bytes: the two contexts' extents cut at each other's boundaries. */
static void cache_fill(struct nbd_status_cache *c, uint64_t off, uint64_t len,
                       const struct nbd_extents *b, const struct nbd_extents *d)
{
    size_t i = 0, j = 0;
    uint64_t bl = b->v[0], dl = d->v ? d->v[0] : UINT64_MAX;

    c->start = c->end = off;
    c->n = 0;
    c->hint = 0;
    while (i < b->n && c->end - off < len) {
        uint64_t l = BI_MIN(BI_MIN(bl, dl), len - (c->end - off));
        if (l == 0) {
            break; /* a server sending empty extents: stop there */
        }
        cache_push(
            c, l, run_flags(b->v[i + 1], d->v != NULL, d->v ? d->v[j + 1] : 0));
        bl -= l;
        dl -= l;
        if (bl == 0 && (i += 2) < b->n) {
            bl = b->v[i];
        }
        if (d->v && dl == 0) {
            if ((j += 2) >= d->n) {
                break; /* the depth reply ends first */
            }
            dl = d->v[j];
        }
    }
}

/* Answers from the cache: the run holding off, cut at len. */
static bool cache_lookup(struct nbd_status_cache *c, uint64_t off, uint64_t len,
                         struct bi_status *st)
{
    uint64_t pos;
    size_t k;

    if (off < c->start || off >= c->end) {
        return false;
    }
    /* the copy engine walks forward: start at the last run found */
    k = c->hint < c->n ? c->hint : 0;
    pos = c->start;
    for (size_t q = 0; q < k; q++) {
        pos += c->runs[q].len;
    }
    if (pos > off) {
        k = 0;
        pos = c->start;
    }
    while (pos + c->runs[k].len <= off) {
        pos += c->runs[k++].len;
    }
    c->hint = k;
    st->len = BI_MIN(len, pos + c->runs[k].len - off);
    st->flags = c->runs[k].flags;
    return true;
}

/* Asks the server about [off, off+len) (one command) and caches every run
 * of the reply unless a write ran meanwhile. 0 or -errno. */
static int status_query(struct nbd_state *s, uint64_t off, uint64_t len)
{
    struct nbd_status_args a = {.s = s};
    struct nbd_cmd cmd;
    struct nbd_conn *c = pick_conn(s);
    uint64_t gen = s->cache_gen;
    int ret;

    if (!c) {
        return -ESHUTDOWN;
    }
    nbd_extent_callback ecb = {.callback = status_extents, .user_data = &a};
    ret =
        bi_nbd_cmd_wait(c, &cmd,
                        bi_nbd.nbd_aio_block_status(
                            c->h, len, off, ecb, bi_nbd_cmd_callback(&cmd), 0));
    if (ret < 0) {
        ret = io_errno(-ret);
    } else if (!a.base.v || a.base.v[0] == 0) {
        ret = -EIO; /* the server broke the protocol */
    } else if (gen == s->cache_gen && s->writes == 0) {
        cache_fill(&s->cache, off, len, &a.base, &a.depth);
    } else {
        /* only the first run can be trusted: a write was in flight */
        struct nbd_extents one = {a.base.v, 2}, d1 = {a.depth.v, 2};
        cache_fill(&s->cache, off, BI_MIN(len, a.base.v[0]), &one,
                   a.depth.v ? &d1 : &a.depth);
        s->cache_gen++; /* used once below, then stale */
    }
    free(a.base.v);
    free(a.depth.v);
    return ret;
}

/* Status of [off, off+len), from the runs of the last reply when it
 * covers off: one request for a whole map instead of one per extent. */
static int nbd_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                               struct bi_status *st)
{
    struct nbd_state *s = n->opaque;

    if (bi_status_protocol_start(n, s->size, off, &len, st)) {
        return 0;
    }
    if (!s->has_status) {
        st->len = len; /* the server says nothing: all data */
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
    } else if (!cache_lookup(&s->cache, off, len, st)) {
        uint64_t q =
            BI_MIN(s->size - off,
                   bi_align_down(NBD_MAX_LENGTH, BI_MAX(s->min_block, 1u)));
        int ret = status_query(s, off, q);
        if (ret < 0) {
            return ret;
        }
        if (!cache_lookup(&s->cache, off, len, st)) {
            return -EIO;
        }
    }
    if (s->min_block > 1 && !bi_is_aligned(st->len, s->min_block)) {
        /* a server breaking the protocol with an unaligned extent (qemu-nbd
         * 3.1 on files of odd sizes): QEMU's workaround, cut it, or read
         * one block as data */
        if (st->len > s->min_block) {
            st->len = bi_align_down(st->len, s->min_block);
        } else {
            st->len = BI_MIN(len, (uint64_t)s->min_block);
            st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
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

    s->size = (uint64_t)BI_MAX(bi_nbd.nbd_get_size(h), 0);
    s->can_flush = bi_nbd.nbd_can_flush(h) > 0;
    s->can_fua = bi_nbd.nbd_can_fua(h) > 0;
    s->can_trim = bi_nbd.nbd_can_trim(h) > 0;
    s->can_zero = bi_nbd.nbd_can_zero(h) > 0;
    s->can_fast_zero = bi_nbd.nbd_can_fast_zero(h) > 0;
    s->status_ctx = s->t.bitmap ? s->t.bitmap : LIBNBD_CONTEXT_BASE_ALLOCATION;
    s->has_status = bi_nbd.nbd_can_meta_context(h, s->status_ctx) > 0;
    s->has_depth = !s->t.bitmap &&
                   bi_nbd.nbd_can_meta_context(h, "qemu:allocation-depth") > 0;
    /* QEMU's hack: x-dirty-bitmap=qemu:allocation-depth reads depths as
     * base:allocation bits, 3 and more as 2 */
    s->depth_as_bits =
        s->t.bitmap && !strcmp(s->t.bitmap, "qemu:allocation-depth");
    v = bi_nbd.nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
    s->min_block = v > 0 ? (uint32_t)v : 0;
    v = bi_nbd.nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
    s->pref_block = v > 0 ? (uint32_t)v : 0;
    v = bi_nbd.nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
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
    if (s->t.bitmap && !s->has_status) {
        /* the x-dirty-bitmap context is not offered: QEMU 7.2's words
         * (its message "requested x-dirty-bitmap ... not found" is lost) */
        bi_error_set(a->err, EINVAL, "Could not open image");
        return -EINVAL;
    }
    if (a->read_write && bi_nbd.nbd_is_read_only(h) > 0) {
        bi_error_set(a->err, EACCES, "Could not open image");
        return -EACCES;
    }
    if (bi_nbd.nbd_can_multi_conn(h) > 0) {
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
            (void)bi_nbd.nbd_aio_disconnect(c->h, 0);
        } else if (c->h && bi_nbd.nbd_aio_is_negotiating(c->h)) {
            (void)bi_nbd.nbd_aio_opt_abort(c->h); /* the export was refused */
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
    free(s->cache.runs);
    s->cache.runs = NULL;
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

    out->filesystem = s->t.is_unix ? "nbd (unix)" : "nbd (inet)";
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
    .runtime_opts = bi_nbd_runtime_opts,
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
