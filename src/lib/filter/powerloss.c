/* SPDX-License-Identifier: MIT */
/*
 * The "powerloss" filter: a protocol-level node over a file that loses
 * power on purpose, for crash trials (the model of SQLite's test6 and of
 * CrashMonkey, in userspace).
 *
 *   powerloss:SEED:WRITES:FILE
 *
 * opens FILE through its own protocol driver and passes every request
 * on. It remembers each write, zero write and discard since the last
 * completed flush, with the bytes they replaced. The WRITES-th of them
 * (counted from open) is the one during which the power fails: it reaches
 * the file, then every remembered write is kept whole, dropped, or torn
 * (some of its 512-byte sectors kept), chosen by a generator seeded with
 * SEED, as a disk with a volatile cache may leave them in any order.
 * Each sector of the file ends up holding what the last kept write put
 * there, or else what it held at the last completed flush. From then on
 * every request fails with EIO (the disk is gone), so the program above
 * fails as it would after the crash; the file is then what the machine
 * would find after rebooting. Writes with FUA are always kept. WRITES 0
 * never loses power (it only counts).
 *
 * A flush completes only when the file's own flush has: only then are the
 * writes before it durable and forgotten.
 */
#include "block/block.h"
#include "util/util.h"
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PL_SECTOR 512u
/* What the filter keeps in memory between two flushes: a trial that
 * writes more without flushing fails its writes with ENOMEM. */
#define PL_MAX_LOG_BYTES (512ULL << 20)

struct pl_write {
    uint64_t off, len; /* multiples of PL_SECTOR */
    uint8_t *pre;      /* the bytes before the write */
    uint8_t *data;     /* the bytes written; NULL: zeroes (discard too) */
    bool fua;
};

struct pl_state {
    uint64_t rng;   /* splitmix64 state */
    uint64_t after; /* the write during which power fails; 0: never */
    uint64_t count; /* writes seen */
    bool dead;
    struct pl_write *log;
    size_t n, cap;
    uint64_t bytes; /* held by the log (pre-images and data) */
};

static const char *const pl_prefixes[] = {"powerloss", NULL};

static uint64_t pl_next(struct pl_state *s)
{
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* "powerloss:SEED:WRITES:FILE" -> seed=, writes=, image= (FILE may hold
 * any character; ",," escapes a comma in an option list). */
static int pl_parse_filename(const char *filename, struct bi_optlist *opts,
                             bi_error *err)
{
    const char *p = filename + strlen("powerloss:");
    const char *c1 = strchr(p, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2 || c1 == p || c2 == c1 + 1 || !c2[1]) {
        bi_error_set(err, 0,
                     "powerloss: expected powerloss:SEED:WRITES:FILE, "
                     "got '%s'",
                     filename);
        return -EINVAL;
    }
    size_t flen = strlen(c2 + 1);
    char *esc = malloc(2 * flen + 1), *q = esc;
    if (!esc)
        return -ENOMEM;
    for (const char *f = c2 + 1; *f; f++) {
        *q++ = *f;
        if (*f == ',')
            *q++ = ',';
    }
    *q = 0;
    char *kv = bi_xasprintf("seed=%.*s,writes=%.*s,image=%s", (int)(c1 - p), p,
                            (int)(c2 - c1 - 1), c1 + 1, esc);
    int ret = bi_optlist_parse(opts, kv);
    free(kv);
    free(esc);
    if (ret < 0)
        bi_error_set(err, 0, "powerloss: invalid name '%s'", filename);
    return ret;
}

/* The value of "key=value" among the open options (values unescaped). */
static const char *pl_opt(const struct bi_open_opts *o, const char *key)
{
    size_t kl = strlen(key);
    const char *v = NULL;
    for (const char *const *p = o->protocol_opts; p && *p; p++)
        if (!strncmp(*p, key, kl) && (*p)[kl] == '=')
            v = *p + kl + 1;
    return v;
}

static int pl_number(const struct bi_open_opts *o, const char *key,
                     uint64_t *out, bi_error *err)
{
    const char *v = pl_opt(o, key);
    char *end;
    if (!v || !*v) {
        bi_error_set(err, 0, "powerloss: option '%s' is missing", key);
        return -EINVAL;
    }
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-') {
        bi_error_set(err, 0, "powerloss: '%s' is not a number for '%s'", v,
                     key);
        return -EINVAL;
    }
    *out = x;
    return 0;
}

