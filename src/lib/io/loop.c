/* SPDX-License-Identifier: MIT */
/*
 * The block-layer thread's event loop: the process engine, coroutines woken
 * by completions or by other coroutines, and the public aio entry points.
 */
#include "blkimg/blkimg.h"
#include "block/block.h"
#include "io/aio.h"
#include "util/coroutine.h"
#include "util/util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define ENGINE_DEPTH 256

static struct bi_engine engine;
static bool engine_ready;
static enum bi_aio engine_kind = BI_AIO_DEFAULT;
static int requests_in_flight;

/* Woken coroutines, entered in FIFO order by the loop. */
static bi_co **ready;
static size_t ready_len, ready_cap;

static int engine_start(enum bi_aio kind)
{
    int ret = -ENOSYS;
    memset(&engine, 0, sizeof(engine));
    if (kind != BI_AIO_THREADS) {
        engine.ops = &bi_engine_uring_ops;
        ret = engine.ops->init(&engine, ENGINE_DEPTH);
        if (ret == 0 || kind == BI_AIO_IO_URING || kind == BI_AIO_NATIVE)
            return ret;
        memset(&engine, 0, sizeof(engine));
    }
    engine.ops = &bi_engine_threads_ops;
    return engine.ops->init(&engine, ENGINE_DEPTH);
}

struct bi_engine *bi_engine_get(void)
{
    if (!engine_ready) {
        if (engine_start(engine_kind) < 0) {
            /* io_uring was asked for explicitly and refused at first use:
             * bi_aio_select reports that; here keep working. */
            if (engine_start(BI_AIO_THREADS) < 0)
                abort();
        }
        engine_ready = true;
    }
    return &engine;
}

int bi_aio_select(enum bi_aio aio, bi_error *err)
{
    if (engine_ready) {
        if (engine.in_flight)
            return -EBUSY;
        engine.ops->cleanup(&engine);
        engine_ready = false;
    }
    engine_kind = aio;
    int ret = engine_start(aio);
    if (ret < 0) {
        bi_error_set(err, -ret, "Unable to use %s for I/O",
                     aio == BI_AIO_THREADS ? "threads" : "io_uring");
        engine_kind = BI_AIO_DEFAULT;
        return ret;
    }
    engine_ready = true;
    return 0;
}

const char *bi_aio_engine_name(void)
{
    return bi_engine_get()->ops->name;
}

int bi_aio_parse(const char *s, enum bi_aio *out)
{
    if (!strcmp(s, "io_uring"))
        *out = BI_AIO_IO_URING;
    else if (!strcmp(s, "threads"))
        *out = BI_AIO_THREADS;
    else if (!strcmp(s, "native"))
        *out = BI_AIO_NATIVE;
    else
        return -EINVAL;
    return 0;
}

/* The wake-up hook of coroutine.c: woken coroutines queue here. */
static void schedule_co(bi_co *co)
{
    if (ready_len == ready_cap) {
        ready_cap = ready_cap ? ready_cap * 2 : 64;
        ready = realloc(ready, ready_cap * sizeof(*ready));
        if (!ready)
            abort();
    }
    ready[ready_len++] = co;
}

/* util stays below the loop: the loop hands coroutine.c its wake-up hook
 * before any coroutine can run. */
__attribute__((constructor)) static void loop_register_wake(void)
{
    bi_co_set_wake_hook(schedule_co);
}

static int run_ready(void)
{
    int n = 0;
    /* Coroutines entered here may wake others; those run in this pass. */
    for (size_t i = 0; i < ready_len; i++) {
        bi_co_enter(ready[i]);
        n++;
    }
    ready_len = 0;
    return n;
}

bool bi_io_buf_register(void *base, size_t len)
{
    struct bi_engine *e = bi_engine_get();
    return base && len && e->ops->buf_register &&
           e->ops->buf_register(e, base, len) == 0;
}

void bi_io_buf_unregister(void *base)
{
    struct bi_engine *e = bi_engine_get();
    if (base && e->ops->buf_unregister)
        e->ops->buf_unregister(e, base);
}

