/* SPDX-License-Identifier: MIT */
/*
 * The generic request path: one path for every driver.
 *
 * Format nodes: the driver maps the guest range to extents; each extent is
 * one I/O on the host node (or zeroes, or the backing chain, or a
 * compressed cluster). Protocol nodes: requests are checked against the
 * node's limits; aligned requests from buffers that meet the minimum
 * memory alignment go to the driver as they are (split only above the max
 * transfer), anything else goes through a bounce buffer of the optimal
 * alignment, with read-modify-write of partial head and tail blocks.
 * Writes are tracked so that a read-modify-write never races an
 * overlapping write.
 */
#include "block/block.h"
#include "block/io_plan.h"
#include "crypto/crypto.h"
#include "io/aio.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define BOUNCE_CHUNK (1024 * 1024)
#define CRYPT_CHUNK (1024 * 1024)
#define IOV_STACK 64

/* ----------------------------------------------------- overlap tracking */

static bool overlaps(const struct bi_tracked_req *a, uint64_t start,
                     uint64_t end)
{
    return a->start < end && start < a->end;
}

/* Waits until no conflicting request overlaps [start, end), then tracks
 * req. Two requests conflict when either is serialising. */
static void track_begin(bi_node *n, struct bi_tracked_req *req, uint64_t start,
                        uint64_t end, bool serialising)
{
    req->start = start;
    req->end = end;
    req->serialising = serialising;
    bi_co_queue_init(&req->waiters);
retry:
    for (struct bi_tracked_req *o = LIST_FIRST(&n->tracked); o;
         o = LIST_NEXT(o, link)) {
        if (overlaps(o, start, end) && (o->serialising || serialising)) {
            n->stats.serialised_waits++;
            bi_co_queue_wait(&o->waiters);
            goto retry;
        }
    }
    LIST_INSERT_HEAD(&n->tracked, req, link);
}

static void track_end(struct bi_tracked_req *req)
{
    LIST_REMOVE(req, link);
    bi_co_queue_wake_all(&req->waiters);
}

/* Format nodes serialise every request that changes the mapping at the
 * driver's allocation unit (its geometry's cluster size), so overlapping
 * allocating writes, zero writes and discards of one cluster never race.
 * Returns whether req was tracked. */
static bool fmt_track_begin(bi_node *n, struct bi_tracked_req *req,
                            uint64_t off, uint64_t len)
{
    struct bi_geometry g;
    bi_node_geometry(n, &g);
    uint64_t gran = g.cluster_size;
    if (!gran)
        return false;
    track_begin(n, req, bi_align_down(off, gran), bi_align_up(off + len, gran),
                true);
    return true;
}

static void fmt_track_end(bool tracked, struct bi_tracked_req *req)
{
    if (tracked)
        track_end(req);
}

/* --------------------------------------------------------- iov slicing */

struct iov_slice {
    struct iovec stack[IOV_STACK];
    struct iovec *v;
    int cnt;
};

/* Builds [prefix] + iov[off, off+len) + [suffix]. */
static int slice_make(struct iov_slice *s, const struct iovec *iov, int iovcnt,
                      uint64_t off, uint64_t len, void *prefix,
                      uint64_t prefix_len, void *suffix, uint64_t suffix_len)
{
    int max = iovcnt + 2;
    s->v = max <= IOV_STACK ? s->stack : malloc(max * sizeof(*s->v));
    if (!s->v)
        return -ENOMEM;
    int c = 0;
    if (prefix_len)
        s->v[c++] = (struct iovec){prefix, prefix_len};
    int r = len ? bi_iov_slice(iov, iovcnt, off, len, s->v + c, max - c) : 0;
    if (r < 0)
        return r;
    c += r;
    if (suffix_len)
        s->v[c++] = (struct iovec){suffix, suffix_len};
    s->cnt = c;
    return 0;
}

static void slice_free(struct iov_slice *s)
{
    if (s->v != s->stack)
        free(s->v);
}

/* ----------------------------------------------------- protocol nodes */

static int proto_direct(bi_node *n, bool write, uint64_t off, uint64_t len,
                        const struct iovec *iov, int iovcnt, int flags)
{
    const struct bi_limits *l = &n->limits;
    uint64_t max = bi_max_chunk(l);
    if (len <= max && (uint32_t)iovcnt <= (l->max_iov ? l->max_iov : 1024)) {
        return write ? n->drv->co_pwritev(n, off, len, iov, iovcnt, flags)
                     : n->drv->co_preadv(n, off, len, iov, iovcnt);
    }
    /* Split above the max transfer (or too many iov entries). */
    uint64_t done = 0;
    while (done < len) {
        uint64_t chunk = BI_MIN(max, len - done);
        struct iov_slice s;
        int ret = slice_make(&s, iov, iovcnt, done, chunk, NULL, 0, NULL, 0);
        if (ret == 0 && l->max_iov && (uint32_t)s.cnt > l->max_iov) {
            /* Cut the chunk at the last iov boundary that fits. */
            uint64_t fit = 0;
            for (uint32_t i = 0; i < l->max_iov; i++)
                fit += s.v[i].iov_len;
            fit = bi_align_down(fit, l->request_alignment);
            if (fit == 0)
                ret = -EINVAL;
            chunk = fit;
            s.cnt = (int)l->max_iov;
            slice_free(&s);
            if (ret == 0)
                ret =
                    slice_make(&s, iov, iovcnt, done, chunk, NULL, 0, NULL, 0);
        }
        if (ret == 0)
            ret = write ? n->drv->co_pwritev(n, off + done, chunk, s.v, s.cnt,
                                             flags)
                        : n->drv->co_preadv(n, off + done, chunk, s.v, s.cnt);
        slice_free(&s);
        if (ret < 0)
            return ret;
        done += chunk;
    }
    return 0;
}

