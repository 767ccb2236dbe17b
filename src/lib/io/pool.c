/* SPDX-License-Identifier: MIT */
/* Worker threads for blocking system calls; see pool.h. */
#include "io/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

struct bi_pool {
    pthread_mutex_t lock; /* protects the work queue and thread list */
    pthread_cond_t work_cond;
    struct bi_io *work_head, *work_tail;
    unsigned queued;  /* requests in the work queue */
    unsigned waiting; /* workers blocked on work_cond */
    unsigned nthreads, max_threads;
    pthread_t *threads;
    bool stop;

    pthread_mutex_t done_lock; /* protects the completion queue */
    struct bi_io *done_head, *done_tail;
    bool has_done; /* mirrors done_head != NULL, read without the lock */

    int efd;
};

void bi_io_exec(struct bi_io *io)
{
    int64_t r;

    do {
        switch (io->op) {
        case BI_IO_READ:
            r = preadv(io->fd, io->iov, io->iovcnt, (off_t)io->offset);
            break;
        case BI_IO_WRITE:
            r = pwritev(io->fd, io->iov, io->iovcnt, (off_t)io->offset);
            break;
        case BI_IO_FSYNC:
            r = fdatasync(io->fd);
            break;
        case BI_IO_FALLOCATE:
            r = fallocate(io->fd, io->mode, (off_t)io->offset, (off_t)io->len);
            break;
        case BI_IO_WORK:
            io->ret = io->work_fn(io->work_arg);
            return;
        default:
            io->ret = -EINVAL;
            return;
        }
    } while (r < 0 && errno == EINTR);
    io->ret = r < 0 ? -errno : r;
}

static void post_done(struct bi_pool *p, struct bi_io *io)
{
    bool was_empty;

    io->next = NULL;
    pthread_mutex_lock(&p->done_lock);
    was_empty = p->done_head == NULL;
    if (was_empty) {
        p->done_head = io;
    } else {
        p->done_tail->next = io;
    }
    p->done_tail = io;
    __atomic_store_n(&p->has_done, true, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&p->done_lock);
    if (was_empty) {
        /* One wake-up per batch: the taker empties the whole queue. */
        uint64_t one = 1;
        ssize_t r;

        do {
            r = write(p->efd, &one, sizeof(one));
        } while (r < 0 && errno == EINTR);
    }
}

static void *worker(void *arg)
{
    struct bi_pool *p = arg;

    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct bi_io *io = p->work_head;

        if (!io) {
            if (p->stop) {
                break;
            }
            p->waiting++;
            pthread_cond_wait(&p->work_cond, &p->lock);
            p->waiting--;
            continue;
        }
        p->work_head = io->next;
        if (!p->work_head) {
            p->work_tail = NULL;
        }
        p->queued--;
        pthread_mutex_unlock(&p->lock);
        bi_io_exec(io);
        post_done(p, io);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Starts one more worker; called with p->lock held. Signals stay with the
 * application's threads: workers block them all. */
static bool spawn_locked(struct bi_pool *p)
{
    sigset_t all, old;
    pthread_attr_t attr;
    int r;

    if (p->nthreads >= p->max_threads) {
        return false;
    }
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&p->threads[p->nthreads], &attr, worker, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        return false;
    }
    p->nthreads++;
    return true;
}

struct bi_pool *bi_pool_new(unsigned max_threads, bool nonblock)
{
    struct bi_pool *p = calloc(1, sizeof(*p));

    if (!p) {
        return NULL;
    }
    p->max_threads = max_threads ? max_threads : 1;
    p->threads = calloc(p->max_threads, sizeof(*p->threads));
    p->efd = eventfd(0, EFD_CLOEXEC | (nonblock ? EFD_NONBLOCK : 0));
    if (!p->threads || p->efd < 0) {
        int e = p->threads ? errno : ENOMEM;

        if (p->efd >= 0) {
            close(p->efd);
        }
        free(p->threads);
        free(p);
        errno = e;
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->done_lock, NULL);
    pthread_cond_init(&p->work_cond, NULL);
    return p;
}

void bi_pool_free(struct bi_pool *p)
{
    if (!p) {
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->work_cond);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++) {
        pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->work_cond);
    pthread_mutex_destroy(&p->done_lock);
    pthread_mutex_destroy(&p->lock);
    close(p->efd);
    free(p->threads);
    free(p);
}

int bi_pool_fd(const struct bi_pool *p)
{
    return p->efd;
}

void bi_pool_submit(struct bi_pool *p, struct bi_io *io)
{
    io->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->work_tail) {
        p->work_tail->next = io;
    } else {
        p->work_head = io;
    }
    p->work_tail = io;
    p->queued++;
    /* More queued work than idle workers: grow the pool. */
    if (p->queued > p->waiting && !spawn_locked(p) && p->nthreads == 0) {
        /* Not a single worker could be started: run it here. The
         * completion still reaches the caller through bi_pool_take(). */
        p->work_head = NULL;
        p->work_tail = NULL;
        p->queued = 0;
        pthread_mutex_unlock(&p->lock);
        bi_io_exec(io);
        post_done(p, io);
        return;
    }
    if (p->waiting > 0) {
        pthread_cond_signal(&p->work_cond);
    }
    pthread_mutex_unlock(&p->lock);
}

bool bi_pool_has_done(struct bi_pool *p)
{
    return __atomic_load_n(&p->has_done, __ATOMIC_ACQUIRE);
}

struct bi_io *bi_pool_take(struct bi_pool *p)
{
    struct bi_io *list;

    if (!bi_pool_has_done(p)) {
        return NULL;
    }
    pthread_mutex_lock(&p->done_lock);
    list = p->done_head;
    p->done_head = NULL;
    p->done_tail = NULL;
    __atomic_store_n(&p->has_done, false, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->done_lock);
    return list;
}

void bi_pool_wait(struct bi_pool *p)
{
    uint64_t v;
    ssize_t r;

    do {
        r = read(p->efd, &v, sizeof(v));
    } while (r < 0 && errno == EINTR);
}
