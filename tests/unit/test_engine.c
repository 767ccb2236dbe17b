/* SPDX-License-Identifier: MIT */
/*
 * Both I/O engines through their ops table: many writes in flight, read
 * back and compare (buffered and O_DIRECT files in /tmp), fsync,
 * fallocate, work items, errors, callbacks chaining new I/O, and that every
 * callback runs in the polling thread.
 */
#include "io/engine.h"
#include "tap.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/audit.h>
#include <linux/falloc.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define NREQ 600 /* more than the ring depth: exercises a full SQ */
#define DEPTH 32

static pthread_t main_thread;
static int cb_wrong_thread;
static int cb_calls;

struct req {
    struct bi_io io;
    struct iovec iov[3];
    int done;
};

static void req_cb(struct bi_io *io)
{
    struct req *r = io->opaque;

    if (!pthread_equal(pthread_self(), main_thread)) {
        cb_wrong_thread++;
    }
    cb_calls++;
    r->done++;
}

/* Polls until every request in flight has completed. */
static bool drain(struct bi_engine *e)
{
    int guard = 0;

    while (e->in_flight > 0) {
        int n = e->ops->poll(e, 1);

        if (n < 0 || ++guard > 1000000) {
            return false;
        }
    }
    return true;
}

static unsigned char pattern_byte(uint64_t off, unsigned seed)
{
    uint64_t x = (off / 8 + 1) * 0x9E3779B97F4A7C15ULL + seed;

    return (unsigned char)(x >> ((off % 8) * 8));
}

/* Block i: its size (multiple of unit) and offset. Sizes vary so requests
 * have different lengths and iovec counts. */
static size_t block_len(int i, size_t unit)
{
    static const int mult[] = {1, 2, 8, 3, 16, 1, 4};

    return unit * (size_t)mult[i % 7];
}