/* Reads or writes [off, off+len) of the caller's iov through an aligned
 * bounce buffer, chunk by chunk, with read-modify-write of partial blocks. */
static int proto_bounce(bi_node *n, bool write, uint64_t off, uint64_t len,
                        const struct iovec *iov, int iovcnt, int flags)
{
    const struct bi_limits *l = &n->limits;
    uint64_t align = l->request_alignment;
    uint64_t chunk_max = BI_MAX(bi_align_down(BOUNCE_CHUNK, align), align);
    uint64_t start = bi_align_down(off, align);
    uint64_t end = bi_align_up(off + len, align);
    uint64_t bufsz = BI_MIN(chunk_max, end - start);
    uint8_t *buf = bi_alloc_aligned(l->opt_mem_alignment, bufsz);
    if (!buf)
        return -ENOMEM;
    int ret = 0;
    uint64_t pos = start;
    while (pos < end) {
        uint64_t cl = BI_MIN(bufsz, end - pos);
        /* user bytes inside this chunk */
        uint64_t ustart = BI_MAX(pos, off), uend = BI_MIN(pos + cl, off + len);
        struct iovec biov = {buf, cl};
        if (!write) {
            ret = proto_direct(n, false, pos, cl, &biov, 1, 0);
            if (ret < 0)
                break;
            bi_iov_from_buf(iov, iovcnt, ustart - off, buf + (ustart - pos),
                            uend - ustart);
        } else {
            bool head = ustart > pos, tail = uend < pos + cl;
            if (head || tail) {
                n->stats.rmw_ops++;
                if (head) {
                    struct iovec h = {buf, align};
                    bi_debug_event_at(n, BI_DBG_PWRITEV_RMW_HEAD);
                    ret = proto_direct(n, false, pos, align, &h, 1, 0);
                    bi_debug_event_at(n, BI_DBG_PWRITEV_RMW_AFTER_HEAD);
                }
                if (ret == 0 && tail && (!head || cl > align)) {
                    struct iovec t = {buf + cl - align, align};
                    bi_debug_event_at(n, BI_DBG_PWRITEV_RMW_TAIL);
                    ret = proto_direct(n, false, pos + cl - align, align, &t, 1,
                                       0);
                    bi_debug_event_at(n, BI_DBG_PWRITEV_RMW_AFTER_TAIL);
                }
                if (ret < 0)
                    break;
            }
            bi_iov_to_buf(iov, iovcnt, ustart - off, buf + (ustart - pos),
                          uend - ustart);
            ret = proto_direct(n, true, pos, cl, &biov, 1, flags);
            if (ret < 0)
                break;
        }
        n->stats.bounced_bytes += uend - ustart;
        pos += cl;
    }
    bi_free_aligned(buf);
    return ret;
}

static int proto_rw(bi_node *n, bool write, uint64_t off, uint64_t len,
                    const struct iovec *iov, int iovcnt, int flags)
{
    const struct bi_limits *l = &n->limits;
    struct bi_rw_plan plan;
    bi_plan_rw(l, off, len, iov, iovcnt, &plan);
    if (!write) {
        return plan.bounce ? proto_bounce(n, false, off, len, iov, iovcnt, 0)
                           : proto_direct(n, false, off, len, iov, iovcnt, 0);
    }
    struct bi_tracked_req req;
    track_begin(n, &req, plan.start, plan.end, plan.rmw);
    int ret = plan.bounce ? proto_bounce(n, true, off, len, iov, iovcnt, flags)
                          : proto_direct(n, true, off, len, iov, iovcnt, flags);
    track_end(&req);
    return ret;
}

/* ------------------------------------------------------- format nodes */

/* ---- encrypted extents (bi_extent.crypt) ----
 * The bytes on the host are ciphertext in sectors of the cipher's sector
 * size. A request of whole sectors in buffers of whole sectors is read
 * into the caller's buffers and decrypted there, or encrypted from them
 * into a bounce buffer; any other is widened to whole sectors, which go
 * through a bounce buffer of the host's memory alignment. Either way the
 * host node then pads to its own request alignment as for any request,
 * and the caller's buffer is never encrypted in place. */

/* Reads len guest bytes of ext into the caller's own buffers and decrypts
 * them there, when the range is whole cipher sectors and each of its
 * buffers holds whole sectors (convert's and most callers' case): no
 * bounce buffer, no copy. 1 when the range does not qualify (nothing
 * read), else 0 or a negative errno. */
static int crypt_read_in_place(const struct bi_extent *ext, uint64_t len,
                               const struct iovec *iov, int iovcnt,
                               uint64_t iov_off)
{
    uint64_t ss = bi_crypt_sector_size(ext->crypt);
    struct iov_slice s;
    if (ext->crypt_offset % ss || len % ss)
        return 1;
    int ret = slice_make(&s, iov, iovcnt, iov_off, len, NULL, 0, NULL, 0);
    if (ret < 0)
        return ret;
    if (!bi_iov_aligned(s.v, s.cnt, 1, ss)) {
        slice_free(&s);
        return 1;
    }
    ret = bi_co_preadv(ext->host, ext->host_offset, len, s.v, s.cnt);
    uint64_t sector = ext->crypt_offset / ss;
    for (int i = 0; i < s.cnt && ret == 0; i++) {
        ret = bi_crypt_sectors(ext->crypt, false, sector, s.v[i].iov_base,
                               s.v[i].iov_len);
        sector += s.v[i].iov_len / ss;
    }
    slice_free(&s);
    return ret;
}

