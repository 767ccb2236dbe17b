/* SPDX-License-Identifier: MIT */
/*
 * The "rbd" protocol driver: a Ceph RBD image through librbd, in the block
 * layer's event loop. Reads, writes, zeroes, discards and flushes go out
 * with librbd's asynchronous calls, many in flight; their completions run
 * on librbd's threads, which queue them and write an eventfd that the loop
 * watches (a bi_fd_watch), and the loop wakes the waiting coroutines. The
 * calls librbd only has blocking (connect, open, resize, diff-iterate,
 * close) run on worker threads while the caller's coroutine yields.
 * Block status comes from rbd_diff_iterate2 at whole-object granularity
 * where fast-diff is valid (QEMU 7.2), otherwise everything is data.
 */
#include "protocol/rbd/rbd.h"
#include "blkimg/image_ops.h"
#include "io/aio.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Block status asks librbd about this much at a time and caches it. */
#define STATUS_WINDOW (4ull << 30)
/* QEMU's snapshot id field: an RBD snapshot's name is its id. */
#define RBD_SNAP_ID_MAX 128

/* One asynchronous librbd call, waited for by its coroutine. */
struct rbd_req {
    struct rbd_state *s;
    bi_co *co;
    rbd_completion_t comp;
    int64_t ret;
    bool done;
    struct rbd_req *next; /* on s->done_list */
};

/* The allocated runs of one diff-iterate, sorted and merged. */
struct rbd_runs {
    uint64_t start, end; /* the range they describe */
    struct rbd_run {
        uint64_t off, len;
    } * v;
    size_t n, cap, hint;
};

struct rbd_state {
    struct rbd_target t;
    rados_t cluster;
    rados_ioctx_t io;
    rbd_image_t image;
    uint64_t size, obj_size;
    bool fast_diff; /* block status from diff-iterate */
    /* completions: pushed by librbd's threads, taken by the loop */
    int efd;
    bool opened; /* efd, lock and watch are set up */
    struct bi_fd_watch watch;
    pthread_mutex_t lock;
    struct rbd_req *done_list;
    int in_flight;
    bi_co_mutex resize_lock;
    struct rbd_runs cache;
    uint64_t cache_gen; /* changed by every write, zero and discard */
    int writes;         /* of those, in flight */
};

#define state_of(w)                                                            \
    ((struct rbd_state *)((char *)(w)-offsetof(struct rbd_state, watch)))

/* ---------------------------------------------------------- completions */

/* On a librbd thread: keeps the result, queues r, wakes the loop. */
static void req_complete(rbd_completion_t c, void *arg)
{
    struct rbd_req *r = arg;
    struct rbd_state *s = r->s;
    uint64_t one = 1;

    r->ret = bi_rbd.rbd_aio_get_return_value(c);
    bi_rbd.rbd_aio_release(c);
    pthread_mutex_lock(&s->lock);
    r->next = s->done_list;
    s->done_list = r;
    pthread_mutex_unlock(&s->lock);
    /* the counter only grows: a failed write means it is already set */
    (void)!write(s->efd, &one, sizeof(one));
}

static void watch_update(struct rbd_state *s)
{
    if (s->in_flight > 0) {
        bi_fd_watch_arm(&s->watch, s->efd, true, false);
    }
}

/* In the loop: hands the queued completions to their coroutines. */
static void efd_event(struct bi_fd_watch *w, unsigned revents)
{
    struct rbd_state *s = state_of(w);
    struct rbd_req *r;
    uint64_t v;

    (void)revents;
    (void)!read(s->efd, &v, sizeof(v));
    pthread_mutex_lock(&s->lock);
    r = s->done_list;
    s->done_list = NULL;
    pthread_mutex_unlock(&s->lock);
    while (r) {
        struct rbd_req *next = r->next;
        r->done = true;
        s->in_flight--;
        bi_co_wake(r->co);
        r = next;
    }
    watch_update(s);
}

enum rbd_op { OP_READ, OP_WRITE, OP_ZERO, OP_DISCARD, OP_FLUSH };

/* Issues one call and waits for it (in a coroutine). Returns librbd's
 * result: bytes moved or 0, or -errno. */
