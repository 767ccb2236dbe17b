/* SPDX-License-Identifier: MIT */
/*
 * vmdk mapping: guest ranges to runs of one kind (host-contiguous data,
 * zeroes, unallocated, one compressed grain), across grain and grain-table
 * boundaries; block status as QEMU reports it; compressed grains; and
 * allocating writes: the grain's data (with copy-on-write head and tail)
 * first, then its entry in the grain table and in the redundant one, as
 * QEMU keeps both.
 */
#include "io/aio.h"
#include "util/util.h"
#include "vmdk.h"

#include <endian.h>
#include <errno.h>
#include <libdeflate.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum run_kind { RUN_UNALLOC, RUN_ZERO, RUN_DATA, RUN_COMPRESSED };

struct run {
    enum run_kind kind;
    uint64_t len;
    uint64_t host; /* DATA: bytes in e->file; COMPRESSED: the grain */
    struct vmdk_extent *e;
};

/* An allocation in flight: count grains from the grain of guest offset
 * goff, at host byte host, waiting for their grain table entries. */
struct alloc {
    struct vmdk_extent *e;
    uint64_t rel; /* extent-relative offset of the first grain */
    uint64_t count;
    uint64_t host;
};

/* --------------------------------------------------- grain table cache */

void vmdk_gt_cache_free(struct vmdk_extent *e)
{
    for (int i = 0; i < VMDK_GT_CACHE; i++) {
        free(e->cache[i].gt);
        e->cache[i].gt = NULL;
        e->cache[i].sector = 0;
    }
}

/* The grain table at sector (checked inside the file at open), from the
 * cache or read into its least recently used slot. */
static int gt_get(struct vmdk_extent *e, uint32_t sector, uint32_t **out)
{
    struct vmdk_gt_slot *victim = &e->cache[0];
    for (int i = 0; i < VMDK_GT_CACHE; i++) {
        struct vmdk_gt_slot *c = &e->cache[i];
        if (c->gt && c->sector == sector) {
            c->used = ++e->cache_clock;
            *out = c->gt;
            return 0;
        }
        if (!c->gt || (victim->gt && c->used < victim->used))
            victim = c;
    }
    size_t bytes = (size_t)e->gt_entries * 4;
    if (!victim->gt)
        victim->gt = bi_xmalloc(bytes);
    victim->sector = 0;
    int ret =
        bi_co_pread(e->file, (uint64_t)sector * VMDK_SECTOR, victim->gt, bytes);
    if (ret < 0)
        return ret;
    for (uint32_t i = 0; i < e->gt_entries; i++)
        victim->gt[i] = le32toh(victim->gt[i]);
    victim->sector = sector;
    victim->used = ++e->cache_clock;
    *out = victim->gt;
    return 0;
}

/* ------------------------------------------------------------ mapping */

struct vmdk_extent *vmdk_find_extent(vmdk_state *s, uint64_t off)
{
    int lo = 0, hi = s->n_ext - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        struct vmdk_extent *e = &s->ext[mid];
        if (off < e->start)
            hi = mid - 1;
        else if (off - e->start >= e->len)
            lo = mid + 1;
        else
            return e;
    }
    return NULL;
}

int vmdk_gte(struct vmdk_extent *e, uint64_t rel, uint32_t *gte, bool *no_gt)
{
    uint64_t g = rel / e->grain;
    uint64_t gdi = g / e->gt_entries, gti = g % e->gt_entries;
    *gte = 0;
    *no_gt = false;
    if (gdi >= e->gd_entries)
        return -EIO;
    if (!e->gd[gdi]) {
        *no_gt = true;
        return 0;
    }
    uint32_t *gt;
    int ret = gt_get(e, e->gd[gdi], &gt);
    if (ret == 0)
        *gte = gt[gti];
    return ret;
}

/* What the grain holding extent-relative offset rel is, as one run up to
 * the end of that grain, or (for a grain table the directory lacks) up to
 * the end of the table's span. -EIO for an offset past the directory or an
 * entry pointing past the end of the file. */
