/* SPDX-License-Identifier: MIT */
/*
 * The copy engine behind convert.
 *
 * N worker coroutines share one cursor over the concatenated sources. Under
 * a coroutine mutex a worker takes the next chunk: one run of one kind
 * (data, zero, left to the backing file) as block status reports it, cut
 * to the buffer size and to cluster boundaries. Data chunks are read into
 * the worker's own aligned buffer and written from that same buffer (no
 * copy); zero chunks are skipped when the target reads as zero, else
 * written as efficient zero writes. Within data, runs of zeroes of at
 * least min_sparse bytes are not written (sparse output).
 *
 * Writes go out in order unless out_of_order is set (or the target is raw,
 * where the order of writes cannot change the layout): a worker then waits
 * for the chunks before its own to be written.
 */
#include "blkimg/convert.h"
#include "block/block.h"
#include "io/aio.h"
#include "util/coroutine.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SECTOR 512ULL
#define DEFAULT_BUF (2ULL * 1024 * 1024)
#define MAX_BUF (16ULL * 1024 * 1024)
#define MAX_COROUTINES 16
#define COMPRESS_CHUNK (1ULL << 20) /* bytes a -c chunk holds at most */

/* CK_DISCARD and CK_DIFF: commit and rebase only (see bi_copy_mode). */
enum chunk_kind { CK_DATA, CK_ZERO, CK_BACKING, CK_DISCARD, CK_DIFF };

enum err_kind {
    EK_NONE,
    EK_STATUS,
    EK_READ,
    EK_WRITE,
    EK_READ_OLD,
    EK_READ_NEW
};

struct cv_cursor {
    uint64_t pos;         /* next offset to hand out */
    uint64_t status_end;  /* end of the cached status run */
    enum chunk_kind kind; /* kind of the cached run */
    bool host_valid;      /* cached run has a host mapping */
    bool pure;            /* data run with no part reading as zero */
    bi_node *host_file;
    uint64_t host_start; /* host offset of the run's start */
    uint64_t run_start;
    uint64_t dirty_end; /* commit: end of the current dirty run */
    bool old_zero;      /* rebase: the chunk lies past the old backing */
};

struct pend {
    uint64_t off, len;
    bool counted;
    struct pend *next;
};

struct cv_state {
    const struct bi_convert_opts *o;
    bi_node *const *src;
    int n_src;
    uint64_t *src_start; /* n_src + 1 entries */
    uint64_t *src_align;
    uint64_t total;
    bi_node *dst;

    bool has_zero_init;
    uint64_t min_sparse; /* bytes */
    uint64_t align;      /* zero detection alignment, bytes */
    uint64_t cluster;    /* target cluster size (0 = none) */
    /* clusters go compressed: -c, or a target that takes no other
     * writes (bi_geometry.compressed_writes_only, QEMU's
     * needs_compressed_writes) */
    bool compress;
    uint64_t buf_size;
    bool in_order;

    struct cv_cursor cur;
    bi_co_mutex lock;

    uint64_t wr_next;
    bi_co_queue wr_wait;

    int ret;
    enum err_kind ekind;
    uint64_t eoff;

    uint64_t done, alloc_total;
    uint64_t frontier; /* chunks below are done (progress order) */
    struct pend *pend; /* done chunks above the frontier, sorted */

    /* -r: qemu's rate limiter (100 ms slices) */
    uint64_t rl_quota;
    uint64_t rl_dispatched;
    uint64_t rl_start, rl_end;

    int running;
    int releases; /* release_co scheduled, not yet run */
    bi_co_queue done_q;
    bool finished;

    void *zero_buf;
    uint64_t mem_align;

    bool copy_range; /* -C: offload through the protocol driver */

    /* commit and rebase */
    uint64_t gran;               /* commit: dirty granularity */
    uint64_t tcluster;           /* commit: target cluster size (0: none) */
    uint64_t old_size, new_size; /* rebase: backing file sizes */
    /* commit and rebase: for each image of src[0]'s chain (0 = src[0]),
     * its geometry's status span (0: none) */
    uint64_t spans[64];
    int n_spans;
};

void bi_convert_opts_init_sized(struct bi_convert_opts *o, size_t size)
{
    memset(o, 0, size);
    if (size < sizeof(*o)) {
        /* a program built with an older header: its fields only */
        struct bi_convert_opts full;
        bi_convert_opts_init(&full);
        bi_struct_out(o, size, &full, sizeof(full));
        o->struct_size = size;
        return;
    }
    o->struct_size = sizeof(*o);
    o->min_sparse = 4096;
    o->num_coroutines = 8;
    o->target_backing_size = -1;
    o->flush = true;
}

static bool cancelled(struct cv_state *s)
{
    return s->o->cancel && *s->o->cancel;
}

static void set_error(struct cv_state *s, int ret, enum err_kind k,
                      uint64_t off)
{
    if (s->ret == 0) {
        s->ret = ret;
        s->ekind = k;
        s->eoff = off;
    }
    /* Wake everyone waiting for their turn: they bail out. */
    bi_co_queue_wake_all(&s->wr_wait);
}

static int src_index(struct cv_state *s, uint64_t pos)
{
    int i = 0;
    while (i + 1 < s->n_src && pos >= s->src_start[i + 1]) {
        i++;
    }
    /* Skip empty sources */
    while (i + 1 < s->n_src && s->src_start[i + 1] == s->src_start[i]) {
        i++;
    }
    return i;
}

/* Refreshes the cursor's status run at c->pos. */
/* Chunk kind of a block status. A data cluster over a hole of the host file
 * reports DATA|ZERO here; qemu-img does not look into the host file of a
 * format node and sees plain data, so it is chunked and counted as data
 * (progress then matches qemu-img's), while its zero part is still never
 * read (see co_read). */
static enum chunk_kind classify(struct cv_state *s, unsigned flags,
                                bool post_backing_zero)
{
    if (flags & BI_BS_DATA) {
        return CK_DATA;
    }
    if (flags & BI_BS_ZERO) {
        return post_backing_zero ? CK_BACKING : CK_ZERO;
    }
    return s->o->target_has_backing ? CK_BACKING : CK_DATA;
}

static bi_node *src_base(struct cv_state *s, bi_node *src)
{
    return s->o->target_has_backing ? bi_node_backing(src) : NULL;
}