static int64_t rbd_call(struct rbd_state *s, enum rbd_op op, uint64_t off,
                        uint64_t len, const struct iovec *iov, int iovcnt,
                        int zero_flags)
{
    struct rbd_req r = {.s = s, .co = bi_co_self()};
    int ret = bi_rbd.rbd_aio_create_completion(&r, req_complete, &r.comp);

    assert(r.co);
    if (ret < 0) {
        return ret;
    }
    switch (op) {
    case OP_READ:
        ret = bi_rbd.rbd_aio_readv(s->image, iov, iovcnt, off, r.comp);
        break;
    case OP_WRITE:
        ret = bi_rbd.rbd_aio_writev(s->image, iov, iovcnt, off, r.comp);
        break;
    case OP_ZERO:
        ret = bi_rbd.rbd_aio_write_zeroes(s->image, off, len, r.comp,
                                          zero_flags, 0);
        break;
    case OP_DISCARD:
        ret = bi_rbd.rbd_aio_discard(s->image, off, len, r.comp);
        break;
    case OP_FLUSH:
        ret = bi_rbd.rbd_aio_flush(s->image, r.comp);
        break;
    }
    if (ret < 0) {
        bi_rbd.rbd_aio_release(r.comp); /* not issued: no callback comes */
        return ret;
    }
    s->in_flight++;
    watch_update(s);
    while (!r.done) {
        bi_co_yield();
    }
    return r.ret;
}

/* Runs fn(arg) on a worker thread (the caller's coroutine yields). */
static int in_thread(int (*fn)(void *), void *arg)
{
    void *args[1] = {arg};
    return bi_run_in_threads(fn, args, 1);
}

/* ------------------------------------------------------------ read/write */

/* A write, zero or discard starts or ends: cached block status is stale. */
static void change(struct rbd_state *s, int delta)
{
    s->writes += delta;
    s->cache.start = s->cache.end = 0;
    s->cache_gen++;
}

struct resize_args {
    struct rbd_state *s;
    uint64_t size;
};

static int resize_fn(void *p)
{
    struct resize_args *a = p;
    return bi_rbd.rbd_resize(a->s->image, a->size);
}

/* Grows or shrinks the image to size (one resize at a time). */
static int rbd_resize_to(struct rbd_state *s, uint64_t size, bool grow_only)
{
    struct resize_args a = {s, size};
    int ret = 0;

    bi_co_mutex_lock(&s->resize_lock);
    if (!grow_only || size > s->size) {
        ret = in_thread(resize_fn, &a);
        if (ret == 0) {
            s->size = size;
        }
    }
    bi_co_mutex_unlock(&s->resize_lock);
    return ret;
}

/* The first entries of iov covering len bytes, the last one cut
 * (copied into out, which has iovcnt entries). Returns their count. */
static int iov_cut(const struct iovec *iov, int iovcnt, uint64_t len,
                   struct iovec *out)
{
    int k = 0;

    for (int i = 0; i < iovcnt && len; i++, k++) {
        out[k] = iov[i];
        if (out[k].iov_len > len) {
            out[k].iov_len = len;
        }
        len -= out[k].iov_len;
    }
    return k;
}

/* Zero-fills [from, len) of the buffers of iov. */
static void iov_zero_from(const struct iovec *iov, int iovcnt, uint64_t from,
                          uint64_t len)
{
    uint64_t pos = 0;

    for (int i = 0; i < iovcnt && pos < len; i++) {
        uint64_t l = BI_MIN((uint64_t)iov[i].iov_len, len - pos);
        if (pos + l > from) {
            uint64_t skip = from > pos ? from - pos : 0;
            memset((char *)iov[i].iov_base + skip, 0, l - skip);
        }
        pos += l;
    }
}