static int grain_run(struct vmdk_extent *e, uint64_t rel, struct run *r)
{
    uint64_t g = rel / e->grain, in = rel % e->grain;
    uint32_t gte;
    bool no_gt;
    r->e = e;
    int ret = vmdk_gte(e, rel, &gte, &no_gt);
    if (ret < 0)
        return ret;
    r->len = e->grain - in;
    if (no_gt) {
        r->kind = RUN_UNALLOC;
        r->len += (e->gt_entries - 1 - g % e->gt_entries) * e->grain;
    } else if (gte == 0) {
        r->kind = RUN_UNALLOC;
    } else if (gte == VMDK_GTE_ZEROED && e->zero_grain) {
        r->kind = RUN_ZERO;
    } else {
        uint64_t host = (uint64_t)gte * VMDK_SECTOR;
        if (host >= e->file_size)
            return -EIO; /* the grain lies past the end of the file */
        r->kind = e->compressed ? RUN_COMPRESSED : RUN_DATA;
        r->host = e->compressed ? host : host + in;
    }
    return 0;
}

/* The longest run of one kind from guest offset off (at most len bytes,
 * not past the extent): host-contiguous grains are one run. */
static int map_run(vmdk_state *s, uint64_t off, uint64_t len, struct run *r)
{
    struct vmdk_extent *e = vmdk_find_extent(s, off);
    if (!e)
        return -EIO;
    uint64_t rel = off - e->start, limit = BI_MIN(len, e->len - rel);
    r->e = e;
    if (e->flat) {
        r->kind = e->file ? RUN_DATA : RUN_ZERO;
        r->host = e->flat_offset + rel;
        r->len = limit;
        return 0;
    }
    int ret = grain_run(e, rel, r);
    while (ret == 0 && r->len < limit && r->kind != RUN_COMPRESSED) {
        struct run next;
        ret = grain_run(e, rel + r->len, &next);
        if (ret < 0 || next.kind != r->kind ||
            (r->kind == RUN_DATA && next.host != r->host + r->len))
            break;
        r->len += next.len;
    }
    if (r->len > limit)
        r->len = limit;
    return r->len || ret < 0 ? ret : -EIO;
}

/* QEMU reads an unallocated range of an image with a parent only while
 * the parent is a vmdk whose CID is the parentCID this image records. */
static int check_parent_cid(bi_node *n)
{
    vmdk_state *s = n->opaque;
    if (s->cid_checked || !n->backing)
        return 0;
    if (n->backing->drv != n->drv)
        return -EINVAL;
    const vmdk_state *p = n->backing->opaque;
    if (p->cid != s->parent_cid)
        return -EINVAL;
    s->cid_checked = true;
    return 0;
}

static int map_read(bi_node *n, uint64_t off, uint64_t len,
                    struct bi_extent *ext)
{
    vmdk_state *s = n->opaque;
    struct run r;
    bi_co_mutex_lock(&s->lock);
    int ret = map_run(s, off, len, &r);
    if (ret == 0 && r.kind == RUN_UNALLOC)
        ret = check_parent_cid(n);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        return ret;
    static const enum bi_extent_kind kinds[] = {
        [RUN_UNALLOC] = BI_EXT_UNALLOC,
        [RUN_ZERO] = BI_EXT_ZERO,
        [RUN_DATA] = BI_EXT_DATA,
        [RUN_COMPRESSED] = BI_EXT_COMPRESSED,
    };
    ext->kind = kinds[r.kind];
    ext->len = r.len;
    ext->host = r.e->file;
    ext->host_offset = r.host;
    return 0;
}