/* Reads len guest bytes of ext (from its mapped offset) into iov at
 * iov_off, decrypted. */
static int crypt_read(const struct bi_extent *ext, uint64_t len,
                      const struct iovec *iov, int iovcnt, uint64_t iov_off)
{
    int ret = crypt_read_in_place(ext, len, iov, iovcnt, iov_off);
    if (ret <= 0)
        return ret;
    ret = 0; /* partial sectors: through a bounce buffer */
    uint64_t ss = bi_crypt_sector_size(ext->crypt);
    uint64_t head = ext->crypt_offset % ss;
    uint64_t cpos = ext->crypt_offset - head, hpos = ext->host_offset - head;
    uint64_t end = bi_align_up(head + len, ss);
    uint64_t bufsz = BI_MIN(end, bi_align_down(CRYPT_CHUNK, ss));
    uint8_t *buf = bi_blockalign(ext->host, bufsz);

    assert(ext->host_offset >= head && ss > 0);
    if (!buf)
        return -ENOMEM;
    for (uint64_t done = 0; done < end && ret == 0;) {
        uint64_t cl = BI_MIN(bufsz, end - done);
        ret = bi_co_pread(ext->host, hpos + done, buf, cl);
        if (ret == 0)
            ret = bi_crypt_sectors(ext->crypt, false, (cpos + done) / ss, buf,
                                   cl);
        if (ret == 0) {
            uint64_t us = BI_MAX(done, head),
                     ue = BI_MIN(done + cl, head + len);
            bi_iov_from_buf(iov, iovcnt, iov_off + (us - head),
                            buf + (us - done), ue - us);
        }
        done += cl;
    }
    explicit_bzero(buf, bufsz);
    bi_free_aligned(buf);
    return ret;
}

/* The plaintext a write extent stores: cow head, l bytes of iov from
 * iov_off, cow tail; copies its bytes [from, from + n) to dst. */
static void crypt_plain(const struct bi_extent *ext, const struct iovec *iov,
                        int iovcnt, uint64_t iov_off, uint64_t l, uint64_t from,
                        uint64_t n, uint8_t *dst)
{
    uint64_t h = ext->cow_head_len, to = from + n;
    if (from < h) {
        uint64_t k = BI_MIN(h, to) - from;
        memcpy(dst, (uint8_t *)ext->cow_head + from, k);
        dst += k;
        from += k;
    }
    if (from < to && from < h + l) {
        uint64_t k = BI_MIN(h + l, to) - from;
        bi_iov_to_buf(iov, iovcnt, iov_off + (from - h), dst, k);
        dst += k;
        from += k;
    }
    if (from < to)
        memcpy(dst, (uint8_t *)ext->cow_tail + (from - h - l), to - from);
}

/* Reads and decrypts the one sector at buffer position pos (host hpos +
 * pos, cipher position cpos + pos) into buf + pos - done. */
static int crypt_read_sector(const struct bi_extent *ext, uint64_t ss,
                             uint64_t hpos, uint64_t cpos, uint64_t pos,
                             uint8_t *at)
{
    int ret = bi_co_pread(ext->host, hpos + pos, at, ss);
    return ret < 0
               ? ret
               : bi_crypt_sectors(ext->crypt, false, (cpos + pos) / ss, at, ss);
}

/* Encrypts n bytes of the plaintext v (each buffer whole sectors), from
 * its byte from (a sector boundary), into dst; sector is from's number. */
static int crypt_slice_to(bi_crypt *c, const struct iovec *v, int cnt,
                          uint64_t from, uint64_t n, uint64_t sector,
                          uint8_t *dst)
{
    uint64_t ss = bi_crypt_sector_size(c);
    for (int i = 0; i < cnt && n; i++) {
        uint64_t el = v[i].iov_len;
        if (from >= el) {
            from -= el;
            continue;
        }
        uint64_t k = BI_MIN(el - from, n);
        int ret = bi_crypt_encrypt_to(c, sector, dst,
                                      (const uint8_t *)v[i].iov_base + from, k);
        if (ret < 0)
            return ret;
        sector += k / ss;
        dst += k;
        n -= k;
        from = 0;
    }
    assert(n == 0);
    return 0;
}

/* Writes ext's plaintext (cow head + l bytes of iov + cow tail) to the
 * host, encrypted, when it is whole cipher sectors in buffers of whole
 * sectors (convert's and most callers' case): each chunk is encrypted
 * from those buffers straight into the bounce buffer, which never holds
 * plaintext. 1 when the write does not qualify (nothing written), else 0
 * or a negative errno. */
static int crypt_write_whole(const struct bi_extent *ext, uint64_t l,
                             const struct iovec *iov, int iovcnt,
                             uint64_t iov_off, int flags)
{
    uint64_t ss = bi_crypt_sector_size(ext->crypt);
    uint64_t total = ext->cow_head_len + l + ext->cow_tail_len;
    uint64_t c0 = ext->crypt_offset - ext->cow_head_len;
    uint64_t h0 = ext->host_offset - ext->cow_head_len;
    struct iov_slice s;
    if (c0 % ss || total % ss)
        return 1;
    int ret = slice_make(&s, iov, iovcnt, iov_off, l, ext->cow_head,
                         ext->cow_head_len, ext->cow_tail, ext->cow_tail_len);
    if (ret < 0)
        return ret;
    if (!bi_iov_aligned(s.v, s.cnt, 1, ss)) {
        slice_free(&s);
        return 1;
    }
    uint64_t bufsz = BI_MIN(total, bi_align_down(CRYPT_CHUNK, ss));
    uint8_t *buf = bi_blockalign(ext->host, bufsz);
    ret = buf ? 0 : -ENOMEM;
    for (uint64_t done = 0; done < total && ret == 0;) {
        uint64_t cl = BI_MIN(bufsz, total - done);
        ret = crypt_slice_to(ext->crypt, s.v, s.cnt, done, cl, (c0 + done) / ss,
                             buf);
        if (ret == 0)
            ret = bi_co_pwrite(ext->host, h0 + done, buf, cl,
                               flags | BI_REQ_NO_DETECT_ZEROES);
        done += cl;
    }
    bi_free_aligned(buf);
    slice_free(&s);
    return ret;
}