/* Reads past the end of the image are zeroes. */
static int rbd_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                         const struct iovec *iov, int iovcnt)
{
    struct rbd_state *s = n->opaque;
    uint64_t in = off < s->size ? BI_MIN(len, s->size - off) : 0;
    int64_t ret = 0;

    if (in < len) {
        iov_zero_from(iov, iovcnt, in, len);
    }
    if (in) {
        struct iovec stack[16];
        struct iovec *cut =
            iovcnt <= 16 ? stack : bi_xmalloc(sizeof(*cut) * (size_t)iovcnt);
        int k = iov_cut(iov, iovcnt, in, cut);
        ret = rbd_call(s, OP_READ, off, in, cut, k, 0);
        if (cut != stack) {
            free(cut);
        }
    }
    if (ret >= 0) {
        bi_stats_io(n, len, 0);
    }
    return ret < 0 ? (int)ret : 0;
}

static int rbd_co_flush(bi_node *n);

/* A write past the end grows the image first (as QEMU does: a format on
 * RBD grows its file by writing). */
static int rbd_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                          const struct iovec *iov, int iovcnt, int flags)
{
    struct rbd_state *s = n->opaque;
    int64_t ret = 0;

    if (off + len > s->size) {
        ret = rbd_resize_to(s, off + len, true);
        n->size = s->size;
    }
    change(s, 1);
    if (ret == 0) {
        ret = rbd_call(s, OP_WRITE, off, len, iov, iovcnt, 0);
    }
    change(s, -1);
    if (ret >= 0 && (flags & BI_REQ_FUA)) {
        ret = rbd_co_flush(n);
    }
    if (ret >= 0) {
        bi_stats_io(n, 0, len);
    }
    return ret < 0 ? (int)ret : 0;
}

/* A call on a range that carries no data, within the image. */
static int rbd_ranged(struct rbd_state *s, enum rbd_op op, uint64_t off,
                      uint64_t len, int zero_flags)
{
    int64_t ret;

    if (off >= s->size) {
        return 0;
    }
    change(s, 1);
    ret = rbd_call(s, op, off, BI_MIN(len, s->size - off), NULL, 0, zero_flags);
    change(s, -1);
    return ret < 0 ? (int)ret : 0;
}

/* Without MAY_UNMAP the zeroes are written out (thick provisioning), as
 * QEMU asks; a zeroing that must be fast is not promised. */
static int rbd_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                                int flags)
{
    struct rbd_state *s = n->opaque;
    int ret;

    if (flags & BI_REQ_NO_FALLBACK) {
        return -ENOTSUP;
    }
    if (off + len > s->size) {
        return -ENOSPC;
    }
    ret = rbd_ranged(
        s, OP_ZERO, off, len,
        flags & BI_REQ_MAY_UNMAP ? 0 : RBD_WRITE_ZEROES_FLAG_THICK_PROVISION);
    if (ret == 0 && (flags & BI_REQ_FUA)) {
        ret = rbd_co_flush(n);
    }
    return ret == -EOPNOTSUPP ? -ENOTSUP : ret;
}

static int rbd_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    return rbd_ranged(n->opaque, OP_DISCARD, off, len, 0);
}

static int rbd_co_flush(bi_node *n)
{
    struct rbd_state *s = n->opaque;
    int64_t ret;

    if (n->read_only) {
        return 0;
    }
    ret = rbd_call(s, OP_FLUSH, 0, 0, NULL, 0, 0);
    return ret < 0 ? (int)ret : 0;
}

/* --------------------------------------------------------- block status */

struct diff_args {
    struct rbd_state *s;
    struct rbd_runs *runs;
};

/* On the worker thread: an extent librbd reports; allocated ones are
 * kept, adjacent ones merged. */
static int diff_cb(uint64_t off, size_t len, int exists, void *arg)
{
    struct rbd_runs *r = ((struct diff_args *)arg)->runs;

    if (!exists || !len) {
        return 0;
    }
    if (r->n && r->v[r->n - 1].off + r->v[r->n - 1].len == off) {
        r->v[r->n - 1].len += len;
        return 0;
    }
    r->v = bi_xgrow(r->v, &r->cap, r->n, sizeof(*r->v));
    r->v[r->n].off = off;
    r->v[r->n].len = len;
    r->n++;
    return 0;
}

static int diff_fn(void *p)
{
    struct diff_args *a = p;
    struct rbd_runs *r = a->runs;

    return bi_rbd.rbd_diff_iterate2(a->s->image, NULL, r->start,
                                    r->end - r->start, 1, 1, diff_cb, a);
}