int vmdk_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                         struct bi_status *st)
{
    vmdk_state *s = n->opaque;
    struct run r;
    memset(st, 0, sizeof(*st));
    bi_co_mutex_lock(&s->lock);
    int ret = map_run(s, off, len, &r);
    bi_co_mutex_unlock(&s->lock);
    if (ret < 0)
        return ret;
    st->len = r.len;
    switch (r.kind) {
    case RUN_UNALLOC:
        break;
    case RUN_ZERO:
        st->flags = BI_BS_ZERO;
        break;
    case RUN_DATA:
        st->flags = BI_BS_DATA | BI_BS_OFFSET_VALID;
        st->offset = r.host;
        st->file = r.e->file;
        if (r.e->flat) /* QEMU looks at the flat file's holes */
            st->flags |= BI_BS_RECURSE;
        break;
    case RUN_COMPRESSED:
        st->flags = BI_BS_DATA | BI_BS_COMPRESSED;
        st->file = r.e->file;
        break;
    }
    if (off + st->len >= n->size)
        st->flags |= BI_BS_EOF;
    return 0;
}

/* ------------------------------------------------------ compressed grains */

struct inflate_job {
    const uint8_t *src;
    size_t slen;
    uint8_t *dst;
    size_t dlen; /* room in dst; then what came out */
};

/* libdeflate, not zlib: the stream is whole in memory, and its adler32
 * and copying of stored blocks take half zlib's time (random data is
 * stored). Bytes past the end of the stream are ignored, as zlib's
 * uncompress() does. */
static int inflate_fn(void *arg)
{
    struct inflate_job *j = arg;
    struct libdeflate_decompressor *d = libdeflate_alloc_decompressor();
    if (!d)
        return -ENOMEM;
    size_t in_used;
    enum libdeflate_result r = libdeflate_zlib_decompress_ex(
        d, j->src, j->slen, j->dst, j->dlen, &in_used, &j->dlen);
    libdeflate_free_decompressor(d);
    return r == LIBDEFLATE_SUCCESS ? 0 : -EINVAL;
}

/* Inflates the zlib stream of one grain at host (a 12-byte marker first
 * where the extent has markers; QEMU reads up to two grains' worth, cut
 * here at the end of the file) into out (e->grain bytes) on a worker
 * thread; *out_len is what came out. The first read takes a grain and
 * 4 KiB, which holds any grain that did not grow when compressed (one
 * I/O); the marker tells whether more is to be read. */
static int inflate_grain(struct vmdk_extent *e, uint64_t host, uint8_t *out,
                         uint64_t *out_len)
{
    uint64_t cap = 2 * e->grain;
    if (host < e->file_size)
        cap = BI_MIN(cap, bi_align_up(e->file_size - host, VMDK_SECTOR));
    uint8_t *in = bi_alloc_aligned(4096, cap);
    if (!in)
        return -ENOMEM;
    uint64_t first = BI_MIN(cap, e->grain + 4096),
             skip = e->has_marker ? 12 : 0;
    int ret = bi_co_pread(e->file, host, in, first);
    uint64_t data_len = BI_MIN(e->grain, cap);
    if (ret == 0 && e->has_marker)
        data_len = cap < 12 ? 0 : bi_ld_le32(in + 8);
    if (ret == 0 && (data_len == 0 || data_len > cap - skip))
        ret = -EINVAL;
    if (ret == 0 && skip + data_len > first)
        ret = bi_co_pread(e->file, host + first, in + first,
                          skip + data_len - first);
    struct inflate_job j = {in + skip, data_len, out, e->grain};
    if (ret == 0)
        ret = bi_run_in_thread(inflate_fn, &j);
    bi_free_aligned(in);
    *out_len = ret == 0 ? j.dlen : 0;
    return ret;
}

int vmdk_co_read_compressed(bi_node *n, const struct bi_extent *ext,
                            uint64_t off, uint64_t len, const struct iovec *iov,
                            int iovcnt)
{
    vmdk_state *s = n->opaque;
    struct vmdk_extent *e = vmdk_find_extent(s, off);
    if (!e || e->flat || ext->host != e->file)
        return -EIO;
    uint64_t in = (off - e->start) % e->grain;
    if (in + len > e->grain)
        return -EINVAL;
    uint8_t *buf = malloc(e->grain);
    if (!buf)
        return -ENOMEM;
    uint64_t got = 0;
    int ret = inflate_grain(e, ext->host_offset, buf, &got);
    if (ret == 0 && in + len > got)
        ret = -EINVAL;
    if (ret == 0)
        bi_iov_from_buf(iov, iovcnt, 0, buf + in, len);
    free(buf);
    return ret;
}