int bi_loop_run_once(bool blocking)
{
    struct bi_engine *e = bi_engine_get();
    int n = run_ready();
    if (e->in_flight) {
        /* Submitting what the coroutines queued and waiting for a
         * completion is one system call; wait only when no coroutine is
         * ready to run. */
        int r = e->ops->poll(e, (blocking && ready_len == 0) ? 1 : 0);
        if (r > 0)
            n += r;
    }
    n += run_ready();
    return n;
}

bool bi_loop_idle(int did)
{
    return did == 0 && !bi_engine_get()->in_flight && ready_len == 0;
}

static bool (*stall_hook)(void);

void bi_loop_set_stall_hook(bool (*hook)(void))
{
    stall_hook = hook;
}

/* After an idle pass: whether the stall hook released a coroutine. */
static bool release_stalled(void)
{
    return stall_hook && stall_hook();
}

struct io_waiter {
    bi_co *co;
    bool done;
};

static void io_done(struct bi_io *io)
{
    struct io_waiter *w = io->opaque;
    w->done = true;
    if (w->co)
        bi_co_wake(w->co);
}

int64_t bi_io_run(struct bi_io *io)
{
    struct bi_engine *e = bi_engine_get();
    struct io_waiter w = {.co = bi_co_self(), .done = false};

    io->cb = io_done;
    io->opaque = &w;
    e->ops->submit(e, io);
    if (w.co) {
        while (!w.done)
            bi_co_yield();
    } else {
        while (!w.done)
            bi_loop_run_once(true);
    }
    return io->ret;
}

void bi_loop_request_started(void)
{
    requests_in_flight++;
}
void bi_loop_request_done(void)
{
    requests_in_flight--;
}
int bi_loop_requests(void)
{
    return requests_in_flight;
}

int bi_aio_poll(bool blocking)
{
    if (requests_in_flight || ready_len)
        bi_loop_run_once(blocking);
    return requests_in_flight;
}

void bi_aio_drain(void)
{
    while (requests_in_flight || ready_len) {
        if (bi_loop_idle(bi_loop_run_once(true)) && !release_stalled())
            break; /* nothing can make progress */
    }
}

int bi_aio_in_flight(void)
{
    return requests_in_flight;
}

/* ------------------------------------------------------------ cross-thread
 * kicks: an eventfd that any thread writes, watched by the loop while it
 * waits in bi_aio_wait. */

static pthread_once_t kick_once = PTHREAD_ONCE_INIT;
static int kick_fd = -1;
static struct bi_fd_watch kick_watch;

static void kick_read(struct bi_fd_watch *w, unsigned revents)
{
    uint64_t v;
    (void)w;
    (void)revents;
    /* nonblocking: a cancelled poll finds nothing to read */
    (void)!read(kick_fd, &v, sizeof(v));
}

static void kick_init(void)
{
    kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (kick_fd < 0)
        abort(); /* out of descriptors at the first kick: nothing to do */
    bi_fd_watch_init(&kick_watch, kick_read);
}

void bi_aio_kick(void)
{
    uint64_t one = 1;
    pthread_once(&kick_once, kick_init);
    (void)!write(kick_fd, &one, sizeof(one));
}

int bi_aio_wait(void)
{
    pthread_once(&kick_once, kick_init);
    /* The armed poll is in flight, so the engine waits for it or for any
     * other completion; an earlier kick left the eventfd readable. */
    bi_fd_watch_arm(&kick_watch, kick_fd, true, false);
    bi_loop_run_once(true);
    return requests_in_flight;
}

int bi_run_in_thread(int (*fn)(void *), void *arg)
{
    struct bi_io io = {.op = BI_IO_WORK, .work_fn = fn, .work_arg = arg};
    return (int)bi_io_run(&io);
}

struct fan_in {
    bi_co *co;
    int left;
};

static void fan_done(struct bi_io *io)
{
    struct fan_in *f = io->opaque;
    if (--f->left == 0 && f->co)
        bi_co_wake(f->co);
}

int bi_run_in_threads(int (*fn)(void *), void *const *args, int n)
{
    if (n == 1)
        return bi_run_in_thread(fn, args[0]);
    struct bi_engine *e = bi_engine_get();
    struct bi_io *io = calloc((size_t)n, sizeof(*io));
    if (!io)
        return -ENOMEM;
    struct fan_in f = {.co = bi_co_self(), .left = n};
    for (int i = 0; i < n; i++) {
        io[i] = (struct bi_io){.op = BI_IO_WORK,
                               .work_fn = fn,
                               .work_arg = args[i],
                               .cb = fan_done,
                               .opaque = &f};
        e->ops->submit(e, &io[i]);
    }
    while (f.left) {
        if (f.co)
            bi_co_yield();
        else
            bi_loop_run_once(true);
    }
    int ret = 0;
    for (int i = 0; i < n && !ret; i++)
        ret = (int)io[i].ret;
    free(io);
    return ret;
}