static void run(const struct bi_engine_ops *ops, bool direct)
{
    const char *mode = direct ? "O_DIRECT" : "buffered";
    /* The smallest unit the storage takes: 512 where O_DIRECT allows it
     * (the test disk has 512-byte sectors), else 4096. Lengths and offsets
     * are multiples of it, buffers page-aligned. */
    size_t unit = 512;
    size_t page = bi_page_size();
    char path[] = "/tmp/blkimg-engine-XXXXXX";
    struct bi_engine e = {.ops = ops};
    struct req *reqs = calloc(NREQ, sizeof(*reqs));
    uint64_t *offs = calloc(NREQ, sizeof(*offs));
    unsigned char **bufs = calloc(NREQ, sizeof(*bufs));
    uint64_t total = 0;
    int fd, r;

    int tmp = mkstemp(path);
    if (tmp < 0) {
        tap_bail("mkstemp: %s", strerror(errno));
    }
    close(tmp);
    fd = open(path, O_RDWR | (direct ? O_DIRECT : 0));
    if (fd < 0) {
        tap_bail("open %s (%s): %s", path, mode, strerror(errno));
    }
    if (direct) {
        void *probe = bi_alloc_aligned(page, page);
        memset(probe, 0, page);
        if (pwrite(fd, probe, 512, 512) != 512) {
            unit = 4096;
        }
        bi_free_aligned(probe);
        printf("# O_DIRECT unit in /tmp: %zu\n", unit);
    }
    r = ops->init(&e, DEPTH);
    if (!ok(r == 0, "%s/%s: init", ops->name, mode)) {
        printf("#   init: %s\n", strerror(-r));
        unlink(path);
        return;
    }
    is_int(ops->poll(&e, 1), 0, "%s/%s: poll with nothing in flight", ops->name,
           mode);

    /* ---- writes: everything submitted at once ---- */
    for (int i = 0; i < NREQ; i++) {
        size_t len = block_len(i, unit);

        offs[i] = total;
        total += len;
        bufs[i] = bi_alloc_aligned(page, len);
        for (size_t k = 0; k < len; k++) {
            bufs[i][k] = pattern_byte(offs[i] + k, 1);
        }
    }
    cb_calls = 0;
    for (int i = 0; i < NREQ; i++) {
        struct req *q = &reqs[i];
        size_t len = block_len(i, unit);

        /* Every third request is split over up to three iovecs. */
        if (i % 3 == 0 && len >= 3 * unit) {
            size_t a = unit, b = len - 2 * unit;
            q->iov[0] = (struct iovec){bufs[i], a};
            q->iov[1] = (struct iovec){bufs[i] + a, b};
            q->iov[2] = (struct iovec){bufs[i] + a + b, unit};
            q->io.iovcnt = 3;
        } else {
            q->iov[0] = (struct iovec){bufs[i], len};
            q->io.iovcnt = 1;
        }
        q->io.op = BI_IO_WRITE;
        q->io.fd = fd;
        q->io.iov = q->iov;
        q->io.offset = offs[i];
        q->io.cb = req_cb;
        q->io.opaque = q;
        q->io.ret = -12345;
        ops->submit(&e, &q->io);
    }
    is_int(e.in_flight, NREQ, "%s/%s: in_flight counts submissions", ops->name,
           mode);
    ok(drain(&e), "%s/%s: writes drain", ops->name, mode);
    is_int(cb_calls, NREQ, "%s/%s: one callback per write", ops->name, mode);
    int bad = 0;
    for (int i = 0; i < NREQ; i++) {
        if (reqs[i].done != 1 ||
            reqs[i].io.ret != (int64_t)block_len(i, unit)) {
            bad++;
        }
    }
    is_int(bad, 0, "%s/%s: every write complete and full length", ops->name,
           mode);
    is_int(e.in_flight, 0, "%s/%s: in_flight back to 0", ops->name, mode);

    /* ---- fsync ---- */
    struct req fs = {0};
    fs.io = (struct bi_io){
        .op = BI_IO_FSYNC, .fd = fd, .cb = req_cb, .opaque = &fs, .ret = -1};
    ops->submit(&e, &fs.io);
    ok(drain(&e) && fs.done == 1 && fs.io.ret == 0, "%s/%s: fdatasync",
       ops->name, mode);

    /* The file holds what was written (checked without the engine). */
    unsigned char *chk = bi_alloc_aligned(page, total);
    ssize_t got = pread(fd, chk, total, 0);
    bad = 0;
    for (uint64_t k = 0; got == (ssize_t)total && k < total; k++) {
        if (chk[k] != pattern_byte(k, 1)) {
            bad++;
        }
    }
    ok(got == (ssize_t)total && bad == 0, "%s/%s: file content after writes",
       ops->name, mode);

    /* ---- reads: everything in flight, into fresh buffers ---- */
    for (int i = 0; i < NREQ; i++) {
        memset(bufs[i], 0xAA, block_len(i, unit));
        reqs[i].done = 0;
        reqs[i].io.op = BI_IO_READ;
        reqs[i].io.ret = -12345;
    }
    cb_calls = 0;
    for (int i = 0; i < NREQ; i++) {
        ops->submit(&e, &reqs[i].io);
        /* Interleave non-blocking polls with submissions. */
        if (i % 50 == 49 && ops->poll(&e, 0) < 0) {
            break;
        }
    }
    ok(drain(&e), "%s/%s: reads drain", ops->name, mode);
    is_int(cb_calls, NREQ, "%s/%s: one callback per read", ops->name, mode);
    bad = 0;
    for (int i = 0; i < NREQ; i++) {
        size_t len = block_len(i, unit);

        if (reqs[i].done != 1 || reqs[i].io.ret != (int64_t)len) {
            bad++;
            continue;
        }
        for (size_t k = 0; k < len; k++) {
            if (bufs[i][k] != pattern_byte(offs[i] + k, 1)) {
                bad++;
                break;
            }
        }
    }
    is_int(bad, 0, "%s/%s: read back equals what was written", ops->name, mode);

    /* ---- large reads through the page cache (the ring engine hands
     * them to its pool): whole file in three iovecs, then one that runs
     * past the end and comes back short ---- */
    if (!direct) {
        unsigned char *big = bi_alloc_aligned(page, total + unit);
        struct req lr = {0};
        size_t a = total / 3, b = total / 3;
        memset(big, 0xAA, total + unit);
        lr.iov[0] = (struct iovec){big, a};
        lr.iov[1] = (struct iovec){big + a, b};
        lr.iov[2] = (struct iovec){big + a + b, total - a - b};
        lr.io = (struct bi_io){.op = BI_IO_READ,
                               .fd = fd,
                               .cached = true,
                               .iov = lr.iov,
                               .iovcnt = 3,
                               .cb = req_cb,
                               .opaque = &lr,
                               .ret = -1};
        ops->submit(&e, &lr.io);
        bool done = drain(&e) && lr.done == 1;
        bad = 0;
        for (uint64_t k = 0; k < total; k++) {
            bad += big[k] != pattern_byte(k, 1);
        }
        ok(done && lr.io.ret == (int64_t)total && bad == 0,
           "%s/%s: %" PRIu64 "-byte cached read in three iovecs", ops->name,
           mode, total);
        struct req sr = {0};
        sr.iov[0] = (struct iovec){big, 512 * 1024};
        sr.io = (struct bi_io){.op = BI_IO_READ,
                               .fd = fd,
                               .cached = true,
                               .iov = sr.iov,
                               .iovcnt = 1,
                               .offset = total - 1000,
                               .cb = req_cb,
                               .opaque = &sr,
                               .ret = -1};
        ops->submit(&e, &sr.io);
        ok(drain(&e) && sr.done == 1 && sr.io.ret == 1000 &&
               big[0] == pattern_byte(total - 1000, 1) &&
               big[999] == pattern_byte(total - 1, 1),
           "%s/%s: cached read past the end is short", ops->name, mode);
        bi_free_aligned(big);
    }

    /* ---- fallocate: punch a hole, read zeroes ---- */
    struct req fa = {0};
    fa.io = (struct bi_io){.op = BI_IO_FALLOCATE,
                           .fd = fd,
                           .offset = 8192,
                           .len = 8192,
                           .mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                           .cb = req_cb,
                           .opaque = &fa,
                           .ret = -1};
    ops->submit(&e, &fa.io);
    ok(drain(&e) && fa.done == 1 && fa.io.ret == 0, "%s/%s: punch hole",
       ops->name, mode);
    got = pread(fd, chk, 8192, 8192);
    ok(got == 8192 && bi_buf_is_zero(chk, 8192), "%s/%s: hole reads zeroes",
       ops->name, mode);
    got = pread(fd, chk, 8192, 16384);
    ok(got == 8192 && chk[0] == pattern_byte(16384, 1),
       "%s/%s: data after the hole intact", ops->name, mode);
    /* An invalid mode is reported as the kernel's error. */
    fa.done = 0;
    fa.io.mode = 0x7fff0000;
    ops->submit(&e, &fa.io);
    /* (drained before the result is read: argument evaluation order is
     * unspecified, so the result is not passed into ok() directly) */
    bool drained = drain(&e);
    int64_t fa_ret = fa.io.ret;
    ok(drained && fa.done == 1 && (fa_ret == -EOPNOTSUPP || fa_ret == -EINVAL),
       "%s/%s: bad fallocate mode fails (%" PRId64 ")", ops->name, mode,
       fa_ret);

    /* ---- errors and short transfers ---- */
    struct req er = {0};
    er.iov[0] = (struct iovec){chk, unit};
    er.io = (struct bi_io){.op = BI_IO_READ,
                           .fd = 987654,
                           .iov = er.iov,
                           .iovcnt = 1,
                           .cb = req_cb,
                           .opaque = &er};
    ops->submit(&e, &er.io);
    ok(drain(&e) && er.io.ret == -EBADF, "%s/%s: bad fd gives -EBADF",
       ops->name, mode);
    er.io.fd = fd;
    er.io.offset = total; /* at EOF */
    ops->submit(&e, &er.io);
    ok(drain(&e) && er.io.ret == 0, "%s/%s: read at EOF returns 0", ops->name,
       mode);
    er.iov[0].iov_len = 2 * unit;
    er.io.offset = total - unit;
    ops->submit(&e, &er.io);
    ok(drain(&e) && er.io.ret == (int64_t)unit,
       "%s/%s: read across EOF is short", ops->name, mode);
    if (direct) {
        /* Misaligned length, then a misaligned buffer: the engine returns
         * what the system call returns (-EINVAL, or for the buffer the
         * data, where the kernel accepts small memory alignment). */
        er.iov[0] = (struct iovec){chk, unit + 1};
        er.io.offset = 0;
        ops->submit(&e, &er.io);
        drained = drain(&e);
        int64_t got_ret = er.io.ret;
        ok(drained && got_ret == -EINVAL,
           "%s/%s: misaligned length gives -EINVAL (%" PRId64 ")", ops->name,
           mode, got_ret);
        for (unsigned shift = 1; shift <= 256; shift *= 16) {
            er.iov[0] = (struct iovec){chk + shift, unit};
            ssize_t want = preadv(fd, er.iov, 1, 0);
            int64_t want_ret = want < 0 ? -errno : want;
            ops->submit(&e, &er.io);
            drained = drain(&e);
            got_ret = er.io.ret;
            ok(drained && got_ret == want_ret &&
                   (got_ret < 0 || chk[shift] == pattern_byte(0, 1)),
               "%s/%s: buffer off by %u: %" PRId64 " as the syscall", ops->name,
               mode, shift, got_ret);
        }
    }

    ok(cb_wrong_thread == 0, "%s/%s: callbacks ran in the polling thread",
       ops->name, mode);
    ops->cleanup(&e);
    close(fd);
    unlink(path);
    for (int i = 0; i < NREQ; i++) {
        bi_free_aligned(bufs[i]);
    }
    bi_free_aligned(chk);
    free(bufs);
    free(offs);
    free(reqs);
}