/* -------------------------------------------------- allocating writes */

/* Guest bytes [goff, goff + len) as the grain shows them before it is
 * allocated: the parent's (past its end: zeroes) unless the grain was a
 * zeroed one or there is no parent. */
static int fill_cow(bi_node *n, bool zeroed, uint64_t goff, uint8_t *buf,
                    uint64_t len)
{
    memset(buf, 0, len);
    if (zeroed || !n->backing || goff >= n->backing->size)
        return 0;
    int ret = check_parent_cid(n);
    if (ret < 0)
        return ret;
    return bi_co_pread(n->backing, goff, buf,
                       BI_MIN(len, n->backing->size - goff));
}

/* The copy-on-write bytes of a write [off, off + len) that allocates
 * grains: the head of the first grain, the tail of the last. */
static int alloc_cow(bi_node *n, struct vmdk_extent *e, uint64_t off,
                     uint64_t len, bool head_zeroed, bool tail_zeroed,
                     struct bi_extent *ext)
{
    uint64_t in = (off - e->start) % e->grain;
    uint64_t end_in = (off - e->start + len) % e->grain;
    int ret = 0;
    if (in) {
        ext->cow_head = bi_blockalign(e->file, in);
        ext->cow_head_len = in;
        ret = fill_cow(n, head_zeroed, off - in, ext->cow_head, in);
    }
    if (ret == 0 && end_in) {
        uint64_t t = e->grain - end_in;
        ext->cow_tail = bi_blockalign(e->file, t);
        ext->cow_tail_len = t;
        ret = fill_cow(n, tail_zeroed, off + len, ext->cow_tail, t);
    }
    return ret;
}

/* Allocates the grains of [off, off + len) that are unallocated or
 * zeroed, from the first (which is) on, as one host run at the end of the
 * extent's file. Needs each grain's table to exist (QEMU creates them
 * all). */
static int map_alloc(bi_node *n, struct vmdk_extent *e, uint64_t off,
                     uint64_t len, struct run *first, struct bi_extent *ext)
{
    uint64_t rel = off - e->start, limit = BI_MIN(len, e->len - rel);
    uint64_t g0 = rel / e->grain;
    uint64_t end = rel + first->len;
    struct run last = *first;
    while (end < rel + limit) {
        struct run next;
        int ret = grain_run(e, end, &next);
        if (ret < 0 || (next.kind != RUN_UNALLOC && next.kind != RUN_ZERO))
            break;
        last = next;
        end += BI_MIN(next.len, e->grain);
    }
    end = BI_MIN(end, rel + limit);
    uint64_t count = (bi_align_up(end, e->grain) / e->grain) - g0;
    for (uint64_t g = g0; g < g0 + count; g++)
        if (!e->gd[g / e->gt_entries])
            return -EIO; /* no grain table to record the grain in */
    uint64_t host = e->next_grain;
    if (host / VMDK_SECTOR + count * (e->grain / VMDK_SECTOR) >
        VMDK_MAX_EXTENT_SECTORS)
        return -EINVAL;
    e->next_grain += count * e->grain;
    struct alloc *a = bi_xmalloc(sizeof(*a));
    *a = (struct alloc){e, g0 * e->grain, count, host};
    ext->cookie = a;
    ext->kind = BI_EXT_DATA;
    ext->len = end - rel;
    ext->host = e->file;
    ext->host_offset = host + rel % e->grain;
    return alloc_cow(n, e, off, ext->len, first->kind == RUN_ZERO,
                     last.kind == RUN_ZERO, ext);
}