/* Asks librbd for the allocated runs from the object holding off, a
 * window at a time, into the cache. 0 or -errno. */
static int status_query(struct rbd_state *s, uint64_t off)
{
    struct rbd_runs *c = &s->cache;
    struct diff_args a = {s, c};
    uint64_t gen = s->cache_gen;
    int ret;

    c->start = off - off % s->obj_size;
    c->end = BI_MIN(s->size, c->start + STATUS_WINDOW);
    c->n = 0;
    c->hint = 0;
    ret = in_thread(diff_fn, &a);
    if (ret < 0) {
        c->start = c->end = 0;
        return ret;
    }
    if (gen != s->cache_gen || s->writes) {
        /* a write ran meanwhile: good for this answer only */
        s->cache_gen++;
    }
    return 0;
}

/* The status of off from the cache (which covers it): the run holding
 * it, or the gap before the next. */
static void cache_lookup(struct rbd_runs *c, uint64_t off, struct bi_status *st)
{
    size_t k = c->hint < c->n && c->v[c->hint].off <= off ? c->hint : 0;

    while (k < c->n && c->v[k].off + c->v[k].len <= off) {
        k++;
    }
    c->hint = k;
    if (k < c->n && c->v[k].off <= off) {
        st->len = BI_MIN(c->v[k].off + c->v[k].len, c->end) - off;
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
    } else {
        st->len = (k < c->n ? BI_MIN(c->v[k].off, c->end) : c->end) - off;
        st->flags = BI_BS_ZERO | BI_BS_OFFSET_VALID;
    }
}

static int rbd_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                               struct bi_status *st)
{
    struct rbd_state *s = n->opaque;
    uint64_t gen = s->cache_gen;

    if (bi_status_protocol_start(n, s->size, off, &len, st)) {
        return 0;
    }
    st->len = len;
    st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
    if (s->fast_diff) {
        if (off < s->cache.start || off >= s->cache.end) {
            gen = s->cache_gen;
            if (status_query(s, off) < 0) {
                goto out; /* QEMU's answer when librbd cannot tell */
            }
        }
        cache_lookup(&s->cache, off, st);
        st->len = BI_MIN(st->len, len);
        if (gen != s->cache_gen) {
            s->cache.start = s->cache.end = 0;
        }
    }
out:
    if (off + st->len >= s->size) {
        st->flags |= BI_BS_EOF;
    }
    return 0;
}

/* ------------------------------------------------------------ open/close */

struct open_args {
    struct rbd_state *s;
    bool read_write, no_cache;
    bi_error *err;
};

/* Whether block status can come from diff-iterate: fast-diff enabled and
 * its object map valid. */
static bool has_fast_diff(rbd_image_t image)
{
    uint64_t features = 0, flags = 0;

    return bi_rbd.rbd_get_features(image, &features) == 0 &&
           (features & RBD_FEATURE_FAST_DIFF) &&
           bi_rbd.rbd_get_flags(image, &flags) == 0 &&
           !(flags & RBD_FLAG_FAST_DIFF_INVALID);
}

/* On a worker thread: connects, opens the image, reads its facts. */
static int open_fn(void *p)
{
    struct open_args *a = p;
    struct rbd_state *s = a->s;
    rbd_image_info_t info;
    int ret = bi_rbd_connect(&s->t, a->no_cache, &s->cluster, &s->io, a->err);

    if (ret < 0) {
        return ret;
    }
    ret = a->read_write
              ? bi_rbd.rbd_open(s->io, s->t.image, &s->image, s->t.snap)
              : bi_rbd.rbd_open_read_only(s->io, s->t.image, &s->image,
                                          s->t.snap);
    if (ret < 0) {
        bi_error_set(a->err, -ret, "error reading header from %s", s->t.image);
        s->image = NULL;
    } else if ((ret = bi_rbd.rbd_stat(s->image, &info, sizeof(info))) < 0) {
        bi_error_set(a->err, -ret, "error getting image info from %s",
                     s->t.image);
    } else {
        s->size = info.size;
        s->obj_size = info.obj_size ? info.obj_size : 1;
        s->fast_diff = has_fast_diff(s->image);
    }
    return ret;
}