/* Writes ext's plaintext (cow head + l bytes of iov + cow tail) to the
 * host, encrypted; partial sectors at either end are read and merged
 * first (the caller serialises overlapping writes at sector
 * granularity). */
static int crypt_write(const struct bi_extent *ext, uint64_t l,
                       const struct iovec *iov, int iovcnt, uint64_t iov_off,
                       int flags)
{
    int whole = crypt_write_whole(ext, l, iov, iovcnt, iov_off, flags);
    if (whole <= 0)
        return whole;
    uint64_t ss = bi_crypt_sector_size(ext->crypt);
    uint64_t total = ext->cow_head_len + l + ext->cow_tail_len;
    uint64_t c0 = ext->crypt_offset - ext->cow_head_len;
    uint64_t h0 = ext->host_offset - ext->cow_head_len;
    uint64_t head = c0 % ss;
    uint64_t cpos = c0 - head, hpos = h0 - head;
    uint64_t end = bi_align_up(head + total, ss);
    bool tail_partial = (head + total) % ss != 0;
    uint64_t bufsz = BI_MIN(end, bi_align_down(CRYPT_CHUNK, ss));
    uint8_t *buf = bi_blockalign(ext->host, bufsz);
    int ret = 0;

    if (!buf)
        return -ENOMEM;
    for (uint64_t done = 0; done < end && ret == 0;) {
        uint64_t cl = BI_MIN(bufsz, end - done);
        if (done == 0 && head)
            ret = crypt_read_sector(ext, ss, hpos, cpos, 0, buf);
        if (ret == 0 && done + cl == end && tail_partial &&
            !(done == 0 && head && cl == ss))
            ret =
                crypt_read_sector(ext, ss, hpos, cpos, end - ss, buf + cl - ss);
        if (ret < 0)
            break;
        uint64_t us = BI_MAX(done, head), ue = BI_MIN(done + cl, head + total);
        crypt_plain(ext, iov, iovcnt, iov_off, l, us - head, ue - us,
                    buf + (us - done));
        ret = bi_crypt_sectors(ext->crypt, true, (cpos + done) / ss, buf, cl);
        if (ret == 0)
            ret = bi_co_pwrite(ext->host, hpos + done, buf, cl,
                               flags | BI_REQ_NO_DETECT_ZEROES);
        done += cl;
    }
    explicit_bzero(buf, bufsz);
    bi_free_aligned(buf);
    return ret;
}

static int read_unalloc(bi_node *n, uint64_t off, uint64_t len,
                        const struct iovec *iov, int iovcnt, uint64_t iov_off)
{
    uint64_t from_backing = 0;
    if (n->backing && off < n->backing->size)
        from_backing = BI_MIN(len, n->backing->size - off);
    if (from_backing) {
        struct iov_slice s;
        int ret = slice_make(&s, iov, iovcnt, iov_off, from_backing, NULL, 0,
                             NULL, 0);
        if (ret == 0)
            ret = bi_co_preadv(n->backing, off, from_backing, s.v, s.cnt);
        slice_free(&s);
        if (ret < 0)
            return ret;
    }
    if (from_backing < len)
        bi_iov_memset(iov, iovcnt, iov_off + from_backing, 0,
                      len - from_backing);
    return 0;
}

static int fmt_read(bi_node *n, uint64_t off, uint64_t len,
                    const struct iovec *iov, int iovcnt)
{
    uint64_t done = 0;
    while (done < len) {
        struct bi_extent ext;
        memset(&ext, 0, sizeof(ext));
        int ret = n->drv->co_map(n, off + done, len - done, BI_MAP_READ, &ext);
        if (ret < 0)
            return ret;
        if (ext.len == 0)
            return -EIO;
        uint64_t l = BI_MIN(ext.len, len - done);
        struct iov_slice s;
        switch (ext.kind) {
        case BI_EXT_DATA:
            if (ext.crypt) {
                ret = crypt_read(&ext, l, iov, iovcnt, done);
                break;
            }
            ret = slice_make(&s, iov, iovcnt, done, l, NULL, 0, NULL, 0);
            if (ret == 0)
                ret = bi_co_preadv(ext.host, ext.host_offset, l, s.v, s.cnt);
            slice_free(&s);
            break;
        case BI_EXT_ZERO:
            bi_iov_memset(iov, iovcnt, done, 0, l);
            break;
        case BI_EXT_UNALLOC:
            ret = read_unalloc(n, off + done, l, iov, iovcnt, done);
            break;
        case BI_EXT_COMPRESSED:
            ret = slice_make(&s, iov, iovcnt, done, l, NULL, 0, NULL, 0);
            if (ret == 0)
                ret = n->drv->co_read_compressed(n, &ext, off + done, l, s.v,
                                                 s.cnt);
            slice_free(&s);
            break;
        }
        if (ret < 0)
            return ret;
        done += l;
    }
    return 0;
}

