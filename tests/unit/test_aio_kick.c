/* SPDX-License-Identifier: MIT */
/*
 * bi_aio_kick and bi_aio_wait, as a server's loop thread uses them: a
 * kick made before the wait, or by another thread during it, ends the
 * wait even with nothing in flight; a completion ends it too and its
 * callback has run; many kicks from many threads are never lost. Each
 * engine runs in a child process (the engine is chosen once).
 */
#include "blkimg/blkimg.h"
#include "tap.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *kick_later(void *arg)
{
    usleep(50 * 1000);
    (void)arg;
    bi_aio_kick();
    return NULL;
}

static atomic_int kicks_sent;
static atomic_int producers_done;

static void *kick_many(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        atomic_fetch_add(&kicks_sent, 1);
        bi_aio_kick();
    }
    /* the last kick comes after the count, which the waiter reads */
    atomic_fetch_add(&producers_done, 1);
    atomic_fetch_add(&kicks_sent, 1);
    bi_aio_kick();
    return NULL;
}

static void read_done(void *opaque, int ret)
{
    int *res = opaque;
    *res = ret == 0 ? 1 : ret;
}

static int body(enum bi_aio aio, const char *name)
{
    bi_error err;
    bi_error_init(&err);
    if (bi_aio_select(aio, &err) < 0) {
        printf("# %s: %s (skipped)\n", name, err.msg);
        return 0;
    }
    alarm(60); /* a lost kick would hang: fail instead */

    /* a kick before the wait */
    bi_aio_kick();
    double t = now();
    ok(bi_aio_wait() == 0, "%s: wait after a kick returns, none in flight",
       name);
    ok(now() - t < 1.0, "%s: ... at once", name);

    /* a kick from another thread during the wait */
    pthread_t th;
    pthread_create(&th, NULL, kick_later, NULL);
    t = now();
    bi_aio_wait();
    ok(now() - t >= 0.04, "%s: wait waits for the other thread's kick", name);
    pthread_join(th, NULL);

    /* a completion ends the wait */
    char path[] = "/tmp/blkimg-kick-XXXXXX";
    int fd = mkstemp(path);
    ok(fd >= 0 && ftruncate(fd, 1 << 20) == 0, "%s: scratch file", name);
    close(fd);
    struct bi_open_opts o;
    bi_open_opts_init(&o);
    o.format = "raw";
    bi_node *n = bi_open(path, &o, &err);
    ok(n != NULL, "%s: open: %s", name, err.msg);
    if (n) {
        static char buf[65536];
        struct iovec iov = {buf, sizeof(buf)};
        int res = 0;
        bi_aio_preadv(n, 4096, &iov, 1, read_done, &res);
        for (int guard = 0; res == 0 && guard < 1000; guard++)
            bi_aio_wait();
        ok(res == 1, "%s: the read completed inside bi_aio_wait", name);
        bi_close(n, NULL);
    }
    unlink(path);

    /* many kicks from four threads: every wait ends, none hangs */
    pthread_t ths[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&ths[i], NULL, kick_many, NULL);
    /* at least one wait: the producers may all be done before the first
     * look at their count (a pending kick ends it at once) */
    int waits = 0;
    do {
        bi_aio_wait();
        waits++;
    } while (atomic_load(&producers_done) < 4);
    for (int i = 0; i < 4; i++)
        pthread_join(ths[i], NULL);
    ok(waits >= 1 && waits <= atomic_load(&kicks_sent),
       "%s: %d waits for %d kicks from 4 threads", name, waits,
       atomic_load(&kicks_sent));
    alarm(0);
    return 0;
}

int main(void)
{
    const struct {
        enum bi_aio aio;
        const char *name;
    } engines[] = {{BI_AIO_IO_URING, "io_uring"}, {BI_AIO_THREADS, "threads"}};
    for (size_t i = 0; i < sizeof(engines) / sizeof(engines[0]); i++) {
        int fds[2];
        if (pipe(fds) < 0)
            return 1;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            /* the child numbers its checks on from the parent's and
             * hands its counts back */
            close(fds[0]);
            body(engines[i].aio, engines[i].name);
            fflush(stdout);
            int counts[2] = {tap_count, tap_failed};
            (void)!write(fds[1], counts, sizeof(counts));
            _exit(0);
        }
        close(fds[1]);
        int counts[2] = {0, 0};
        ssize_t got = read(fds[0], counts, sizeof(counts));
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (got == (ssize_t)sizeof(counts)) {
            tap_count = counts[0];
            tap_failed = counts[1];
        }
        ok(got == (ssize_t)sizeof(counts) && WIFEXITED(status) &&
               WEXITSTATUS(status) == 0,
           "%s: child process ended normally", engines[i].name);
    }
    return tap_done();
}