static int close_fn(void *p)
{
    struct rbd_state *s = p;

    if (s->image) {
        bi_rbd.rbd_close(s->image);
        s->image = NULL;
    }
    if (s->cluster) {
        bi_rbd.rados_ioctx_destroy(s->io);
        bi_rbd.rados_shutdown(s->cluster);
        s->cluster = NULL;
    }
    return 0;
}

static void rbd_drv_close(bi_node *n)
{
    struct rbd_state *s = n->opaque;

    if (!s || !s->opened) {
        return;
    }
    s->opened = false;
    in_thread(close_fn, s);
    bi_fd_watch_stop(&s->watch);
    close(s->efd);
    s->efd = -1;
    pthread_mutex_destroy(&s->lock);
    bi_rbd_target_free(&s->t);
    free(s->cache.v);
    s->cache.v = NULL;
}

static int rbd_parse_filename(const char *filename, struct bi_optlist *l,
                              bi_error *err)
{
    return bi_rbd_parse_filename(filename, l, err);
}

static int rbd_drv_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct rbd_state *s = n->opaque;
    struct open_args a = {s, o->read_write, bi_cache_is_direct(o->cache), err};
    int ret = bi_rbd_target_parse(o->protocol_opts, &s->t, err);

    if (ret < 0) {
        bi_rbd_target_free(&s->t);
        return ret;
    }
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->efd < 0) {
        ret = -errno;
        bi_error_set(err, errno, "Could not create an eventfd");
        bi_rbd_target_free(&s->t);
        return ret;
    }
    s->opened = true;
    pthread_mutex_init(&s->lock, NULL);
    bi_fd_watch_init(&s->watch, efd_event);
    bi_co_mutex_init(&s->resize_lock);
    ret = in_thread(open_fn, &a);
    /* as QEMU: the snapshot is looked up first, refused for writing then */
    if (ret == 0 && s->t.snap && o->read_write)
        ret = bi_error_setc(err, -EROFS, "rbd snapshots are read-only");
    if (ret < 0) {
        rbd_drv_close(n);
        return ret;
    }
    n->size = s->size;
    free(n->filename);
    n->filename = bi_rbd_target_name(&s->t); /* QEMU shows this name */
    return 0;
}

/* librbd takes any offset, length and buffer. */
static void rbd_refresh_limits(bi_node *n)
{
    bi_limits_any_buffer(&n->limits, 0);
}

/* Resizes as qemu-img asks (growing and shrinking: the data past a new
 * end is gone). */
static int rbd_co_truncate(bi_node *n, uint64_t size, bool exact,
                           enum bi_prealloc prealloc, bi_error *err)
{
    struct rbd_state *s = n->opaque;
    int ret;

    (void)exact;
    if (prealloc != BI_PREALLOC_OFF) {
        bi_error_set(err, 0, "Unsupported preallocation mode '%s'",
                     bi_prealloc_name(prealloc));
        return -ENOTSUP;
    }
    change(s, 0);
    ret = rbd_resize_to(s, size, false);
    if (ret < 0) {
        bi_error_set(err, -ret, "failed to resize rbd image");
        return ret;
    }
    n->size = size;
    return 0;
}

/* qemu-img info's cluster_size: the object size. */
static void rbd_drv_geometry(bi_node *n, struct bi_geometry *g)
{
    g->cluster_size = ((struct rbd_state *)n->opaque)->obj_size;
}

/* QEMU answers bdrv_get_info for RBD (info shows the dirty flag), and its
 * format-specific information (shown when rbd is the image's driver) is
 * empty for an image without encryption. */
static int rbd_drv_get_info(bi_node *n, struct bi_image_info *info,
                            bi_error *err)
{
    (void)n;
    (void)err;
    info->specific = bi_value_object();
    return 0;
}

static int rbd_storage_info(bi_node *n, struct bi_storage_info *out)
{
    (void)n;
    out->filesystem = "rbd";
    return 0;
}

/* ----------------------------------------------------------------- create */