/* ---- work items ---- */

struct work {
    struct bi_io io;
    int in;
    int out;
    bool off_thread;
};

static int work_fn(void *arg)
{
    struct work *w = arg;

    w->off_thread = !pthread_equal(pthread_self(), main_thread);
    usleep(1000);
    w->out = w->in * 2;
    return w->in % 5 == 0 ? -EIO : 0;
}

static void work_cb(struct bi_io *io)
{
    if (!pthread_equal(pthread_self(), main_thread)) {
        cb_wrong_thread++;
    }
    cb_calls++;
}

static void run_work(const struct bi_engine_ops *ops)
{
    enum { NWORK = 200 };
    struct bi_engine e = {.ops = ops};
    struct work *w = calloc(NWORK, sizeof(*w));
    int bad = 0;

    if (!ok(ops->init(&e, DEPTH) == 0, "%s: init for work", ops->name)) {
        free(w);
        return;
    }
    cb_calls = 0;
    for (int i = 0; i < NWORK; i++) {
        w[i].in = i;
        w[i].io = (struct bi_io){.op = BI_IO_WORK,
                                 .work_fn = work_fn,
                                 .work_arg = &w[i],
                                 .cb = work_cb,
                                 .opaque = &w[i],
                                 .ret = 1};
        ops->submit(&e, &w[i].io);
    }
    /* poll(min) returns once at least min completed. */
    int n = ops->poll(&e, 3);
    ok(n >= 3, "%s: poll(3) ran at least 3 callbacks (%d)", ops->name, n);
    ok(drain(&e), "%s: work drains", ops->name);
    is_int(cb_calls, NWORK, "%s: one callback per work item", ops->name);
    for (int i = 0; i < NWORK; i++) {
        int want = i % 5 == 0 ? -EIO : 0;

        if (w[i].out != 2 * i || w[i].io.ret != want || !w[i].off_thread) {
            bad++;
        }
    }
    is_int(bad, 0, "%s: work ran on workers with results delivered", ops->name);
    ok(cb_wrong_thread == 0, "%s: work callbacks in the polling thread",
       ops->name);
    ops->cleanup(&e);
    free(w);
}