static int pl_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct pl_state *s = n->opaque;
    uint64_t seed = 0;
    int ret = pl_number(o, "seed", &seed, err);
    if (ret == 0)
        ret = pl_number(o, "writes", &s->after, err);
    const char *image = pl_opt(o, "image");
    if (ret == 0 && (!image || !*image)) {
        bi_error_set(err, 0, "powerloss: option 'image' is missing");
        ret = -EINVAL;
    }
    if (ret < 0)
        return ret;
    struct bi_open_opts co = *o;
    co.protocol_opts = NULL;
    n->file = bi_open_protocol(image, &co, err);
    if (!n->file)
        return -EIO;
    n->file->parent = n;
    s->rng = seed;
    n->size = n->file->size;
    n->read_only = n->file->read_only;
    return 0;
}

static void pl_forget(struct pl_state *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->log[i].pre);
        free(s->log[i].data);
    }
    s->n = 0;
    s->bytes = 0;
}

static void pl_close(bi_node *n)
{
    struct pl_state *s = n->opaque;
    pl_forget(s);
    free(s->log);
    s->log = NULL;
}

static void pl_refresh_limits(bi_node *n)
{
    n->limits = n->file->limits;
    /* whole sectors, so that a torn write tears at sector boundaries */
    if (n->limits.request_alignment < PL_SECTOR) {
        n->limits.request_alignment = PL_SECTOR;
        n->limits.request_alignment_source = BI_SRC_CHILD;
    }
}

/* The bytes that sector k of write w leaves on the disk. */
static const uint8_t *pl_bytes(const struct pl_write *w, const uint8_t *src,
                               uint64_t k)
{
    static const uint8_t zero[PL_SECTOR];
    return src ? src + k * PL_SECTOR : zero;
}

/* Which sectors of each remembered write survive, and what every sector
 * they touched holds afterwards; written to the file and flushed. */
static int pl_lose_power(bi_node *n)
{
    struct pl_state *s = n->opaque;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < s->n; i++) {
        lo = BI_MIN(lo, s->log[i].off);
        hi = BI_MAX(hi, s->log[i].off + s->log[i].len);
    }
    s->dead = true;
    if (!s->n)
        return 0;
    uint64_t nsec = (hi - lo) / PL_SECTOR;
    uint8_t *decided = calloc(nsec / 8 + 1, 1);
    uint8_t *buf = bi_blockalign(n->file, PL_SECTOR);
    if (!decided || !buf) {
        free(decided);
        bi_free_aligned(buf);
        return -ENOMEM;
    }
    int ret = 0;
    /* newest first: the last kept write of a sector decides it */
    for (size_t i = s->n; i-- > 0 && ret == 0;) {
        struct pl_write *w = &s->log[i];
        unsigned fate = w->fua ? 1 : (unsigned)(pl_next(s) % 4);
        for (uint64_t k = 0; k < w->len / PL_SECTOR && ret == 0; k++) {
            uint64_t sec = (w->off - lo) / PL_SECTOR + k;
            bool kept =
                fate == 1 || fate == 3 || (fate == 2 && (pl_next(s) & 1));
            if (!kept || (decided[sec / 8] & (1u << (sec % 8))))
                continue;
            decided[sec / 8] |= (uint8_t)(1u << (sec % 8));
            memcpy(buf, pl_bytes(w, w->data, k), PL_SECTOR);
            ret = bi_co_pwrite(n->file, w->off + k * PL_SECTOR, buf, PL_SECTOR,
                               0);
        }
    }
    /* the rest: as at the last flush (the oldest write's pre-image) */
    for (size_t i = 0; i < s->n && ret == 0; i++) {
        struct pl_write *w = &s->log[i];
        for (uint64_t k = 0; k < w->len / PL_SECTOR && ret == 0; k++) {
            uint64_t sec = (w->off - lo) / PL_SECTOR + k;
            if (decided[sec / 8] & (1u << (sec % 8)))
                continue;
            decided[sec / 8] |= (uint8_t)(1u << (sec % 8));
            memcpy(buf, w->pre + k * PL_SECTOR, PL_SECTOR);
            ret = bi_co_pwrite(n->file, w->off + k * PL_SECTOR, buf, PL_SECTOR,
                               0);
        }
    }
    if (ret == 0)
        ret = bi_co_flush(n->file);
    free(decided);
    bi_free_aligned(buf);
    pl_forget(s);
    return ret;
}

/* Remembers a write of [off, off + len) about to happen: the bytes there
 * now, and (data non-NULL) the bytes it writes. */