/* The object order -o cluster_size asks for (0: the cluster's default),
 * checked as QEMU checks it. 0 or -EINVAL with err set. */
static int create_order(const struct bi_create_opts *o, int *order,
                        bi_error *err)
{
    uint64_t v = 0;

    *order = 0;
    for (const char *const *p = o->options; p && *p; p++) {
        if (!strncmp(*p, "cluster_size=", 13) &&
            bi_parse_size(*p + 13, &v) < 0) {
            bi_error_set(err, 0, "Parameter 'cluster_size' expects a size");
            return -EINVAL;
        }
    }
    if (!v) {
        return 0;
    }
    if (v & (v - 1)) {
        bi_error_set(err, 0, "obj size needs to be power of 2");
        return -EINVAL;
    }
    if (v < 4096) {
        bi_error_set(err, 0, "obj size too small");
        return -EINVAL;
    }
    *order = __builtin_ctzll(v); /* librbd refuses orders above 25 */
    return 0;
}

/* Creates the image a name says, with the size, the object size asked
 * for (else the cluster's) and the cluster's default features. */
static int rbd_drv_create(const char *filename, const struct bi_create_opts *o,
                          bi_error *err)
{
    struct bi_optlist l = {0};
    struct rbd_target t = {0};
    char **keys = NULL;
    rados_t cluster;
    rados_ioctx_t io;
    int ret = bi_rbd_parse_filename(filename, &l, err);

    if (ret == 0) {
        keys = bi_xzalloc(sizeof(char *) * (size_t)(l.n + 1));
        for (int i = 0; i < l.n; i++) {
            keys[i] = bi_xasprintf("%s=%s", l.v[i].key, l.v[i].value);
        }
        ret = bi_rbd_target_parse((const char *const *)keys, &t, err);
    }
    if (ret == 0 && t.snap) {
        bi_error_set(err, 0, "Can't use snapshot name for image creation");
        ret = -EINVAL;
    }
    if (ret == 0 && o->prealloc != BI_PREALLOC_OFF) {
        /* QEMU's rbd takes no preallocation option at all */
        bi_error_set(err, 0, "Invalid parameter 'preallocation'");
        ret = -EINVAL;
    }
    int order = 0;
    if (ret == 0) {
        ret = create_order(o, &order, err);
    }
    if (ret == 0 &&
        (ret = bi_rbd_connect(&t, false, &cluster, &io, err)) == 0) {
        ret = bi_rbd.rbd_create(io, t.image, o->size, &order);
        if (ret < 0) {
            bi_error_set(err, -ret, "error rbd create");
        }
        bi_rbd.rados_ioctx_destroy(io);
        bi_rbd.rados_shutdown(cluster);
    }
    for (int i = 0; keys && i < l.n; i++) {
        free(keys[i]);
    }
    free(keys);
    bi_optlist_free(&l);
    bi_rbd_target_free(&t);
    return ret;
}

/* ------------------------------------------------------------- snapshots */

/* The image's snapshots as QEMU lists them: the name as id and tag, the
 * image size at the snapshot as VM size, no dates. */
static int rbd_snap_list_all(bi_node *n, struct bi_snapshot_info ***out,
                             int *count)
{
    struct rbd_state *s = n->opaque;
    rbd_snap_info_t *snaps = NULL;
    int max = 16, ret;

    *out = NULL;
    *count = 0;
    do {
        free(snaps);
        snaps = bi_xmalloc(sizeof(*snaps) * (size_t)max);
        ret = bi_rbd.rbd_snap_list(s->image, snaps, &max);
    } while (ret == -ERANGE);
    if (ret <= 0) {
        free(snaps);
        return ret;
    }
    *out = bi_xzalloc(sizeof(**out) * (size_t)ret);
    for (int i = 0; i < ret; i++) {
        struct bi_snapshot_info *sn = bi_xzalloc(sizeof(*sn));
        sn->id = bi_xstrdup(snaps[i].name);
        sn->name = bi_xstrdup(snaps[i].name);
        sn->vm_state_size = snaps[i].size;
        (*out)[i] = sn;
    }
    *count = ret;
    bi_rbd.rbd_snap_list_end(snaps);
    free(snaps);
    return 0;
}