static int map_write(bi_node *n, uint64_t off, uint64_t len,
                     struct bi_extent *ext)
{
    vmdk_state *s = n->opaque;
    struct run r;
    bi_co_mutex_lock(&s->lock);
    int ret = map_run(s, off, len, &r);
    if (ret == 0 && (r.kind == RUN_COMPRESSED || (r.e->flat && !r.e->file)))
        ret = -EIO; /* compressed grains are written once; ZERO extents */
    if (ret == 0 && r.kind == RUN_DATA) {
        if (!r.e->flat && r.host < r.e->data_start)
            ret = -EIO; /* an entry pointing into the metadata */
        ext->kind = BI_EXT_DATA;
        ext->len = r.len;
        ext->host = r.e->file;
        ext->host_offset = r.host;
    } else if (ret == 0 && r.e->compressed) {
        ret = -ENOTSUP; /* streamOptimized: compressed writes only */
    } else if (ret == 0) {
        ret = map_alloc(n, r.e, off, len, &r, ext);
    }
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

int vmdk_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                struct bi_extent *ext)
{
    if (flags & BI_MAP_WRITE)
        return map_write(n, off, len, ext);
    return map_read(n, off, len, ext);
}

/* Sets count entries from grain index g0 of table number gdi's tables
 * (main and redundant) to value, value + step, ...; then the cache. */
static int set_gtes(struct vmdk_extent *e, uint64_t g0, uint32_t count,
                    uint32_t value, uint32_t step)
{
    uint64_t gdi = g0 / e->gt_entries, gti = g0 % e->gt_entries;
    uint32_t *v = bi_xmalloc(count * 4);
    for (uint32_t i = 0; i < count; i++)
        v[i] = htole32(value + i * step);
    int ret = 0;
    for (int t = 0; t < 2 && ret == 0; t++) {
        uint32_t *dir = t ? e->rgd : e->gd;
        if (!dir || !dir[gdi])
            continue;
        ret = bi_co_pwrite(e->file, (uint64_t)dir[gdi] * VMDK_SECTOR + gti * 4,
                           v, count * 4, 0);
    }
    free(v);
    for (int i = 0; ret == 0 && i < VMDK_GT_CACHE; i++) {
        if (e->cache[i].gt && e->cache[i].sector == e->gd[gdi])
            for (uint32_t k = 0; k < count; k++)
                e->cache[i].gt[gti + k] = value + k * step;
    }
    return ret;
}

/* Records count grains from grain g0 at host sector value, table by
 * table, then flushes the file (QEMU: each grain's entries are on disk
 * before the write completes). */
static int commit_grains(struct vmdk_extent *e, uint64_t g0, uint64_t count,
                         uint32_t value, uint32_t step)
{
    int ret = 0;
    while (count && ret == 0) {
        uint64_t in_gt = e->gt_entries - g0 % e->gt_entries;
        uint32_t k = (uint32_t)BI_MIN(in_gt, count);
        ret = set_gtes(e, g0, k, value, step);
        g0 += k;
        count -= k;
        value += k * step;
    }
    return ret ? ret : bi_co_flush(e->file);
}

int vmdk_co_write_done(bi_node *n, struct bi_extent *ext, int ret)
{
    vmdk_state *s = n->opaque;
    struct alloc *a = ext->cookie;
    bi_co_mutex_lock(&s->lock);
    if (a && ret == 0) {
        uint32_t gs = (uint32_t)(a->e->grain / VMDK_SECTOR);
        a->e->file_size =
            BI_MAX(a->e->file_size, a->host + a->count * a->e->grain);
        ret = commit_grains(a->e, a->rel / a->e->grain, a->count,
                            (uint32_t)(a->host / VMDK_SECTOR), gs);
    }
    if (ret == 0 && !s->cid_updated) {
        ret = vmdk_update_cid(n);
        s->cid_updated = ret == 0;
    }
    bi_co_mutex_unlock(&s->lock);
    free(a);
    bi_free_aligned(ext->cow_head);
    bi_free_aligned(ext->cow_tail);
    ext->cookie = ext->cow_head = ext->cow_tail = NULL;
    return ret;
}

/* ------------------------------------------------------ zeroes, compress */