/* ------------------------------------------------------------ fd watches */

/* A poll of a watch ended: the owner hears of it unless the watch is
 * being stopped. A cancelled poll, or one of a descriptor the watch has
 * left, reports revents 0 (the owner then arms again). */
static void watch_done(struct bi_io *io)
{
    struct bi_fd_watch *w = io->opaque;
    unsigned revents;

    if (io == &w->in) {
        w->armed_in = false;
    } else {
        w->armed_out = false;
    }
    if (w->stopping) {
        if (!w->armed_in && !w->armed_out && w->waiter) {
            bi_co_wake(w->waiter);
        }
        return;
    }
    if (io->ret == -ECANCELED || io->fd != w->fd) {
        revents = 0;
    } else {
        /* an engine error is an error condition on the descriptor */
        revents = io->ret < 0 ? POLLERR : (unsigned)io->ret;
    }
    w->cb(w, revents);
}

void bi_fd_watch_init(struct bi_fd_watch *w,
                      void (*cb)(struct bi_fd_watch *w, unsigned revents))
{
    memset(w, 0, sizeof(*w));
    w->cb = cb;
    w->fd = -1;
}

static void arm_one(struct bi_fd_watch *w, struct bi_io *io, short events)
{
    struct bi_engine *e = bi_engine_get();

    memset(io, 0, sizeof(*io));
    io->op = BI_IO_POLL;
    io->fd = w->fd;
    io->mode = events;
    io->cb = watch_done;
    io->opaque = w;
    e->ops->submit(e, io);
}

static void cancel_armed(struct bi_fd_watch *w)
{
    struct bi_engine *e = bi_engine_get();

    if (w->armed_in) {
        e->ops->cancel(e, &w->in);
    }
    if (w->armed_out) {
        e->ops->cancel(e, &w->out);
    }
}

void bi_fd_watch_arm(struct bi_fd_watch *w, int fd, bool in, bool out)
{
    w->stopping = false;
    if (fd != w->fd && (w->armed_in || w->armed_out)) {
        w->fd = fd;
        cancel_armed(w); /* their callbacks arm for fd */
        return;
    }
    w->fd = fd;
    if (in && !w->armed_in) {
        w->armed_in = true;
        arm_one(w, &w->in, POLLIN);
    }
    if (out && !w->armed_out) {
        w->armed_out = true;
        arm_one(w, &w->out, POLLOUT);
    }
}

void bi_fd_watch_cancel(struct bi_fd_watch *w)
{
    w->stopping = true;
    cancel_armed(w);
}

void bi_fd_watch_stop(struct bi_fd_watch *w)
{
    w->stopping = true;
    w->waiter = bi_co_self();
    cancel_armed(w);
    while (w->armed_in || w->armed_out) {
        if (w->waiter) {
            bi_co_yield();
        } else {
            bi_loop_run_once(true);
        }
    }
    w->waiter = NULL;
}

bool bi_fd_watch_idle(const struct bi_fd_watch *w)
{
    return !w->armed_in && !w->armed_out;
}

/* ---------------------------------------------------------------- bi_run_co */

struct run_co {
    int (*fn)(void *);
    void *arg;
    int ret;
    bool done;
};

static void run_co_entry(void *opaque)
{
    struct run_co *r = opaque;
    r->ret = r->fn(r->arg);
    r->done = true;
}

int bi_run_co(int (*fn)(void *arg), void *arg)
{
    if (bi_in_co())
        return fn(arg);
    struct run_co r = {.fn = fn, .arg = arg};
    bi_co_enter(bi_co_create(run_co_entry, &r));
    while (!r.done) {
        if (bi_loop_idle(bi_loop_run_once(true)) && !r.done &&
            !release_stalled())
            abort(); /* deadlock: a request waits on nothing */
    }
    return r.ret;
}