/* ---- callbacks that submit more I/O (a chain of dependent requests) ---- */

struct chain {
    struct bi_engine *e;
    struct bi_io io;
    struct iovec iov;
    int left;
    int errors;
};

static void chain_cb(struct bi_io *io)
{
    struct chain *c = io->opaque;

    if (io->ret != (int64_t)c->iov.iov_len) {
        c->errors++;
    }
    if (--c->left > 0) {
        io->offset += c->iov.iov_len;
        c->e->ops->submit(c->e, io);
    }
}

static void run_chain(const struct bi_engine_ops *ops)
{
    char path[] = "/tmp/blkimg-chain-XXXXXX";
    struct bi_engine e = {.ops = ops};
    static char buf[4096];
    struct chain c[8];
    int fd = mkstemp(path);

    if (fd < 0 || ops->init(&e, 4) != 0) {
        ok(0, "%s: chain setup", ops->name);
        return;
    }
    memset(buf, 'c', sizeof(buf));
    for (int i = 0; i < 8; i++) {
        c[i] = (struct chain){.e = &e, .left = 50};
        c[i].iov = (struct iovec){buf, sizeof(buf)};
        c[i].io = (struct bi_io){.op = BI_IO_WRITE,
                                 .fd = fd,
                                 .iov = &c[i].iov,
                                 .iovcnt = 1,
                                 .offset = (uint64_t)i * 50 * 4096,
                                 .cb = chain_cb,
                                 .opaque = &c[i]};
        ops->submit(&e, &c[i].io);
    }
    ok(drain(&e), "%s: chained submissions from callbacks drain", ops->name);
    int errors = 0, left = 0;
    for (int i = 0; i < 8; i++) {
        errors += c[i].errors;
        left += c[i].left;
    }
    ok(errors == 0 && left == 0, "%s: every chained write completed",
       ops->name);
    struct stat st;
    fstat(fd, &st);
    is_int(st.st_size, 8 * 50 * 4096, "%s: chained writes sized the file",
           ops->name);
    ops->cleanup(&e);
    close(fd);
    unlink(path);
}