/* Whole grains of an extent with the zeroed-grain feature become GTE 1
 * (QEMU's efficient zero write); anything else: -ENOTSUP, the generic
 * layer writes zeroes. */
int vmdk_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    (void)flags;
    vmdk_state *s = n->opaque;
    struct vmdk_extent *e = vmdk_find_extent(s, off);
    if (!e || e->flat || !e->zero_grain || e->compressed ||
        (off - e->start) % e->grain || len % e->grain ||
        len > e->len - (off - e->start))
        return -ENOTSUP;
    uint64_t g0 = (off - e->start) / e->grain, count = len / e->grain;
    for (uint64_t g = g0; g < g0 + count; g++)
        if (!e->gd[g / e->gt_entries])
            return -ENOTSUP;
    bi_co_mutex_lock(&s->lock);
    int ret = commit_grains(e, g0, count, VMDK_GTE_ZEROED, 0);
    if (ret == 0 && !s->cid_updated) {
        ret = vmdk_update_cid(n);
        s->cid_updated = ret == 0;
    }
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* One grain compressed for the stream: its marker (guest sector, size)
 * and zlib stream, padded with zeroes to a sector. */
struct comp_grain {
    const uint8_t *src;
    uint64_t off; /* guest offset */
    uint64_t len; /* a grain, or the image's tail */
    uint8_t *out; /* bi_blockalign'd, 12 + compressBound(len) rounded */
    uint64_t used;
    int ret;
};

static void compress_grain(struct comp_grain *g)
{
    uLongf clen = compressBound((uLong)g->len);
    if (compress2(g->out + 12, &clen, g->src, (uLong)g->len,
                  Z_DEFAULT_COMPRESSION) != Z_OK) {
        g->ret = -EINVAL;
        return;
    }
    uint64_t lba = htole64(g->off / VMDK_SECTOR);
    uint32_t sz = htole32((uint32_t)clen);
    memcpy(g->out, &lba, 8);
    memcpy(g->out + 8, &sz, 4);
    g->used = 12 + clen;
    memset(g->out + g->used, 0, bi_align_up(g->used, VMDK_SECTOR) - g->used);
    g->ret = 0;
}

struct comp_job {
    struct comp_grain *g;
    size_t first, end;
};

static int compress_fn(void *arg)
{
    struct comp_job *j = arg;
    for (size_t i = j->first; i < j->end; i++)
        compress_grain(&j->g[i]);
    return 0;
}

enum { COMP_JOBS = 2 }; /* the machines blkimg runs on: a few cores */

/* Compresses grains g[0..n) on up to COMP_JOBS worker threads. */
static int compress_grains(struct comp_grain *g, size_t n)
{
    struct comp_job jobs[COMP_JOBS];
    void *args[COMP_JOBS];
    int nj = (int)BI_MIN((size_t)COMP_JOBS, n);
    for (int j = 0; j < nj; j++) {
        jobs[j] = (struct comp_job){g, n * j / nj, n * (j + 1) / nj};
        args[j] = &jobs[j];
    }
    return bi_run_in_threads(compress_fn, args, nj);
}

/* Appends the compressed grains g[0..n) of extent e at the end of its
 * file, back to back on sector boundaries, as ONE write (each grain's
 * buffer is padded with zeroes to its sector), then their table entries,
 * then one flush: every grain's entries are on disk before the request
 * completes, as QEMU's are. Under s->lock. */