/* Refreshes the cursor's status run at c->pos: the longest run of one kind
 * (data runs merged up to twice the buffer size). */
static int cursor_status(struct cv_state *s, struct cv_cursor *c)
{
    int i = src_index(s, c->pos);
    bi_node *src = s->src[i];
    uint64_t soff = c->pos - s->src_start[i];
    uint64_t send = s->src_start[i + 1] - s->src_start[i];
    bi_node *base = src_base(s, src);
    struct bi_status st;
    int ret;

    memset(&st, 0, sizeof(st));
    ret = bi_block_status_above(src, base, soff, send - soff, &st);
    if (ret < 0) {
        return ret;
    }
    if (st.len == 0 || st.len > send - soff) {
        st.len = send - soff;
    }
    uint64_t n = st.len;
    bool post_backing_zero = false;
    uint64_t bsz = UINT64_MAX;
    if (s->o->target_has_backing && s->o->target_backing_size >= 0) {
        bsz = (uint64_t)s->o->target_backing_size;
        if (c->pos >= bsz) {
            post_backing_zero = true;
        } else if (c->pos + n > bsz) {
            n = bsz - c->pos;
        }
    }
    c->kind = classify(s, st.flags, post_backing_zero);
    c->host_valid = (st.flags & BI_BS_OFFSET_VALID) && st.file &&
                    !(st.flags & (BI_BS_COMPRESSED | BI_BS_ZERO)) &&
                    c->kind == CK_DATA;
    c->host_file = st.file;
    c->host_start = st.offset;
    c->pure = c->kind == CK_DATA && !(st.flags & BI_BS_ZERO);
    if (c->kind == CK_DATA) {
        while (soff + n < send && n < 2 * s->buf_size &&
               (bsz == UINT64_MAX || c->pos + n < bsz)) {
            struct bi_status nx;
            memset(&nx, 0, sizeof(nx));
            ret = bi_block_status_above(src, base, soff + n, send - soff - n,
                                        &nx);
            if (ret < 0 || nx.len == 0 ||
                classify(s, nx.flags, false) != CK_DATA) {
                break;
            }
            n += BI_MIN(nx.len, send - soff - n);
            c->host_valid = false;
            if (nx.flags & BI_BS_ZERO) {
                c->pure = false;
            }
            if (c->pos + n > bsz) {
                n = bsz - c->pos;
            }
        }
    }
    /* Keep the next status query aligned to the source's alignment (no
     * needless partial reads). */
    uint64_t a = s->src_align[i];
    if (a > 1 && soff + n < send) {
        uint64_t tail = (soff + n) % a;
        if (n > tail) {
            n -= tail;
        }
    }
    c->run_start = c->pos;
    c->status_end = c->pos + n;
    return 0;
}

/* qemu's convert_iteration_sectors(): the length of the next chunk at
 * c->pos and its kind. */
static int64_t commit_next(struct cv_state *s, struct cv_cursor *c,
                           enum chunk_kind *kind);
static int64_t rebase_next(struct cv_state *s, struct cv_cursor *c,
                           enum chunk_kind *kind);

static int64_t cursor_next(struct cv_state *s, struct cv_cursor *c,
                           enum chunk_kind *kind)
{
    if (s->o->mode == BI_COPY_COMMIT) {
        return commit_next(s, c, kind);
    }
    if (s->o->mode == BI_COPY_REBASE) {
        return rebase_next(s, c, kind);
    }
    if (c->pos >= c->status_end) {
        int ret = cursor_status(s, c);
        if (ret < 0) {
            return ret;
        }
    }
    uint64_t n = c->status_end - c->pos;
    *kind = c->kind;
    if (*kind == CK_DATA || (!s->min_sparse && *kind == CK_ZERO)) {
        n = BI_MIN(n, s->buf_size);
    }
    if (s->compress) {
        if (n < s->cluster) {
            n = BI_MIN(s->cluster, s->total - c->pos);
            *kind = CK_DATA;
        } else {
            n = bi_align_down(n, s->cluster);
        }
    }
    return (int64_t)n;
}

/* ------------------------------------------------- commit and rebase */

#define COMMIT_RUN_MAX (16ULL * 1024 * 1024) /* QEMU mirror's buffer */
#define REBASE_STEP (2ULL * 1024 * 1024)     /* qemu-img's IO_BUF_SIZE */

/* QEMU's block status never reports past the metadata table it looked at
 * (the geometry's status span: qcow2's L2 table), and the layers below only
 * answer for what the layer above left: cuts n at the end of the spans at
 * pos of the images first ..
 * first + depth of the chain. (Commit decides zero writes by these run
 * lengths: the same cuts give the same allocation.) */
static uint64_t span_cut(const struct cv_state *s, int first, int depth,
                         uint64_t pos, uint64_t n)
{
    for (int d = first; d <= first + depth && d < s->n_spans; d++) {
        if (s->spans[d]) {
            n = BI_MIN(n, bi_align_up(pos + 1, s->spans[d]) - pos);
        }
    }
    return n;
}

/* QEMU's bdrv_is_allocated_above(top, base, include_base=false): whether
 * [off, off + *pnum) is allocated in a layer above base. Zeroes a layer
 * reads past the end of its (shorter) backing file count as allocated in
 * that backing file, unless it is base. top is image first of src[0]'s
 * chain. */
static int allocated_above(struct cv_state *s, int first, bi_node *top,
                           bi_node *base, uint64_t off, uint64_t len,
                           bool *alloc, uint64_t *pnum)
{
    struct bi_status st;
    memset(&st, 0, sizeof(st));
    int ret = bi_block_status_above(top, base, off, len, &st);
    if (ret < 0) {
        return ret;
    }
    *pnum = st.len == 0 || st.len > len ? len : st.len;
    *pnum = span_cut(s, first, st.depth, off, *pnum);
    *alloc = (st.flags & BI_BS_ALLOCATED) != 0;
    if (!*alloc && (st.flags & BI_BS_ZERO)) {
        bi_node *cur = top;
        for (int d = 0; d < st.depth && cur; d++) {
            cur = bi_node_backing(cur);
        }
        *alloc = cur && cur->backing && cur->backing != base;
    }
    return 0;
}