/* Snapshots are named, and the name is the id: QEMU takes a name that is
 * not empty and fits an id (under 128 bytes). */
static int rbd_snap_create_co(bi_node *n, const char *name, bi_error *err)
{
    struct rbd_state *s = n->opaque;
    int r;

    if (!name[0]) {
        r = -EINVAL;
    } else if (strlen(name) >= RBD_SNAP_ID_MAX) {
        r = -ERANGE;
    } else {
        r = bi_rbd.rbd_snap_create(s->image, name);
        if (r < 0)
            bi_message(BI_MESSAGE_ERROR, "failed to create snap: %s",
                       strerror(-r));
    }
    if (r < 0)
        return bi_error_setc(err, r, "Could not create snapshot '%s': %d (%s)",
                             name, r, strerror(-r));
    return 0;
}

/* Rolls the image back to the snapshot name (librbd finds it or says
 * -ENOENT). */
static int rbd_snap_apply_co(bi_node *n, const char *name, bi_error *err)
{
    struct rbd_state *s = n->opaque;
    uint64_t size;
    int r = bi_rbd.rbd_snap_rollback(s->image, name);

    if (r < 0)
        return bi_error_setc(err, r,
                             "Could not apply snapshot '%s': Failed to load "
                             "snapshot: %s",
                             name, strerror(-r));
    /* the snapshot may have another size than the image had */
    if (bi_rbd.rbd_get_size(s->image, &size) == 0)
        n->size = size;
    return 0;
}

/* Whether the image has a snapshot of that id or name (one and the same
 * on RBD). */
static bool rbd_snap_known(bi_node *n, const char *name)
{
    struct bi_snapshot_info **v;
    int count;
    bool found = false;

    if (rbd_snap_list_all(n, &v, &count) < 0)
        return false;
    for (int i = 0; i < count; i++)
        found = found || !strcmp(v[i]->name, name);
    bi_snapshot_list_free(v, count);
    return found;
}

static int rbd_snap_delete_co(bi_node *n, const char *name, bi_error *err)
{
    struct rbd_state *s = n->opaque;

    if (!rbd_snap_known(n, name))
        return bi_error_setc(err, -ENOENT,
                             "Could not delete snapshot '%s': snapshot not "
                             "found",
                             name);
    int r = bi_rbd.rbd_snap_remove(s->image, name);
    if (r < 0)
        return bi_error_setc(err, r,
                             "Could not delete snapshot '%s': Failed to "
                             "remove the snapshot: %s",
                             name, strerror(-r));
    return 0;
}

static const struct bi_snapshot_ops rbd_snapshot_ops = {
    .co_create = rbd_snap_create_co,
    .co_apply = rbd_snap_apply_co,
    .co_delete = rbd_snap_delete_co,
    .list = rbd_snap_list_all,
};

/* QEMU's creation options of rbd, in its order (encryption aside). */
static const struct bi_opt_desc rbd_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"cluster_size", BI_OPT_SIZE, "RBD object size", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

static const char *const rbd_prefixes[] = {"rbd", NULL};

const struct bi_driver bi_drv_rbd = {
    .name = "rbd",
    .is_protocol = true,
    .state_size = sizeof(struct rbd_state),
    .prefixes = rbd_prefixes,
    .runtime_opts = bi_rbd_runtime_opts,
    .parse_filename = rbd_parse_filename,
    .open = rbd_drv_open,
    .close = rbd_drv_close,
    .create = rbd_drv_create,
    .create_opts = rbd_create_opts,
    .refresh_limits = rbd_refresh_limits,
    .co_preadv = rbd_co_preadv,
    .co_pwritev = rbd_co_pwritev,
    .co_pwrite_zeroes = rbd_co_pwrite_zeroes,
    .co_pdiscard = rbd_co_pdiscard,
    .co_flush = rbd_co_flush,
    .co_truncate = rbd_co_truncate,
    .co_block_status = rbd_co_block_status,
    .get_geometry = rbd_drv_geometry,
    .get_info = rbd_drv_get_info,
    .storage_info = rbd_storage_info,
    .snapshot = &rbd_snapshot_ops,
};