static int append_grains(struct vmdk_extent *e, const struct comp_grain *g,
                         size_t n)
{
    uint64_t host0 = e->next_grain, host = host0, need = e->file_size;
    struct iovec stack[32];
    struct iovec *iov = n <= 32 ? stack : bi_xmalloc(n * sizeof(*iov));
    for (size_t i = 0; i < n; i++) {
        /* QEMU zero-fills each whole grain first: the file reaches its
         * end */
        need = BI_MAX(need, host + e->grain);
        iov[i] = (struct iovec){g[i].out, bi_align_up(g[i].used, VMDK_SECTOR)};
        host += iov[i].iov_len;
    }
    int ret = 0;
    if (need > e->file_size) {
        bi_error err;
        bi_error_init(&err);
        ret = e->file->drv->co_truncate(e->file, need, false, BI_PREALLOC_OFF,
                                        &err);
        if (ret == 0)
            e->file_size = need;
    }
    if (ret == 0)
        ret = bi_co_pwritev(e->file, host0, host - host0, iov, (int)n, 0);
    if (iov != stack)
        free(iov);
    if (ret < 0)
        return ret;
    /* an incompressible grain ends past host + grain: end_stream must
     * not cut it */
    e->file_size = BI_MAX(e->file_size, host);
    e->next_grain = host;
    host = host0;
    for (size_t i = 0; i < n && ret == 0; i++) {
        ret = set_gtes(e, (g[i].off - e->start) / e->grain, 1,
                       (uint32_t)(host / VMDK_SECTOR), 0);
        host += bi_align_up(g[i].used, VMDK_SECTOR);
    }
    return ret ? ret : bi_co_flush(e->file);
}

/* The end of a compressed stream: each compressed extent's file ends on
 * a sector boundary (QEMU's empty compressed write). */