/* Sets the cursor's run to [c->pos, c->pos + n) of kind k. */
static int64_t cursor_set(struct cv_cursor *c, uint64_t n, enum chunk_kind k)
{
    c->kind = k;
    c->host_valid = false;
    c->host_file = NULL;
    c->pure = k == CK_DATA;
    c->run_start = c->pos;
    c->status_end = c->pos + n;
    return (int64_t)n;
}

/* Commit, as QEMU's commit job (a mirror of the top into the base): the
 * dirty ranges are what is allocated above the base, in granules; each
 * run of dirty granules (up to the mirror's buffer) is copied in pieces
 * whose kind the top's whole-chain block status decides. */
static int64_t commit_next(struct cv_state *s, struct cv_cursor *c,
                           enum chunk_kind *kind)
{
    bi_node *top = s->src[0];
    uint64_t g = s->gran, pos = c->pos, total = s->total, n;
    bool alloc;
    int ret;

    if (pos >= c->dirty_end) {
        /* QEMU's dirty bitmap: a granule is dirty if anything in it is
         * allocated above the base (no L2 cuts: they change nothing) */
        uint64_t end = pos, p = pos;
        while (end < total && end - pos < COMMIT_RUN_MAX) {
            uint64_t gend = BI_MIN(end + g, total);
            alloc = false;
            for (p = end; p < gend && !alloc; p += alloc ? 0 : n) {
                ret = allocated_above(s, s->n_spans, top, s->dst, p, total - p,
                                      &alloc, &n);
                if (ret < 0) {
                    return ret;
                }
            }
            if (alloc) {
                end = BI_MIN(bi_align_up(p + n, g), total);
                continue;
            }
            if (end == pos) {
                /* clean granules up to the end of the unallocated run */
                n = p >= total ? total - pos : bi_align_down(p, g) - pos;
                *kind = CK_BACKING;
                return cursor_set(c, n, CK_BACKING);
            }
            break;
        }
        c->dirty_end = BI_MIN(end, pos + COMMIT_RUN_MAX);
    }

    struct bi_status st;
    memset(&st, 0, sizeof(st));
    ret = bi_block_status_above(top, NULL, pos, c->dirty_end - pos, &st);
    if (ret < 0) {
        return ret;
    }
    n = st.len == 0 || st.len > c->dirty_end - pos ? c->dirty_end - pos
                                                   : st.len;
    n = span_cut(s, 0, st.depth, pos, n);
    bool data = (st.flags & BI_BS_DATA) != 0;
    if (data) {
        /* QEMU copies at most 1 MiB at once; larger copies of data change
         * nothing in the result */
        n = BI_MIN(n, s->buf_size);
    }
    n = bi_align_down(n, g);
    *kind = CK_DATA;
    if (n < g) {
        n = g;
    } else if (!data && (!s->tcluster ||
                         (pos % s->tcluster == 0 && n % s->tcluster == 0))) {
        *kind = st.flags & BI_BS_ZERO ? CK_ZERO : CK_DISCARD;
    }
    n = BI_MIN(n, total - pos);
    return cursor_set(c, n, *kind);
}

/* Safe rebase, in qemu-img's steps: at most 2 MiB, cut where the image's
 * allocation changes, where allocation between the old backing file and
 * the prefix changes, and at the ends of the old and new backing files. */
static int64_t rebase_next(struct cv_state *s, struct cv_cursor *c,
                           enum chunk_kind *kind)
{
    const struct bi_convert_opts *o = s->o;
    uint64_t pos = c->pos, n = BI_MIN(REBASE_STEP, s->total - pos), m;
    struct bi_status st;
    bool alloc;
    int ret;

    memset(&st, 0, sizeof(st));
    ret = bi_block_status(s->src[0], pos, n, &st);
    if (ret < 0) {
        return ret;
    }
    if (st.len && st.len < n) {
        n = st.len;
    }
    n = span_cut(s, 0, 0, pos, n);
    *kind = CK_BACKING;
    if (st.flags & BI_BS_ALLOCATED) {
        return cursor_set(c, n, CK_BACKING);
    }
    if (o->rebase_prefix) {
        ret = allocated_above(s, 1, o->old_backing, o->rebase_prefix, pos, n,
                              &alloc, &m);
        if (ret < 0) {
            return ret;
        }
        n = BI_MIN(n, m);
        if (!alloc) {
            return cursor_set(c, n, CK_BACKING);
        }
    }
    c->old_zero = pos >= s->old_size;
    if (!c->old_zero && pos + n > s->old_size) {
        n = s->old_size - pos;
    }
    if (o->new_backing && pos < s->new_size && pos + n > s->new_size) {
        n = s->new_size - pos;
    }
    *kind = CK_DIFF;
    return cursor_set(c, n, CK_DIFF);
}

/* qemu-img's compare_buffers(): whether the first sector differs, and in
 * *pnum how many bytes from the start share that state. */
static bool diff_run(const uint8_t *a, const uint8_t *b, uint64_t len,
                     uint64_t *pnum)
{
    uint64_t i = BI_MIN(len, SECTOR);
    bool res = memcmp(a, b, i) != 0;
    while (i < len) {
        uint64_t l = BI_MIN(len - i, SECTOR);
        if ((memcmp(a + i, b + i, l) != 0) != res) {
            break;
        }
        i += l;
    }
    *pnum = i;
    return res;
}

/* ------------------------------------------------------------ the copy */

struct chunk {
    uint64_t off, len;
    enum chunk_kind kind;
    bool host_valid;
    bi_node *host_file;
    uint64_t host_off;
    bool pure;     /* nothing in it reads as zero: read without looking */
    bool released; /* in-order turn passed on */
    bool old_zero; /* rebase: past the end of the old backing file */
};