/* A write to the first sector of an image whose format was guessed as raw
 * must not make it look like another format (CVE-2008-2004): the sector as
 * it would be after the write goes through every format's probe, without a
 * file name, as QEMU's raw driver does. Returns 0, -EPERM, or a read
 * error. */
static int check_probed_first_sector(bi_node *n, uint64_t off, uint64_t len,
                                     const struct iovec *iov, int iovcnt)
{
    enum { PROBE_BYTES = BI_PROBE_BYTES };
    if (!n->format_probed || off >= PROBE_BYTES)
        return 0;
    uint8_t sector[PROBE_BYTES];
    uint64_t have = BI_MIN((uint64_t)PROBE_BYTES, n->size);
    memset(sector, 0, sizeof(sector));
    if (off > 0 || off + len < have) {
        int ret = fmt_read(n, 0, have, &(struct iovec){sector, have}, 1);
        if (ret < 0)
            return ret;
    }
    uint64_t l = BI_MIN(len, PROBE_BYTES - off);
    bi_iov_to_buf(iov, iovcnt, 0, sector + off, l);
    const struct bi_driver *d = bi_probe_format(sector, PROBE_BYTES, NULL);
    return (d && d != n->drv) ? -EPERM : 0;
}

/* An encrypted write extent at guest offset goff: unless the format
 * serialises at its own granularity already (tracked), the write is
 * serialised with every other on the node that shares one of its cipher
 * sectors, so that read-modify-write of partial sectors loses nothing. */
static int fmt_crypt_write(bi_node *n, bool tracked,
                           const struct bi_extent *ext, uint64_t goff,
                           uint64_t l, const struct iovec *iov, int iovcnt,
                           uint64_t iov_off, int flags)
{
    struct bi_tracked_req req;
    uint64_t ss = bi_crypt_sector_size(ext->crypt);
    uint64_t c0 = ext->crypt_offset - ext->cow_head_len;
    uint64_t total = ext->cow_head_len + l + ext->cow_tail_len;
    uint64_t g0 = goff - ext->cow_head_len;
    uint64_t before = c0 % ss, after = bi_align_up(c0 + total, ss) - c0 - total;
    if (!tracked)
        track_begin(n, &req, g0 >= before ? g0 - before : 0, g0 + total + after,
                    true);
    int ret = crypt_write(ext, l, iov, iovcnt, iov_off, flags);
    if (!tracked)
        track_end(&req);
    return ret;
}

static int fmt_write(bi_node *n, uint64_t off, uint64_t len,
                     const struct iovec *iov, int iovcnt, int flags)
{
    int ret = check_probed_first_sector(n, off, len, iov, iovcnt);
    if (ret < 0)
        return ret;
    struct bi_tracked_req req;
    bool tracked = fmt_track_begin(n, &req, off, len);
    uint64_t done = 0;
    while (done < len) {
        struct bi_extent ext;
        memset(&ext, 0, sizeof(ext));
        ret = n->drv->co_map(n, off + done, len - done, BI_MAP_WRITE, &ext);
        if (ret < 0)
            break;
        if (ext.kind != BI_EXT_DATA || ext.len == 0 || !ext.host) {
            ret = -EIO;
            if (n->drv->co_write_done)
                n->drv->co_write_done(n, &ext, ret);
            break;
        }
        uint64_t l = BI_MIN(ext.len, len - done);
        if (ext.crypt) {
            ret = fmt_crypt_write(n, tracked, &ext, off + done, l, iov, iovcnt,
                                  done, flags);
        } else {
            struct iov_slice s;
            ret = slice_make(&s, iov, iovcnt, done, l, ext.cow_head,
                             ext.cow_head_len, ext.cow_tail, ext.cow_tail_len);
            if (ret == 0)
                ret = bi_co_pwritev(
                    ext.host, ext.host_offset - ext.cow_head_len,
                    ext.cow_head_len + l + ext.cow_tail_len, s.v, s.cnt, flags);
            slice_free(&s);
        }
        if (ret == 0 && ext.flush_before_done)
            ret = bi_co_flush(ext.host);
        if (n->drv->co_write_done) {
            int r2 = n->drv->co_write_done(n, &ext, ret);
            if (ret == 0)
                ret = r2;
        }
        if (ret < 0)
            break;
        done += l;
    }
    fmt_track_end(tracked, &req);
    return ret;
}

/* A format that takes compressed data only (bi_geometry's
 * compressed_writes_only): an ordinary write is a compressed one, which
 * the driver refuses unless it covers whole clusters, as QEMU's. */
static int compressed_only_write(bi_node *n, uint64_t off, uint64_t len,
                                 const struct iovec *iov, int iovcnt)
{
    void *buf = bi_blockalign(n, len);
    if (!buf)
        return -ENOMEM;
    bi_iov_to_buf(iov, iovcnt, 0, buf, len);
    int ret = bi_co_pwrite_compressed(n, off, buf, len);
    bi_free_aligned(buf);
    return ret;
}

/* ------------------------------------------------------------- entries */

static int check_request(bi_node *n, uint64_t off, uint64_t len)
{
    if (off > n->size || len > n->size - off)
        return -EIO;
    return 0;
}

int bi_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                 const struct iovec *iov, int iovcnt)
{
    if (len == 0)
        return 0;
    if (n->drv->is_protocol) {
        /* Protocol nodes may be read past their end (zeroes); formats
         * check bounds themselves through their own size. */
        return proto_rw(n, false, off, len, iov, iovcnt, 0);
    }
    int ret = check_request(n, off, len);
    if (ret < 0)
        return ret;
    return fmt_read(n, off, len, iov, iovcnt);
}