static int end_stream(bi_node *n)
{
    vmdk_state *s = n->opaque;
    for (int i = 0; i < s->n_ext; i++) {
        struct vmdk_extent *e = &s->ext[i];
        if (!e->compressed)
            continue;
        bi_error err;
        bi_error_init(&err);
        int ret = e->file->drv->co_truncate(
            e->file, bi_align_up(e->file_size, VMDK_SECTOR), false,
            BI_PREALLOC_OFF, &err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* An ordinary write of [off, off + len) from buf, mapped and committed
 * here: the generic layer already serialises the range for the
 * compressed write that asked for it. */
static int plain_write(bi_node *n, uint64_t off, const uint8_t *buf,
                       uint64_t len)
{
    for (uint64_t done = 0; done < len;) {
        struct bi_extent ext;
        memset(&ext, 0, sizeof(ext));
        int ret = map_write(n, off + done, len - done, &ext);
        if (ret < 0)
            return ret;
        uint64_t l = BI_MIN(ext.len, len - done);
        struct iovec v[3];
        int c = 0;
        if (ext.cow_head_len)
            v[c++] = (struct iovec){ext.cow_head, ext.cow_head_len};
        v[c++] = (struct iovec){(void *)(buf + done), l};
        if (ext.cow_tail_len)
            v[c++] = (struct iovec){ext.cow_tail, ext.cow_tail_len};
        ret = bi_co_pwritev(ext.host, ext.host_offset - ext.cow_head_len,
                            ext.cow_head_len + l + ext.cow_tail_len, v, c, 0);
        ret = vmdk_co_write_done(n, &ext, ret);
        if (ret < 0)
            return ret;
        done += l;
    }
    return 0;
}

/* Waits for the turn of ticket t (see vmdk_state.comp_wait). */
static void comp_turn_wait(vmdk_state *s, uint64_t t)
{
    while (s->comp_turn != t)
        bi_co_queue_wait(&s->comp_wait);
}

static void comp_turn_pass(vmdk_state *s)
{
    s->comp_turn++;
    bi_co_queue_wake_all(&s->comp_wait);
}

/* The grains of [off, off + len) cut for compression: whole grains of
 * compressed extents, the last maybe the image's tail (checked again when
 * written); NULL with *ret set on a failure. */
static struct comp_grain *cut_grains(vmdk_state *s, uint64_t off,
                                     const uint8_t *buf, uint64_t len,
                                     size_t *n, int *ret)
{
    struct comp_grain *g = NULL;
    size_t cnt = 0;
    *ret = 0;
    for (uint64_t done = 0; done < len;) {
        struct vmdk_extent *e = vmdk_find_extent(s, off + done);
        if (!e || !e->compressed) {
            *ret = -EINVAL;
            break;
        }
        uint64_t l = BI_MIN(e->grain, len - done);
        struct comp_grain *ng = realloc(g, (cnt + 1) * sizeof(*g));
        uint8_t *out =
            ng ? bi_blockalign(
                     e->file,
                     bi_align_up(12 + compressBound((uLong)l), VMDK_SECTOR))
               : NULL;
        if (ng)
            g = ng;
        if (!out) {
            *ret = -ENOMEM;
            break;
        }
        g[cnt++] = (struct comp_grain){buf + done, off + done, l, out, 0, 0};
        done += l;
    }
    if (*ret < 0) {
        for (size_t i = 0; i < cnt; i++)
            bi_free_aligned(g[i].out);
        free(g);
        return NULL;
    }
    *n = cnt;
    return g;
}

/* Checks that compressed grain g can be written as QEMU checks it: a
 * whole grain (or the image's tail) not written before. Its extent in
 * *e; 0 or a negative errno. Under s->lock. */
static int check_grain(vmdk_state *s, const struct comp_grain *g,
                       struct vmdk_extent **e)
{
    struct run r;
    int ret = map_run(s, g->off, g->len, &r);
    if (ret < 0)
        return ret;
    *e = r.e;
    uint64_t rel = g->off - r.e->start;
    if (r.kind == RUN_COMPRESSED || r.kind == RUN_DATA)
        return -EIO; /* QEMU: no rewriting of an allocated grain */
    if (!r.e->compressed || !r.e->has_marker || rel % r.e->grain ||
        (g->len < r.e->grain && g->off + g->len != r.e->start + r.e->len))
        return -EINVAL;
    if (!r.e->gd[rel / r.e->grain / r.e->gt_entries])
        return -EIO;
    return g->ret;
}

/* Writes the compressed grains g[0..n) in order, each run of them in one
 * extent as one append: all are checked first, so a refused grain writes
 * nothing. Under s->lock. */
static int write_grains(vmdk_state *s, const struct comp_grain *g, size_t n)
{
    struct vmdk_extent *stack[32];
    struct vmdk_extent **e = n <= 32 ? stack : bi_xmalloc(n * sizeof(*e));
    int ret = 0;
    for (size_t i = 0; i < n && ret == 0; i++)
        ret = check_grain(s, &g[i], &e[i]);
    for (size_t i = 0, k; i < n && ret == 0; i += k) {
        for (k = 1; i + k < n && e[i + k] == e[i]; k++) {
        }
        ret = append_grains(e[i], &g[i], k);
    }
    if (e != stack)
        free(e);
    return ret;
}

/* Grains of compressed extents are compressed (whole grains, or the
 * image's tail, never twice) on worker threads, several requests at
 * once, and appended in the order of the requests; the other extents
 * take the data as an ordinary write, as QEMU's vmdk does. len 0 ends
 * the stream. */
int vmdk_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                              uint64_t len)
{
    vmdk_state *s = n->opaque;
    uint64_t t = s->comp_next++;
    int ret = 0;
    size_t cnt = 0;
    struct comp_grain *g = NULL;
    struct vmdk_extent *e = len ? vmdk_find_extent(s, off) : NULL;
    if (len && e && e->compressed) {
        g = cut_grains(s, off, buf, len, &cnt, &ret);
        if (g)
            ret = compress_grains(g, cnt);
    }
    comp_turn_wait(s, t);
    if (len == 0) {
        ret = end_stream(n);
    } else if (e && !e->compressed) {
        ret = plain_write(n, off, buf, BI_MIN(len, e->start + e->len - off));
    } else if (ret == 0) {
        bi_co_mutex_lock(&s->lock);
        ret = g ? write_grains(s, g, cnt) : -EINVAL;
        if (ret == 0 && !s->cid_updated) {
            ret = vmdk_update_cid(n);
            s->cid_updated = ret == 0;
        }
        bi_co_mutex_unlock(&s->lock);
    }
    comp_turn_pass(s);
    for (size_t i = 0; i < cnt; i++)
        bi_free_aligned(g[i].out);
    free(g);
    return ret;
}