/* ---- io_uring refused by the kernel ---- */

/* In a child process, makes io_uring_setup fail with errnum (as with
 * kernel.io_uring_disabled or a seccomp policy), then checks that the
 * io_uring engine's init reports it and the thread engine still works.
 * Exit status: 0 = as expected, 2 = init did not fail, 3 = wrong errno,
 * 4 = threads engine failed, 77 = could not install the filter. */
static int refused_child(int errnum)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K,
                 SECCOMP_RET_ERRNO | (unsigned)(errnum & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = BI_ARRAY_SIZE(f), .filter = f};
    struct bi_engine e = {.ops = &bi_engine_uring_ops};
    int r;

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        return 77;
    }
    r = e.ops->init(&e, 64);
    if (r == 0) {
        return 2;
    }
    if (r != -errnum) {
        return 3;
    }
    e = (struct bi_engine){.ops = &bi_engine_threads_ops};
    if (e.ops->init(&e, 64) != 0) {
        return 4;
    }
    static char b[512];
    struct iovec iov = {b, sizeof(b)};
    struct req q = {0};
    int fd = open("/proc/self/exe", O_RDONLY);
    q.io = (struct bi_io){.op = BI_IO_READ,
                          .fd = fd,
                          .iov = &iov,
                          .iovcnt = 1,
                          .cb = req_cb,
                          .opaque = &q};
    e.ops->submit(&e, &q.io);
    if (!drain(&e) || q.io.ret != 512 || memcmp(b + 1, "ELF", 3) != 0) {
        return 4;
    }
    e.ops->cleanup(&e);
    return 0;
}

static void run_refused(int errnum)
{
    pid_t pid = fork();
    int status = 0;

    if (pid == 0) {
        _exit(refused_child(errnum));
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
        ok(0, "io_uring refused (%s): child ran", strerror(errnum));
        return;
    }
    if (WEXITSTATUS(status) == 77) {
        printf("ok %d - # SKIP cannot install a seccomp filter\n", ++tap_count);
        return;
    }
    is_int(WEXITSTATUS(status), 0,
           "io_uring refused (%s): init returns -errno, threads work",
           strerror(errnum));
}

int main(void)
{
    const struct bi_engine_ops *engines[] = {&bi_engine_uring_ops,
                                             &bi_engine_threads_ops};

    main_thread = pthread_self();
    for (size_t i = 0; i < BI_ARRAY_SIZE(engines); i++) {
        run(engines[i], false);
        run(engines[i], true);
        run_work(engines[i]);
        run_chain(engines[i]);
    }
    /* An over-large depth is capped, not refused. */
    {
        struct bi_engine e = {.ops = &bi_engine_uring_ops};
        int r = e.ops->init(&e, 1u << 20);
        is_int(r, 0, "io_uring: init with a huge depth is clamped");
        if (r == 0) {
            e.ops->cleanup(&e);
        }
    }
    run_refused(ENOSYS); /* kernel without io_uring */
    run_refused(EPERM);  /* kernel.io_uring_disabled=2 */
    return tap_done();
}
