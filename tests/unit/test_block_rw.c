/* SPDX-License-Identifier: MIT */
/*
 * The generic request path on a real file, with and without O_DIRECT and
 * with both engines: byte-granular I/O at odd offsets from odd buffers, and
 * many concurrent unaligned writes that share sectors, checked against a
 * model (no lost update).
 */
#include "blkimg/blkimg.h"
#include "tap.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIZE (1024 * 1024)
#define NREQ 200

static uint8_t model[SIZE];
static uint8_t got[SIZE];

struct wreq {
    uint64_t off, len;
    uint8_t *buf;
    struct iovec iov;
    int ret;
    bool done;
};

static void wdone(void *opaque, int ret)
{
    struct wreq *w = opaque;
    w->ret = ret;
    w->done = true;
}

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) & 0xffffff;
}

static bi_node *open_img(const char *path, enum bi_cache cache)
{
    struct bi_open_opts o;
    bi_open_opts_init(&o);
    o.format = "raw";
    o.cache = cache;
    o.read_write = true;
    bi_error err;
    bi_error_init(&err);
    bi_node *n = bi_open(path, &o, &err);
    if (!n)
        printf("# open: %s\n", err.msg);
    return n;
}

static void run(const char *path, enum bi_cache cache, const char *what)
{
    unsigned seed = 42;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, SIZE) < 0)
        tap_bail("cannot create %s", path);
    close(fd);
    memset(model, 0, sizeof(model));

    bi_node *n = open_img(path, cache);
    if (!ok(n != NULL, "%s: open", what))
        return;

    /* Byte-granular synchronous writes at odd offsets, odd buffers. */
    bool all_ok = true;
    uint8_t *raw = malloc(70000);
    for (int i = 0; i < 100; i++) {
        uint64_t off = rnd(&seed) % (SIZE - 66000);
        uint64_t len = 1 + rnd(&seed) % 65536;
        uint8_t *buf = raw + 1 + (rnd(&seed) % 3);
        memset(buf, 1 + i, len);
        if (bi_pwrite(n, off, buf, len, 0) < 0)
            all_ok = false;
        memset(model + off, 1 + i, len);
    }
    ok(all_ok, "%s: 100 byte-granular writes", what);
    memset(got, 0xee, sizeof(got));
    ok(bi_pread(n, 3, got + 3, SIZE - 3) == 0, "%s: read back", what);
    ok(memcmp(got + 3, model + 3, SIZE - 3) == 0, "%s: bytes equal the model",
       what);
    free(raw);

    /* Concurrent unaligned writes to disjoint bytes in shared sectors. */
    struct wreq *w = calloc(NREQ, sizeof(*w));
    uint64_t pos = 4096 * 7 + 1;
    for (int i = 0; i < NREQ; i++) {
        w[i].off = pos;
        w[i].len = 1 + rnd(&seed) % 300;
        pos += w[i].len;
        w[i].buf = malloc(w[i].len + 1);
        memset(w[i].buf + 1, 0x80 + (i % 100), w[i].len);
        w[i].iov = (struct iovec){w[i].buf + 1, w[i].len};
        memset(model + w[i].off, 0x80 + (i % 100), w[i].len);
    }
    for (int i = 0; i < NREQ; i++)
        bi_aio_pwritev(n, w[i].off, &w[i].iov, 1, 0, wdone, &w[i]);
    bi_aio_drain();
    int failed = 0, undone = 0;
    for (int i = 0; i < NREQ; i++) {
        failed += w[i].ret < 0;
        undone += !w[i].done;
        free(w[i].buf);
    }
    is_int(undone, 0, "%s: all concurrent writes completed", what);
    is_int(failed, 0, "%s: no concurrent write failed", what);
    ok(bi_pread(n, 0, got, SIZE) == 0, "%s: read back", what);
    ok(memcmp(got, model, SIZE) == 0,
       "%s: no lost update among %d writes sharing sectors", what, NREQ);

    /* Overlapping concurrent writes: every byte holds one of its writers'
     * values, never what was there before. */
    uint64_t base = 512 * 1024 + 77;
    memset(model + base, 0, 8192);
    ok(bi_pwrite(n, base, model + base, 8192, 0) == 0, "%s: clear", what);
    for (int i = 0; i < 64; i++) {
        w[i].off = base + rnd(&seed) % 4096;
        w[i].len = 1 + rnd(&seed) % 4096;
        w[i].buf = malloc(w[i].len);
        memset(w[i].buf, 1 + i, w[i].len);
        w[i].iov = (struct iovec){w[i].buf, w[i].len};
        w[i].done = false;
    }
    for (int i = 0; i < 64; i++)
        bi_aio_pwritev(n, w[i].off, &w[i].iov, 1, 0, wdone, &w[i]);
    bi_aio_drain();
    ok(bi_pread(n, base, got, 8192) == 0, "%s: read back overlap", what);
    int bad = 0;
    for (uint64_t b = 0; b < 8192; b++) {
        uint64_t at = base + b;
        bool covered = false, match = false;
        for (int i = 0; i < 64; i++) {
            if (at >= w[i].off && at < w[i].off + w[i].len) {
                covered = true;
                match |= got[b] == (uint8_t)(1 + i);
            }
        }
        if (covered ? !match : got[b] != 0)
            bad++;
    }
    for (int i = 0; i < 64; i++)
        free(w[i].buf);
    free(w);
    is_int(bad, 0, "%s: overlapping writes: each byte from one writer", what);

    struct bi_stats st;
    bi_node_stats(bi_node_file(n), &st);
    if (cache == BI_CACHE_NONE)
        ok(st.rmw_ops > 0, "%s: unaligned writes counted as RMW", what);
    else
        is_uint(st.rmw_ops, 0, "%s: buffered I/O needs no RMW", what);
    bi_error err;
    bi_error_init(&err);
    ok(bi_close(n, &err) == 0, "%s: close", what);
}

int main(void)
{
    char path[] = "/var/tmp/blkimg-rw-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        tap_bail("mkstemp");
    close(fd);
    run(path, BI_CACHE_WRITEBACK, "writeback, default engine");
    run(path, BI_CACHE_NONE, "none, default engine");
    bi_error err;
    bi_error_init(&err);
    if (ok(bi_aio_select(BI_AIO_THREADS, &err) == 0, "select threads")) {
        run(path, BI_CACHE_NONE, "none, threads");
        run(path, BI_CACHE_WRITEBACK, "writeback, threads");
    }
    unlink(path);
    return tap_done();
}