static int pl_remember(bi_node *n, uint64_t off, uint64_t len,
                       const struct iovec *iov, int iovcnt, bool fua)
{
    struct pl_state *s = n->opaque;
    assert(off % PL_SECTOR == 0 && len % PL_SECTOR == 0);
    if (s->bytes + 2 * len > PL_MAX_LOG_BYTES)
        return -ENOMEM;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct pl_write *l = realloc(s->log, cap * sizeof(*l));
        if (!l)
            return -ENOMEM;
        s->log = l;
        s->cap = cap;
    }
    struct pl_write w = {.off = off, .len = len, .fua = fua};
    w.pre = malloc(len);
    w.data = iov ? malloc(len) : NULL;
    if (!w.pre || (iov && !w.data)) {
        free(w.pre);
        free(w.data);
        return -ENOMEM;
    }
    int ret = bi_co_pread(n->file, off, w.pre, len);
    if (ret < 0) {
        free(w.pre);
        free(w.data);
        return ret;
    }
    if (iov)
        bi_iov_to_buf(iov, iovcnt, 0, w.data, len);
    s->log[s->n++] = w;
    s->bytes += len + (iov ? len : 0);
    return 0;
}

/* After a write reached the file: power fails if it was the chosen one. */
static int pl_after_write(bi_node *n, int ret)
{
    struct pl_state *s = n->opaque;
    if (s->after && s->count == s->after) {
        pl_lose_power(n);
        return -EIO;
    }
    return ret;
}

static int pl_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                        const struct iovec *iov, int iovcnt)
{
    struct pl_state *s = n->opaque;
    if (s->dead)
        return -EIO;
    return bi_co_preadv(n->file, off, len, iov, iovcnt);
}

static int pl_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                         const struct iovec *iov, int iovcnt, int flags)
{
    struct pl_state *s = n->opaque;
    if (s->dead)
        return -EIO;
    s->count++;
    int ret = pl_remember(n, off, len, iov, iovcnt, flags & BI_REQ_FUA);
    if (ret == 0)
        ret = bi_co_pwritev(n->file, off, len, iov, iovcnt, flags);
    return pl_after_write(n, ret);
}

static int pl_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                               int flags)
{
    struct pl_state *s = n->opaque;
    if (s->dead)
        return -EIO;
    s->count++;
    int ret = pl_remember(n, off, len, NULL, 0, flags & BI_REQ_FUA);
    if (ret == 0)
        ret = bi_co_pwrite_zeroes(n->file, off, len, flags);
    return pl_after_write(n, ret);
}

static int pl_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    struct pl_state *s = n->opaque;
    if (s->dead)
        return -EIO;
    s->count++;
    int ret = pl_remember(n, off, len, NULL, 0, false);
    if (ret == 0)
        ret = bi_co_pdiscard(n->file, off, len);
    return pl_after_write(n, ret);
}

/* Durable only once the file's own flush is: then the log is forgotten.
 * (The generic layer flushes the file again after this; that costs one
 * more fdatasync in a test filter.) */
static int pl_co_flush(bi_node *n)
{
    struct pl_state *s = n->opaque;
    if (s->dead)
        return -EIO;
    int ret = bi_co_flush(n->file);
    if (ret == 0)
        pl_forget(s);
    return ret;
}

static int pl_co_truncate(bi_node *n, uint64_t size, bool exact,
                          enum bi_prealloc prealloc, bi_error *err)
{
    struct pl_state *s = n->opaque;
    if (s->dead) {
        bi_error_set(err, EIO, "powerloss: the power is off");
        return -EIO;
    }
    int ret =
        n->file->drv->co_truncate
            ? n->file->drv->co_truncate(n->file, size, exact, prealloc, err)
            : -ENOTSUP;
    if (ret == 0)
        n->size = n->file->size;
    return ret;
}

static int pl_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                              struct bi_status *st)
{
    struct pl_state *s = n->opaque;
    if (s->dead)
        return -EIO;
    return bi_co_block_status(n->file, off, len, st);
}

static int pl_set_perm(bi_node *n, unsigned perm, unsigned shared,
                       bi_error *err)
{
    return bi_node_set_perm(n->file, perm, shared, err);
}

static int64_t pl_allocated_size(bi_node *n)
{
    const struct bi_driver *d = n->file->drv;
    return d->get_allocated_file_size ? d->get_allocated_file_size(n->file)
                                      : -ENOTSUP;
}

const struct bi_driver bi_drv_powerloss = {
    .name = "powerloss",
    .is_protocol = true,
    .state_size = sizeof(struct pl_state),
    .prefixes = pl_prefixes,
    .parse_filename = pl_parse_filename,
    .open = pl_open,
    .close = pl_close,
    .refresh_limits = pl_refresh_limits,
    .co_preadv = pl_co_preadv,
    .co_pwritev = pl_co_pwritev,
    .co_pwrite_zeroes = pl_co_pwrite_zeroes,
    .co_pdiscard = pl_co_pdiscard,
    .co_flush = pl_co_flush,
    .co_truncate = pl_co_truncate,
    .co_block_status = pl_co_block_status,
    .get_allocated_file_size = pl_allocated_size,
    .set_perm = pl_set_perm,
};