static int take_chunk(struct cv_state *s, struct chunk *ch)
{
    int64_t n;
    int ret = 0;

    bi_co_mutex_lock(&s->lock);
    if (s->ret || s->cur.pos >= s->total) {
        ret = 1;
        goto out;
    }
    if (cancelled(s)) {
        set_error(s, -ECANCELED, EK_NONE, s->cur.pos);
        ret = 1;
        goto out;
    }
    n = cursor_next(s, &s->cur, &ch->kind);
    if (n < 0) {
        set_error(s, (int)n, EK_STATUS, s->cur.pos);
        ret = 1;
        goto out;
    }
    ch->off = s->cur.pos;
    ch->released = false;
    ch->len = (uint64_t)n;
    ch->host_valid = s->cur.host_valid && ch->kind == CK_DATA &&
                     ch->off + ch->len <= s->cur.status_end;
    ch->host_file = s->cur.host_file;
    ch->host_off = s->cur.host_start + (ch->off - s->cur.run_start);
    ch->pure = s->cur.pure && ch->kind == CK_DATA &&
               ch->off + ch->len <= s->cur.status_end;
    ch->old_zero = s->cur.old_zero;
    s->cur.pos += (uint64_t)n;
out:
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* After a read of [soff, soff + len) of source i failed with ret: the
 * guest offset (in the concatenated sources) that qemu-img convert names
 * for the failure, the start of the first block status extent whose read
 * fails (qemu-img's chunks end at every extent); buf is scratch for len
 * bytes. When no piece fails alone, base + soff. */
static uint64_t locate_read_error(struct cv_state *s, int i, uint64_t soff,
                                  uint64_t len, uint8_t *buf, int *ret)
{
    uint64_t pos = soff, end = soff + len;
    while (pos < end) {
        struct bi_status st;
        memset(&st, 0, sizeof(st));
        int r = bi_block_status_above(s->src[i], src_base(s, s->src[i]), pos,
                                      end - pos, &st);
        uint64_t n =
            r == 0 && st.len > 0 ? BI_MIN(st.len, end - pos) : end - pos;
        r = bi_co_pread(s->src[i], pos, buf, n);
        if (r < 0) {
            *ret = r;
            return s->src_start[i] + pos;
        }
        pos += n;
    }
    return s->src_start[i] + soff;
}

/* Reads [off, off+len) of the concatenated sources into buf. */
static int co_read(struct cv_state *s, uint64_t off, uint64_t len, void *buf,
                   bool pure)
{
    uint8_t *p = buf;
    if (pure) {
        /* one run of one source that block status called data */
        int i = src_index(s, off);
        int ret = bi_co_pread(s->src[i], off - s->src_start[i], p, len);
        if (ret < 0) {
            uint64_t at =
                locate_read_error(s, i, off - s->src_start[i], len, p, &ret);
            set_error(s, ret, EK_READ, at);
        }
        return ret;
    }
    while (len) {
        int i = src_index(s, off);
        uint64_t n = BI_MIN(len, s->src_start[i + 1] - off);
        uint64_t soff = off - s->src_start[i];
        struct bi_status st;
        int ret;

        /* What reads as zero is not read. */
        memset(&st, 0, sizeof(st));
        ret = bi_block_status_above(s->src[i], src_base(s, s->src[i]), soff, n,
                                    &st);
        if (ret == 0 && st.len > 0 && (st.flags & BI_BS_ZERO)) {
            n = BI_MIN(n, st.len);
            memset(p, 0, n);
        } else {
            if (ret == 0 && st.len > 0) {
                n = BI_MIN(n, st.len);
            }
            ret = bi_co_pread(s->src[i], soff, p, n);
            if (ret < 0) {
                uint64_t at = locate_read_error(s, i, soff, n, p, &ret);
                set_error(s, ret, EK_READ, at);
                return ret;
            }
        }
        off += n;
        len -= n;
        p += n;
    }
    return 0;
}

struct releaser {
    struct cv_state *s;
    uint64_t end;
};

static void release_co(void *opaque)
{
    struct releaser *r = opaque;
    struct cv_state *s = r->s;
    if (!s->ret) {
        s->wr_next = r->end;
        bi_co_queue_wake_all(&s->wr_wait);
    }
    free(r);
    if (--s->releases == 0 && s->finished) {
        bi_co_queue_wake_all(&s->done_q);
    }
}

/* In-order writes: the turn passes to the next chunk as soon as this
 * chunk's last write has been issued (when the issuing coroutine first
 * yields), not when it completes. The target driver has mapped (allocated)
 * the range by then, so allocation follows guest order while the data
 * writes overlap. */
static void before_op(struct cv_state *s, struct chunk *ch, uint64_t op_end)
{
    if (!s->in_order || ch->released || op_end != ch->off + ch->len) {
        return;
    }
    struct releaser *r = bi_xmalloc(sizeof(*r));
    r->s = s;
    r->end = op_end;
    s->releases++;
    ch->released = true;
    bi_co_wake(bi_co_create(release_co, r));
}

static int co_write(struct cv_state *s, struct chunk *ch, uint64_t off,
                    uint64_t len, const void *buf)
{
    before_op(s, ch, off + len);
    int ret = bi_co_pwrite(s->dst, off, buf, len, 0);
    if (ret < 0) {
        set_error(s, ret, EK_WRITE, off);
    }
    return ret;
}

static int co_zero(struct cv_state *s, struct chunk *ch, uint64_t off,
                   uint64_t len)
{
    before_op(s, ch, off + len);
    int ret = bi_co_pwrite_zeroes(s->dst, off, len, BI_REQ_MAY_UNMAP);
    if (ret < 0) {
        set_error(s, ret, EK_WRITE, off);
    }
    return ret;
}

/* qemu's is_allocated_sectors(): length (bytes) of the run of zero or
 * non-zero sectors at buf, with run ends moved to the alignment. */
static bool run_is_data(const uint8_t *buf, uint64_t len, uint64_t off,
                        uint64_t align, uint64_t *pnum)
{
    uint64_t i;
    bool zero;

    zero = bi_buf_is_zero(buf, BI_MIN(SECTOR, len));
    for (i = SECTOR; i < len; i += SECTOR) {
        if (zero != bi_buf_is_zero(buf + i, BI_MIN(SECTOR, len - i))) {
            break;
        }
    }
    if (i >= len) {
        *pnum = len;
        return !zero;
    }
    uint64_t tail = (off + i) % align;
    if (tail) {
        if (zero && i <= tail) {
            zero = false; /* the next data would rewrite this anyway */
        }
        if (!zero) {
            i = BI_MIN(i + align - tail, len);
        } else {
            i -= tail;
        }
    }
    *pnum = i;
    return !zero;
}

/* qemu's is_allocated_sectors_min(): a data run may swallow zero runs
 * shorter than min. */
static bool run_is_data_min(const uint8_t *buf, uint64_t len, uint64_t off,
                            uint64_t min, uint64_t align, uint64_t *pnum)
{
    uint64_t num_used, num_checked, n;

    if (len < min) {
        min = len;
    }
    if (!run_is_data(buf, len, off, align, pnum)) {
        return false;
    }
    num_used = num_checked = *pnum;
    while (num_checked < len) {
        bool data = run_is_data(buf + num_checked, len - num_checked,
                                off + num_checked, align, &n);
        num_checked += n;
        if (data) {
            num_used = num_checked;
        } else if (n >= min) {
            break;
        }
    }
    *pnum = num_used;
    return true;
}

/* Copy offload of a data chunk through the protocol driver (the source
 * run's host node to the destination's protocol node, both the same
 * driver); false if it could not be used (the caller copies normally then,
 * and offload is not tried again). */
static bool try_copy_range(struct cv_state *s, const struct chunk *ch)
{
    if (!s->copy_range || !ch->host_valid || !ch->host_file ||
        !ch->host_file->drv || !ch->host_file->drv->is_protocol) {
        return false;
    }
    if (bi_co_copy_range(ch->host_file, ch->host_off, bi_node_file(s->dst),
                         ch->off, ch->len) < 0) {
        s->copy_range = false;
        return false;
    }
    return true;
}

static bool wait_turn(struct cv_state *s, struct chunk *ch)
{
    if (!s->in_order) {
        return !s->ret;
    }
    while (!s->ret && s->wr_next != ch->off) {
        bi_co_queue_wait(&s->wr_wait);
    }
    return !s->ret;
}

static void end_turn(struct cv_state *s, struct chunk *ch)
{
    if (s->in_order && !s->ret && !ch->released) {
        ch->released = true;
        s->wr_next = ch->off + ch->len;
        bi_co_queue_wake_all(&s->wr_wait);
    }
}

/* As qemu-img: a cluster of zeroes (-S) is not written compressed but left
 * alone on a target that reads as zeroes, zeroed otherwise; runs of the
 * other clusters go to the driver at once (compressed in parallel). */
static int write_compressed(struct cv_state *s, struct chunk *ch,
                            const uint8_t *buf)
{
    uint64_t done = 0, len = ch->len;
    while (done < len) {
        uint64_t run = 0;
        bool zero = false;
        while (done + run < len) {
            uint64_t l = BI_MIN(s->cluster, len - done - run);
            bool z = s->min_sparse && bi_buf_is_zero(buf + done + run, l);
            if (run && z != zero) {
                break;
            }
            zero = z;
            run += l;
        }
        uint64_t off = ch->off + done;
        int ret = 0;
        if (!zero) {
            before_op(s, ch, off + run);
            ret = bi_co_pwrite_compressed(s->dst, off, buf + done, run);
            if (ret < 0) {
                set_error(s, ret, EK_WRITE, off);
            }
        } else if (!s->has_zero_init) {
            ret = co_zero(s, ch, off, run);
        }
        if (ret < 0) {
            return ret;
        }
        done += run;
    }
    return 0;
}

static int write_data(struct cv_state *s, struct chunk *ch, const uint8_t *buf)
{
    uint64_t off = ch->off, len = ch->len;

    if (s->compress) {
        return write_compressed(s, ch, buf);
    }
    if (!s->min_sparse) {
        return co_write(s, ch, off, len, buf);
    }
    /* Fast path: with the chunk on alignment boundaries, a run of zeroes
     * survives the sector scan below only if it holds a whole aligned
     * block of zeroes. If no aligned block is zero, the chunk is one data
     * write; deciding that touches one cache line per block instead of
     * one per sector. */
    if (s->min_sparse <= s->align && off % s->align == 0 &&
        len % s->align == 0) {
        bool zero_block = false;
        for (uint64_t b = 0; b < len && !zero_block; b += s->align) {
            zero_block = bi_buf_is_zero(buf + b, s->align);
        }
        if (!zero_block) {
            return co_write(s, ch, off, len, buf);
        }
    }
    while (len) {
        uint64_t n;
        int ret;
        if (run_is_data_min(buf, len, off, s->min_sparse, s->align, &n)) {
            ret = co_write(s, ch, off, n, buf);
        } else if (s->has_zero_init) {
            ret = 0;
        } else {
            ret = co_zero(s, ch, off, n);
        }
        if (ret < 0) {
            return ret;
        }
        off += n;
        len -= n;
        buf += n;
    }
    return 0;
}

/* Rebase: reads both backing views, writes where they differ. */
static int do_diff(struct cv_state *s, struct chunk *ch, uint8_t *b_old,
                   uint8_t *b_new)
{
    const struct bi_convert_opts *o = s->o;
    uint64_t done = 0, pnum;
    int ret;

    if (ch->old_zero) {
        memset(b_old, 0, ch->len);
    } else if ((ret = bi_co_pread(o->old_backing, ch->off, b_old, ch->len)) <
               0) {
        set_error(s, ret, EK_READ_OLD, ch->off);
        return ret;
    }
    if (!o->new_backing || ch->off >= s->new_size) {
        memset(b_new, 0, ch->len);
    } else if ((ret = bi_co_pread(o->new_backing, ch->off, b_new, ch->len)) <
               0) {
        set_error(s, ret, EK_READ_NEW, ch->off);
        return ret;
    }
    if (!wait_turn(s, ch)) {
        return -1;
    }
    while (done < ch->len) {
        if (diff_run(b_old + done, b_new + done, ch->len - done, &pnum)) {
            uint64_t off = ch->off + done;
            before_op(s, ch, off + pnum);
            if (ch->old_zero) {
                ret = bi_co_pwrite_zeroes(s->dst, off, pnum, 0);
            } else {
                ret = bi_co_pwrite(s->dst, off, b_old + done, pnum, 0);
            }
            if (ret < 0) {
                set_error(s, ret, EK_WRITE, off);
                return ret;
            }
        }
        done += pnum;
    }
    return 0;
}

static int do_chunk(struct cv_state *s, struct chunk *ch, uint8_t *buf,
                    uint8_t *buf2)
{
    int ret = 0;

    switch (ch->kind) {
    case CK_BACKING:
        if (!wait_turn(s, ch)) {
            return -1;
        }
        break;
    case CK_DIFF:
        ret = do_diff(s, ch, buf, buf2);
        break;
    case CK_DISCARD:
        if (!wait_turn(s, ch)) {
            return -1;
        }
        before_op(s, ch, ch->off + ch->len);
        ret = bi_co_pdiscard(s->dst, ch->off, ch->len);
        if (ret < 0) {
            set_error(s, ret, EK_WRITE, ch->off);
        }
        break;
    case CK_ZERO:
        if (!s->min_sparse && s->o->mode == BI_COPY_CONVERT) {
            /* -S 0: fully allocated output; no need to read zeroes. */
            if (!wait_turn(s, ch)) {
                return -1;
            }
            for (uint64_t o = 0; o < ch->len && ret == 0; o += s->buf_size) {
                uint64_t n = BI_MIN(s->buf_size, ch->len - o);
                if (s->compress) {
                    /* as qemu-img: zero clusters written compressed */
                    before_op(s, ch, ch->off + o + n);
                    ret = bi_co_pwrite_compressed(s->dst, ch->off + o,
                                                  s->zero_buf, n);
                    if (ret < 0) {
                        set_error(s, ret, EK_WRITE, ch->off + o);
                    }
                } else {
                    ret = co_write(s, ch, ch->off + o, n, s->zero_buf);
                }
            }
            break;
        }
        if (!wait_turn(s, ch)) {
            return -1;
        }
        if (!s->has_zero_init) {
            ret = co_zero(s, ch, ch->off, ch->len);
        }
        break;
    case CK_DATA:
        if (s->copy_range && !s->in_order) {
            if (try_copy_range(s, ch)) {
                break;
            }
        }
        ret = co_read(s, ch->off, ch->len, buf, ch->pure);
        if (ret < 0) {
            return ret;
        }
        if (!wait_turn(s, ch)) {
            return -1;
        }
        ret = write_data(s, ch, buf);
        break;
    }
    if (ret == 0) {
        end_turn(s, ch);
    }
    return ret;
}

/* Whether a chunk counts in the progress total. */
static bool chunk_counted(const struct cv_state *s, enum chunk_kind k)
{
    switch (s->o->mode) {
    case BI_COPY_COMMIT:
        return k != CK_BACKING; /* the commit job counts every dirty byte */
    case BI_COPY_REBASE:
        return k == CK_DIFF;
    default:
        return k == CK_DATA || (!s->min_sparse && k == CK_ZERO);
    }
}

/* Whether a chunk's bytes count against the rate limit (data moved). */
static bool chunk_rated(const struct cv_state *s, enum chunk_kind k)
{
    return s->o->mode == BI_COPY_CONVERT ? chunk_counted(s, k) : k == CK_DATA;
}

static void report(struct cv_state *s, uint64_t len, bool counted)
{
    if (counted && s->o->step) {
        s->o->step(s->o->step_opaque);
    }
    if (!counted || !s->o->progress || !s->alloc_total) {
        s->done += counted ? len : 0;
        return;
    }
    /* -c: qemu-img's chunks are one cluster each, and so are its steps */
    uint64_t step = s->compress ? s->cluster : len;
    for (uint64_t d = 0; d < len; d += step) {
        s->done += BI_MIN(step, len - d);
        s->o->progress(s->o->progress_opaque, s->done, s->alloc_total);
    }
}

/* Progress advances in the order of the chunks, as with qemu-img's in-order
 * writes, even when the writes themselves complete out of order (the
 * printed percentages then match qemu-img's). */
static void chunk_done(struct cv_state *s, const struct chunk *ch)
{
    bool counted = chunk_counted(s, ch->kind);

    if (!s->o->progress && !s->o->step) {
        return;
    }
    if (s->o->out_of_order) {
        report(s, ch->len, counted);
        return;
    }
    if (ch->off != s->frontier) {
        struct pend *p = bi_xmalloc(sizeof(*p)), **pp = &s->pend;
        p->off = ch->off;
        p->len = ch->len;
        p->counted = counted;
        while (*pp && (*pp)->off < p->off) {
            pp = &(*pp)->next;
        }
        p->next = *pp;
        *pp = p;
        return;
    }
    report(s, ch->len, counted);
    s->frontier = ch->off + ch->len;
    while (s->pend && s->pend->off == s->frontier) {
        struct pend *p = s->pend;
        s->pend = p->next;
        report(s, p->len, p->counted);
        s->frontier = p->off + p->len;
        free(p);
    }
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#define RL_SLICE_NS 100000000ULL

/* Delay before n more bytes may go, as qemu's ratelimit computes it: a
 * quota per 100 ms slice; past it, wait in proportion to the excess. */
static uint64_t rate_delay(struct cv_state *s, uint64_t n)
{
    uint64_t now = mono_ns();
    if (s->rl_end < now) {
        s->rl_start = now;
        s->rl_end = now + RL_SLICE_NS;
        s->rl_dispatched = 0;
    }
    s->rl_dispatched += n;
    if (s->rl_dispatched < s->rl_quota) {
        return 0;
    }
    double slices = (double)s->rl_dispatched / (double)s->rl_quota;
    s->rl_end = s->rl_start + (uint64_t)(slices * (double)RL_SLICE_NS);
    return s->rl_end > now ? s->rl_end - now : 0;
}

struct rl_sleep {
    uint64_t ns;
    volatile sig_atomic_t *cancel;
};

/* Sleeps ns in slices of at most 20 ms, so that an interrupt (SIGINT,
 * SIGTERM) stops the copy at once rather than after every worker's
 * queued delay. */
static int sleep_fn(void *opaque)
{
    struct rl_sleep *r = opaque;
    uint64_t left = r->ns;
    while (left && !(r->cancel && *r->cancel)) {
        uint64_t ns = BI_MIN(left, 20000000ULL);
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
        left -= ns;
    }
    return 0;
}

static void worker(void *opaque)
{
    struct cv_state *s = opaque;
    uint8_t *buf = bi_alloc_aligned(s->mem_align, s->buf_size);
    uint8_t *buf2 = NULL;
    struct chunk ch;

    if (buf && s->o->mode == BI_COPY_REBASE) {
        buf2 = bi_alloc_aligned(s->mem_align, s->buf_size);
        if (!buf2) {
            bi_free_aligned(buf);
            buf = NULL;
        }
    }
    if (!buf) {
        set_error(s, -ENOMEM, EK_NONE, 0);
    }
    /* every chunk goes through these buffers: pinned once */
    bool reg = bi_io_buf_register(buf, s->buf_size);
    bool reg2 = bi_io_buf_register(buf2, s->buf_size);
    while (buf && take_chunk(s, &ch) == 0) {
        if (s->rl_quota && chunk_rated(s, ch.kind)) {
            struct rl_sleep r = {rate_delay(s, ch.len), s->o->cancel};
            if (r.ns) {
                bi_run_in_thread(sleep_fn, &r);
            }
        }
        if (do_chunk(s, &ch, buf, buf2) < 0) {
            break;
        }
        chunk_done(s, &ch);
    }
    if (reg) {
        bi_io_buf_unregister(buf);
    }
    if (reg2) {
        bi_io_buf_unregister(buf2);
    }
    bi_free_aligned(buf);
    bi_free_aligned(buf2);
    if (--s->running == 0) {
        s->finished = true;
        bi_co_queue_wake_all(&s->done_q);
    }
}

static int count_allocated(struct cv_state *s)
{
    struct cv_cursor c;
    memset(&c, 0, sizeof(c));
    s->alloc_total = 0;
    while (c.pos < s->total) {
        enum chunk_kind k;
        int64_t n = cursor_next(s, &c, &k);
        if (n < 0) {
            set_error(s, (int)n, EK_STATUS, c.pos);
            return (int)n;
        }
        if (chunk_counted(s, k)) {
            s->alloc_total += (uint64_t)n;
        }
        c.pos += (uint64_t)n;
        if (cancelled(s)) {
            set_error(s, -ECANCELED, EK_NONE, c.pos);
            return -ECANCELED;
        }
    }
    return 0;
}

static int convert_co(void *opaque)
{
    struct cv_state *s = opaque;
    int n = s->o->num_coroutines;

    if (s->o->progress) {
        if (count_allocated(s) < 0) {
            return s->ret;
        }
    }
    s->running = n;
    for (int i = 0; i < n; i++) {
        bi_co *co = bi_co_create(worker, s);
        bi_co_wake(co);
    }
    while (!s->finished || s->releases) {
        bi_co_queue_wait(&s->done_q);
    }
    if (s->ret == 0 && s->compress) {
        /* as qemu-img: an empty compressed write ends the file on a sector
         * boundary (compressed data ends anywhere) */
        int ret = bi_co_pwrite_compressed(s->dst, 0, NULL, 0);
        if (ret < 0 && ret != -ENOTSUP) {
            set_error(s, ret, EK_WRITE, s->total);
        }
    }
    if (s->ret == 0 && s->o->flush) {
        int ret = bi_co_flush(s->dst);
        if (ret < 0) {
            set_error(s, ret, EK_WRITE, s->total);
        }
    }
    return s->ret;
}

static uint64_t pow2floor(uint64_t v)
{
    uint64_t p = 1;
    while (p * 2 <= v && p * 2 != 0) {
        p *= 2;
    }
    return p;
}

static uint64_t node_cluster(bi_node *n)
{
    struct bi_geometry g;
    bi_node_geometry(n, &g);
    return g.cluster_size;
}

static bool node_compressed_only(bi_node *n)
{
    struct bi_geometry g;
    bi_node_geometry(n, &g);
    return g.compressed_writes_only;
}

/* Commit and rebase: what they take and how they differ from convert. */
static int setup_mode(struct cv_state *s, bi_error *err)
{
    const struct bi_convert_opts *o = s->o;

    if (o->n_src != 1 || o->compress || o->copy_range ||
        o->target_has_backing || o->target_is_zero) {
        bi_error_set(err, EINVAL, "Invalid copy options");
        return -EINVAL;
    }
    /* every byte the copy reads is written as read */
    s->min_sparse = 0;
    for (bi_node *n = o->src[0]; n && s->n_spans < (int)BI_ARRAY_SIZE(s->spans);
         n = bi_node_backing(n)) {
        struct bi_geometry g;
        bi_node_geometry(n, &g);
        s->spans[s->n_spans++] = g.status_span;
    }
    if (o->mode == BI_COPY_COMMIT) {
        int64_t dlen = bi_getlength(o->dst);
        if (dlen < 0 || (uint64_t)dlen < s->total) {
            bi_error_set(err, EINVAL, "The base is shorter than the image");
            return -EINVAL;
        }
        /* bdrv_get_default_bitmap_granularity() of the base */
        s->tcluster = s->cluster;
        s->gran = o->copy_granularity;
        if (!s->gran) {
            s->gran =
                s->cluster ? BI_MIN(BI_MAX(s->cluster, 4096), 65536) : 65536;
        }
        return 0;
    }
    if (o->dst != o->src[0]) {
        bi_error_set(err, EINVAL, "Invalid copy options");
        return -EINVAL;
    }
    if (o->old_backing) {
        int64_t l = bi_getlength(o->old_backing);
        if (l < 0) {
            bi_error_set(err, (int)-l, "Could not get size of '%s'",
                         bi_node_filename(o->old_backing));
            return (int)l;
        }
        s->old_size = (uint64_t)l;
    }
    if (o->new_backing) {
        int64_t l = bi_getlength(o->new_backing);
        if (l < 0) {
            bi_error_set(err, (int)-l, "Could not get size of '%s'",
                         bi_node_filename(o->new_backing));
            return (int)l;
        }
        s->new_size = (uint64_t)l;
    }
    return 0;
}

int bi_convert(const struct bi_convert_opts *given, bi_error *err)
{
    struct bi_convert_opts full;
    const struct bi_convert_opts *o = &full;
    struct cv_state s;
    int ret;

    bi_convert_opts_init(&full);
    if (bi_struct_in(&full, sizeof(full), given, given->struct_size) < 0)
        return bi_error_setc(err, -EINVAL,
                             "bi_convert_opts of size %zu (not set by "
                             "bi_convert_opts_init, or from a newer API)",
                             given->struct_size);

    memset(&s, 0, sizeof(s));
    s.o = o;
    s.src = o->src;
    s.n_src = o->n_src;
    s.dst = o->dst;
    if (o->n_src < 1 || !o->dst) {
        bi_error_set(err, EINVAL, "Nothing to convert");
        return -EINVAL;
    }
    if (o->num_coroutines < 1 || o->num_coroutines > MAX_COROUTINES) {
        bi_error_set(err, 0,
                     "Invalid number of coroutines. Allowed number of "
                     "coroutines is between 1 and %d",
                     MAX_COROUTINES);
        return -EINVAL;
    }

    s.src_start = bi_xzalloc(sizeof(uint64_t) * (size_t)(o->n_src + 1));
    s.src_align = bi_xzalloc(sizeof(uint64_t) * (size_t)o->n_src);
    for (int i = 0; i < o->n_src; i++) {
        int64_t len = bi_getlength(o->src[i]);
        if (len < 0) {
            bi_error_set(err, (int)-len, "Could not get size of '%s'",
                         bi_node_filename(o->src[i]));
            ret = (int)len;
            goto out;
        }
        s.src_start[i + 1] = s.src_start[i] + (uint64_t)len;
        uint64_t a = BI_MAX((uint64_t)o->src[i]->limits.request_alignment,
                            node_cluster(o->src[i]));
        s.src_align[i] = a ? a : 1;
    }
    s.total = s.src_start[o->n_src];

    s.min_sparse = o->min_sparse;
    s.cluster = node_cluster(o->dst);
    s.compress = o->compress || node_compressed_only(o->dst);
    if (o->mode != BI_COPY_CONVERT) {
        ret = setup_mode(&s, err);
        if (ret < 0) {
            goto out;
        }
    }
    s.buf_size = o->buf_size ? o->buf_size : DEFAULT_BUF;
    s.buf_size = BI_MIN(s.buf_size, MAX_BUF);
    if (s.compress) {
        if (s.cluster == 0 || s.cluster > MAX_BUF) {
            bi_error_set(err, 0, "invalid cluster size");
            ret = -EINVAL;
            goto out;
        }
        /* several clusters a chunk: the driver compresses them at once */
        s.buf_size =
            BI_MAX(s.cluster, bi_align_down(COMPRESS_CHUNK, s.cluster));
    } else {
        /* whole clusters of up to DEFAULT_BUF a chunk; larger clusters
         * (vhdx's blocks, 32 MiB by default) take several chunks, as
         * with qemu-img: a buffer per worker that large would be pinned
         * whole for io_uring (256 MiB for eight workers) */
        s.buf_size = BI_MAX(s.buf_size, BI_MIN(s.cluster, DEFAULT_BUF));
        s.buf_size = BI_MIN(s.buf_size, MAX_BUF);
    }
    s.align = BI_MAX(pow2floor(s.min_sparse / SECTOR) * SECTOR,
                     bi_align_up(o->dst->limits.request_alignment, SECTOR));
    if (s.align == 0) {
        s.align = SECTOR;
    }
    s.has_zero_init = o->target_is_zero && !o->target_has_backing;
    if (o->rate_limit) {
        s.rl_quota = BI_MAX(o->rate_limit / 10, 1);
    }
    s.mem_align = BI_MAX((uint64_t)o->dst->limits.opt_mem_alignment,
                         (uint64_t)bi_page_size());
    for (int i = 0; i < o->n_src; i++) {
        s.mem_align =
            BI_MAX(s.mem_align, (uint64_t)o->src[i]->limits.opt_mem_alignment);
    }
    /* The order of writes to a raw file changes nothing in its layout; a
     * block device (thin-provisioned volumes allocate in write order) and
     * image formats get their writes in order unless -W. */
    s.in_order = !o->out_of_order;
    if (s.in_order && o->dst->drv->identity_map && bi_node_file(o->dst)) {
        struct bi_storage_info si;
        memset(&si, 0, sizeof(si));
        if (bi_storage_info(bi_node_file(o->dst), &si) == 0 &&
            !si.is_block_device) {
            s.in_order = false;
        }
    }

    s.copy_range = o->copy_range && !s.compress && bi_node_file(o->dst) &&
                   bi_node_file(o->dst) != o->dst && o->dst->drv->identity_map;

    if (!s.min_sparse) {
        s.zero_buf = bi_alloc_aligned(s.mem_align, s.buf_size);
        if (!s.zero_buf) {
            bi_error_set(err, ENOMEM, "Could not allocate buffer");
            ret = -ENOMEM;
            goto out;
        }
        memset(s.zero_buf, 0, s.buf_size);
    }

    bi_co_mutex_init(&s.lock);
    bi_co_queue_init(&s.wr_wait);
    bi_co_queue_init(&s.done_q);

    ret = bi_run_co(convert_co, &s);
    if (s.ret < 0) {
        ret = s.ret;
    }
    if (ret < 0 && o->mode == BI_COPY_REBASE) {
        /* qemu-img rebase's messages */
        switch (s.ekind) {
        case EK_STATUS:
            bi_error_set(err, -ret, "error while reading image metadata");
            break;
        case EK_READ_OLD:
            bi_error_set(err, 0, "error while reading from old backing file");
            break;
        case EK_READ_NEW:
            bi_error_set(err, 0, "error while reading from new backing file");
            break;
        case EK_WRITE:
            bi_error_set(err, -ret, "Error while writing to COW image");
            break;
        default:
            break;
        }
    }
    if (ret < 0) {
        switch (s.ekind) {
        case EK_STATUS:
            bi_error_set(err, -ret,
                         "error while reading block status at offset "
                         "%" PRIu64,
                         s.eoff);
            break;
        case EK_READ:
        case EK_READ_OLD:
        case EK_READ_NEW:
            bi_error_set(err, -ret, "error while reading at byte %" PRIu64,
                         s.eoff);
            break;
        case EK_WRITE:
            bi_error_set(err, -ret, "error while writing at byte %" PRIu64,
                         s.eoff);
            break;
        case EK_NONE:
            if (ret == -ECANCELED) {
                bi_error_set(err, 0,
                             "copy stopped at byte %" PRIu64 " of %" PRIu64,
                             s.eoff, s.total);
            } else {
                bi_error_set(err, -ret, "Conversion failed");
            }
            break;
        }
    }
out:
    while (s.pend) {
        struct pend *p = s.pend;
        s.pend = p->next;
        free(p);
    }
    bi_free_aligned(s.zero_buf);
    free(s.src_start);
    free(s.src_align);
    return ret;
}