/* Whether every byte of iov (iovcnt entries) is zero. */
static bool iov_is_zero(const struct iovec *iov, int iovcnt)
{
    for (int i = 0; i < iovcnt; i++)
        if (!bi_buf_is_zero(iov[i].iov_base, iov[i].iov_len))
            return false;
    return true;
}

int bi_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                  const struct iovec *iov, int iovcnt, int flags)
{
    if (n->read_only)
        return -EPERM;
    if (len == 0)
        return 0;
    /* detect-zeroes, as QEMU's bdrv_aligned_pwritev (FUA kept); not for
     * the zero buffers a zero write falls back on */
    bool detect = !(flags & BI_REQ_NO_DETECT_ZEROES);
    flags &= ~BI_REQ_NO_DETECT_ZEROES;
    if (detect && n->detect_zeroes != BI_DETECT_ZEROES_OFF &&
        iov_is_zero(iov, iovcnt))
        return bi_co_pwrite_zeroes(
            n, off, len,
            (flags & BI_REQ_FUA) |
                (n->detect_zeroes == BI_DETECT_ZEROES_UNMAP ? BI_REQ_MAY_UNMAP
                                                            : 0));
    int ret = 0;
    if (!n->drv->is_protocol)
        ret = check_request(n, off, len);
    if (ret < 0)
        return ret;
    /* QEMU's bdrv_aligned_pwritev raises these on the node written */
    n->write_gen++;
    bi_debug_event_at(n, BI_DBG_PWRITEV);
    if (n->drv->is_protocol) {
        ret = proto_rw(n, true, off, len, iov, iovcnt, flags);
    } else {
        struct bi_geometry g;
        bi_node_geometry(n, &g);
        ret = g.compressed_writes_only
                  ? compressed_only_write(n, off, len, iov, iovcnt)
                  : fmt_write(n, off, len, iov, iovcnt, flags);
    }
    bi_debug_event_at(n, BI_DBG_PWRITEV_DONE);
    return ret;
}

int bi_co_pread(bi_node *n, uint64_t off, void *buf, uint64_t len)
{
    struct iovec v = {buf, len};
    return bi_co_preadv(n, off, len, &v, 1);
}

int bi_co_pwrite(bi_node *n, uint64_t off, const void *buf, uint64_t len,
                 int flags)
{
    struct iovec v = {(void *)buf, len};
    return bi_co_pwritev(n, off, len, &v, 1, flags);
}

/* Writes zeroes from a zeroed buffer, chunk by chunk. */
static int write_zero_buffers(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    uint64_t bufsz = BI_MIN(len, (uint64_t)BOUNCE_CHUNK);
    size_t align = n->limits.opt_mem_alignment ? n->limits.opt_mem_alignment
                                               : bi_page_size();
    void *buf = bi_alloc_aligned(align, bufsz);
    if (!buf)
        return -ENOMEM;
    memset(buf, 0, bufsz);
    int ret = 0;
    for (uint64_t done = 0; done < len && ret == 0;) {
        uint64_t l = BI_MIN(bufsz, len - done);
        ret = bi_co_pwrite(n, off + done, buf, l,
                           (flags & ~(BI_REQ_MAY_UNMAP | BI_REQ_NO_FALLBACK)) |
                               BI_REQ_NO_DETECT_ZEROES);
        done += l;
    }
    bi_free_aligned(buf);
    return ret;
}

static int co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags);

int bi_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    if (n->read_only)
        return -EPERM;
    if (len == 0)
        return 0;
    n->write_gen++;
    bi_debug_event_at(n, BI_DBG_PWRITEV_ZERO);
    int ret = co_pwrite_zeroes(n, off, len, flags);
    bi_debug_event_at(n, BI_DBG_PWRITEV_DONE);
    return ret;
}

/* bi_co_pwrite_zeroes once the events are raised. */
static int co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    if (!n->drv->is_protocol) {
        int ret = check_request(n, off, len);
        if (ret < 0)
            return ret;
        if (n->drv->co_pwrite_zeroes) {
            struct bi_tracked_req req;
            bool tracked = fmt_track_begin(n, &req, off, len);
            ret = n->drv->co_pwrite_zeroes(n, off, len, flags);
            fmt_track_end(tracked, &req);
            if (ret != -ENOTSUP)
                return ret;
        }
        if (flags & BI_REQ_NO_FALLBACK)
            return -ENOTSUP;
        return write_zero_buffers(n, off, len, flags);
    }
    /* Protocol: the aligned middle through the driver, partial blocks as
     * ordinary (read-modify-write) writes of zeroes. */
    uint64_t align = n->limits.request_alignment;
    uint64_t a = bi_align_up(off, align), b = bi_align_down(off + len, align);
    int ret = 0;
    if (a >= b)
        return (flags & BI_REQ_NO_FALLBACK)
                   ? -ENOTSUP
                   : write_zero_buffers(n, off, len, flags);
    if (a > off && !(flags & BI_REQ_NO_FALLBACK))
        ret = write_zero_buffers(n, off, a - off, flags);
    if (ret == 0) {
        struct bi_tracked_req req;
        track_begin(n, &req, a, b, false);
        ret = n->drv->co_pwrite_zeroes
                  ? n->drv->co_pwrite_zeroes(n, a, b - a, flags)
                  : -ENOTSUP;
        track_end(&req);
        if (ret == -ENOTSUP && !(flags & BI_REQ_NO_FALLBACK))
            ret = write_zero_buffers(n, a, b - a, flags);
    }
    if (ret == 0 && b < off + len && !(flags & BI_REQ_NO_FALLBACK))
        ret = write_zero_buffers(n, b, off + len - b, flags);
    if (ret == 0 && (flags & BI_REQ_NO_FALLBACK) && (a > off || b < off + len))
        ret = -ENOTSUP;
    return ret;
}

int bi_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    if (n->read_only)
        return -EPERM;
    if (len == 0 || !n->drv->co_pdiscard)
        return 0;
    n->write_gen++;
    if (!n->drv->is_protocol) {
        int ret = check_request(n, off, len);
        if (ret < 0)
            return ret;
        struct bi_tracked_req req;
        bool tracked = fmt_track_begin(n, &req, off, len);
        ret = n->drv->co_pdiscard(n, off, len);
        fmt_track_end(tracked, &req);
        return ret;
    }
    /* Discard is advisory, but everything is passed down (a file punches
     * exactly the bytes asked, as under QEMU), fragmented at the request
     * alignment so that storage refusing partial blocks still gets the
     * aligned middle. */
    uint64_t align = n->limits.request_alignment;
    uint64_t a = BI_MIN(bi_align_up(off, align), off + len);
    uint64_t b = BI_MAX(bi_align_down(off + len, align), a);
    uint64_t cut[4] = {off, a, b, off + len};
    struct bi_tracked_req req;
    track_begin(n, &req, bi_align_down(off, align),
                bi_align_up(off + len, align), false);
    int ret = 0;
    for (int i = 0; i < 3 && ret == 0; i++) {
        if (cut[i + 1] <= cut[i])
            continue;
        int r = n->drv->co_pdiscard(n, cut[i], cut[i + 1] - cut[i]);
        bool partial = i != 1;
        if (r < 0 && r != -ENOTSUP && !(partial && r == -EINVAL))
            ret = r;
    }
    track_end(&req);
    return ret;
}

int bi_co_flush(bi_node *n)
{
    int ret = 0;
    bi_node *child = n->file != n ? n->file : NULL;
    if (n->cache == BI_CACHE_UNSAFE)
        return 0;
    /* raised on the primary child, as QEMU's bdrv_co_flush does */
    uint64_t gen = n->write_gen;
    bi_debug_event_at(child, BI_DBG_FLUSH_TO_OS);
    if (n->drv->co_flush)
        ret = n->drv->co_flush(n);
    if (gen != n->flushed_gen)
        bi_debug_event_at(child, BI_DBG_FLUSH_TO_DISK);
    if (ret == 0 && child)
        ret = bi_co_flush(child);
    if (ret == 0)
        n->flushed_gen = gen;
    return ret;
}

int bi_co_copy_range(bi_node *src, uint64_t off, bi_node *dst, uint64_t dst_off,
                     uint64_t len)
{
    if (dst->read_only)
        return -EPERM;
    if (!src->drv->is_protocol || src->drv != dst->drv ||
        !src->drv->co_copy_range)
        return -ENOTSUP;
    struct bi_tracked_req req;
    track_begin(dst, &req, dst_off, dst_off + len, false);
    int ret = src->drv->co_copy_range(src, off, dst, dst_off, len);
    track_end(&req);
    return ret;
}

int bi_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                            uint64_t len)
{
    if (n->read_only)
        return -EPERM;
    if (!n->drv->co_pwrite_compressed)
        return -ENOTSUP;
    int ret = check_request(n, off, len);
    if (ret < 0)
        return ret;
    struct bi_tracked_req req;
    bool tracked = fmt_track_begin(n, &req, off, len);
    ret = n->drv->co_pwrite_compressed(n, off, buf, len);
    fmt_track_end(tracked, &req);
    return ret;
}

/* The VM state area (QEMU's bdrv_save_vmstate / bdrv_load_vmstate): the
 * bytes a format keeps past the guest disk, at the offset its geometry
 * names (qcow2: after the last L1 entry the disk needs), read and written
 * through the format's own map like guest data but beyond its size.
 * -ENOTSUP for a node without VM state. */
static int co_vmstate_rw(bi_node *n, uint64_t pos, uint64_t len,
                         const struct iovec *iov, int iovcnt, bool write)
{
    struct bi_geometry g;
    bi_node_geometry(n, &g);
    if (n->drv->is_protocol || !g.vm_state_offset)
        return -ENOTSUP;
    if (pos > INT64_MAX - g.vm_state_offset ||
        len > INT64_MAX - g.vm_state_offset - pos)
        return -EIO; /* as QEMU's request checks */
    if (len == 0)
        return 0;
    if (!write)
        return fmt_read(n, g.vm_state_offset + pos, len, iov, iovcnt);
    if (n->read_only)
        return -EPERM;
    n->write_gen++;
    return fmt_write(n, g.vm_state_offset + pos, len, iov, iovcnt, 0);
}

/* ------------------------------------------------- synchronous public API */

struct sync_rw {
    bi_node *n;
    uint64_t off, len;
    const struct iovec *iov;
    int iovcnt;
    int flags;
    int op;
};

enum {
    OP_READ,
    OP_WRITE,
    OP_ZERO,
    OP_DISCARD,
    OP_FLUSH,
    OP_VMS_READ,
    OP_VMS_WRITE
};

static int sync_rw_fn(void *opaque)
{
    struct sync_rw *r = opaque;
    switch (r->op) {
    case OP_READ:
        return bi_co_preadv(r->n, r->off, r->len, r->iov, r->iovcnt);
    case OP_WRITE:
        return bi_co_pwritev(r->n, r->off, r->len, r->iov, r->iovcnt, r->flags);
    case OP_ZERO:
        return bi_co_pwrite_zeroes(r->n, r->off, r->len, r->flags);
    case OP_DISCARD:
        return bi_co_pdiscard(r->n, r->off, r->len);
    case OP_VMS_READ:
    case OP_VMS_WRITE:
        return co_vmstate_rw(r->n, r->off, r->len, r->iov, r->iovcnt,
                             r->op == OP_VMS_WRITE);
    default:
        return bi_co_flush(r->n);
    }
}

int bi_preadv(bi_node *n, uint64_t off, const struct iovec *iov, int iovcnt)
{
    struct sync_rw r = {n, off,    bi_iov_size(iov, iovcnt), iov, iovcnt,
                        0, OP_READ};
    return bi_run_co(sync_rw_fn, &r);
}

int bi_pwritev(bi_node *n, uint64_t off, const struct iovec *iov, int iovcnt,
               int flags)
{
    struct sync_rw r = {n,     off,     bi_iov_size(iov, iovcnt), iov, iovcnt,
                        flags, OP_WRITE};
    return bi_run_co(sync_rw_fn, &r);
}

int bi_vmstate_pread(bi_node *n, uint64_t pos, void *buf, size_t len)
{
    struct iovec v = {buf, len};
    struct sync_rw r = {n, pos, len, &v, 1, 0, OP_VMS_READ};
    return bi_run_co(sync_rw_fn, &r);
}

int bi_vmstate_pwrite(bi_node *n, uint64_t pos, const void *buf, size_t len)
{
    struct iovec v = {(void *)buf, len};
    struct sync_rw r = {n, pos, len, &v, 1, 0, OP_VMS_WRITE};
    return bi_run_co(sync_rw_fn, &r);
}

int bi_pread(bi_node *n, uint64_t off, void *buf, size_t len)
{
    struct iovec v = {buf, len};
    return bi_preadv(n, off, &v, 1);
}

int bi_pwrite(bi_node *n, uint64_t off, const void *buf, size_t len, int flags)
{
    struct iovec v = {(void *)buf, len};
    return bi_pwritev(n, off, &v, 1, flags);
}

int bi_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags)
{
    struct sync_rw r = {n, off, len, NULL, 0, flags, OP_ZERO};
    return bi_run_co(sync_rw_fn, &r);
}

int bi_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    struct sync_rw r = {n, off, len, NULL, 0, 0, OP_DISCARD};
    return bi_run_co(sync_rw_fn, &r);
}

int bi_flush(bi_node *n)
{
    struct sync_rw r = {n, 0, 0, NULL, 0, 0, OP_FLUSH};
    return bi_run_co(sync_rw_fn, &r);
}

struct compressed_args {
    bi_node *n;
    uint64_t off, len;
    const uint8_t *buf;
};

static int compressed_fn(void *opaque)
{
    struct compressed_args *a = opaque;
    struct bi_geometry g;
    bi_node_geometry(a->n, &g);
    uint64_t gran = g.cluster_size;
    if (!gran || !a->n->drv->co_pwrite_compressed)
        return -ENOTSUP;
    if (!bi_is_aligned(a->off, gran))
        return -EINVAL;
    /* the driver takes any number of clusters (compressed at once) */
    return a->len ? bi_co_pwrite_compressed(a->n, a->off, a->buf, a->len) : 0;
}

int bi_pwrite_compressed(bi_node *n, uint64_t off, const void *buf, size_t len)
{
    struct compressed_args a = {n, off, len, buf};
    return bi_run_co(compressed_fn, &a);
}

/* ------------------------------------------------------------ async API */

struct aio_req {
    struct sync_rw rw;
    bi_aio_cb *cb;
    void *opaque;
};

static void aio_entry(void *opaque)
{
    struct aio_req *a = opaque;
    int ret = sync_rw_fn(&a->rw);
    bi_aio_cb *cb = a->cb;
    void *cb_opaque = a->opaque;
    free(a);
    bi_loop_request_done();
    if (cb)
        cb(cb_opaque, ret);
}

static void aio_submit(bi_node *n, int op, uint64_t off, uint64_t len,
                       const struct iovec *iov, int iovcnt, int flags,
                       bi_aio_cb *cb, void *opaque)
{
    struct aio_req *a = bi_xmalloc(sizeof(*a));
    a->rw = (struct sync_rw){n, off, len, iov, iovcnt, flags, op};
    a->cb = cb;
    a->opaque = opaque;
    bi_loop_request_started();
    bi_co_enter(bi_co_create(aio_entry, a));
}

void bi_aio_preadv(bi_node *n, uint64_t off, const struct iovec *iov,
                   int iovcnt, bi_aio_cb *cb, void *opaque)
{
    aio_submit(n, OP_READ, off, bi_iov_size(iov, iovcnt), iov, iovcnt, 0, cb,
               opaque);
}

void bi_aio_pwritev(bi_node *n, uint64_t off, const struct iovec *iov,
                    int iovcnt, int flags, bi_aio_cb *cb, void *opaque)
{
    aio_submit(n, OP_WRITE, off, bi_iov_size(iov, iovcnt), iov, iovcnt, flags,
               cb, opaque);
}

void bi_aio_flush(bi_node *n, bi_aio_cb *cb, void *opaque)
{
    aio_submit(n, OP_FLUSH, 0, 0, NULL, 0, 0, cb, opaque);
}

void bi_aio_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags,
                          bi_aio_cb *cb, void *opaque)
{
    aio_submit(n, OP_ZERO, off, len, NULL, 0, flags, cb, opaque);
}

void bi_aio_pdiscard(bi_node *n, uint64_t off, uint64_t len, bi_aio_cb *cb,
                     void *opaque)
{
    aio_submit(n, OP_DISCARD, off, len, NULL, 0, 0, cb, opaque);
}
