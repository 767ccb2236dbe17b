/* SPDX-License-Identifier: MIT */
/*
 * Coroutines on private stacks.
 *
 * A coroutine's stack is set up once with makecontext(); after that every
 * switch is a _setjmp/_longjmp pair, which saves no signal mask and so
 * costs no system call. Stacks are pooled and reused. Under AddressSanitizer
 * every switch is announced with the fiber-switch hooks so that ASan knows
 * which stack is live.
 */
#include "util/coroutine.h"
#include "util/util.h"

#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define BI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BI_ASAN 1
#endif
#endif

#ifdef BI_ASAN
#include <sanitizer/common_interface_defs.h>
#define CO_STACK_SIZE (1024 * 1024)
#else
#define CO_STACK_SIZE (256 * 1024)
#endif
#define CO_POOL_MAX 256

struct bi_co {
    jmp_buf env;     /* where the coroutine resumes */
    jmp_buf *caller; /* where a yield returns to */
    bi_co_fn *fn;
    void *arg;
    void *stack; /* mapping, guard page first */
    size_t map_size;
    bool done;
    bool scheduled;
    bi_co *prev_current;
    bi_co *pool_next;
    /* ASan bookkeeping */
    void *fake_stack;
    const void *caller_bottom;
    size_t caller_size;
};

static __thread bi_co *current;
static __thread bi_co *pool;
static __thread unsigned pool_len;
static __thread jmp_buf *init_env;

static inline void asan_start(void **fake, const void *bottom, size_t size)
{
#ifdef BI_ASAN
    __sanitizer_start_switch_fiber(fake, bottom, size);
#else
    (void)fake;
    (void)bottom;
    (void)size;
#endif
}

static inline void asan_finish(void *fake, const void **bottom, size_t *size)
{
#ifdef BI_ASAN
    __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
    (void)fake;
    (void)bottom;
    (void)size;
#endif
}

static void *co_stack_base(bi_co *co)
{
    return (char *)co->stack + bi_page_size();
}

static void co_trampoline(unsigned lo, unsigned hi)
{
    bi_co *co = (bi_co *)(((uintptr_t)hi << 32) | (uintptr_t)lo);

    /* First run: record the resume point and go straight back. */
    asan_finish(NULL, &co->caller_bottom, &co->caller_size);
    if (!_setjmp(co->env)) {
        asan_start(&co->fake_stack, co->caller_bottom, co->caller_size);
        _longjmp(*init_env, 1);
    }
    for (;;) {
        asan_finish(co->fake_stack, &co->caller_bottom, &co->caller_size);
        co->fn(co->arg);
        co->done = true;
        if (!_setjmp(co->env)) {
            asan_start(&co->fake_stack, co->caller_bottom, co->caller_size);
            _longjmp(*co->caller, 1);
        }
    }
}

static bi_co *co_new(void)
{
    bi_co *co = calloc(1, sizeof(*co));
    if (!co)
        abort();
    size_t page = bi_page_size();
    co->map_size = CO_STACK_SIZE + page;
    co->stack = mmap(NULL, co->map_size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (co->stack == MAP_FAILED)
        abort();
    mprotect(co->stack, page, PROT_NONE); /* guard page */

    ucontext_t uc;
    if (getcontext(&uc) < 0)
        abort();
    uc.uc_stack.ss_sp = co_stack_base(co);
    uc.uc_stack.ss_size = CO_STACK_SIZE;
    uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)co;
    makecontext(&uc, (void (*)(void))co_trampoline, 2,
                (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));

    jmp_buf here;
    jmp_buf *saved = init_env;
    init_env = &here;
    void *fake = NULL;
    if (!_setjmp(here)) {
        asan_start(&fake, co_stack_base(co), CO_STACK_SIZE);
        /* setcontext, not swapcontext: the trampoline jumps straight
         * back to 'here', and ASan does not intercept setcontext. */
        setcontext(&uc);
    }
    asan_finish(fake, NULL, NULL);
    init_env = saved;
    return co;
}

bi_co *bi_co_create(bi_co_fn *fn, void *arg)
{
    bi_co *co = pool;
    if (co) {
        pool = co->pool_next;
        pool_len--;
    } else {
        co = co_new();
    }
    co->fn = fn;
    co->arg = arg;
    co->done = false;
    co->scheduled = false;
    co->pool_next = NULL;
    return co;
}

static void co_release(bi_co *co)
{
    if (pool_len < CO_POOL_MAX) {
        co->pool_next = pool;
        pool = co;
        pool_len++;
        return;
    }
    munmap(co->stack, co->map_size);
    free(co);
}

void bi_co_enter(bi_co *co)
{
    jmp_buf here;
    void *fake = NULL;

    if (co->done)
        abort(); /* a finished coroutine was woken: a stale pointer */
    co->caller = &here;
    co->prev_current = current;
    co->scheduled = false;
    current = co;
    if (!_setjmp(here)) {
        asan_start(&fake, co_stack_base(co), CO_STACK_SIZE);
        _longjmp(co->env, 1);
    }
    asan_finish(fake, NULL, NULL);
    current = co->prev_current;
    if (co->done)
        co_release(co);
}

void bi_co_yield(void)
{
    bi_co *co = current;
    if (!co)
        abort(); /* yield outside a coroutine is a programming error */
    if (!_setjmp(co->env)) {
        asan_start(&co->fake_stack, co->caller_bottom, co->caller_size);
        _longjmp(*co->caller, 1);
    }
    asan_finish(co->fake_stack, &co->caller_bottom, &co->caller_size);
}

bi_co *bi_co_self(void)
{
    return current;
}

static bi_co_wake_hook *wake_hook;

void bi_co_set_wake_hook(bi_co_wake_hook *hook)
{
    wake_hook = hook;
}

void bi_co_wake(bi_co *co)
{
    /* Already queued; or running: every wait re-checks its condition
     * before it yields, and queueing a running coroutine would enter it
     * again after it has finished (a completion that fires inside the
     * call that issued it, as libnbd's may). */
    if (co->scheduled || co == current)
        return;
    co->scheduled = true;
    if (!wake_hook)
        abort(); /* no event loop registered: nothing could enter co */
    wake_hook(co);
}

void bi_co_queue_init(bi_co_queue *q)
{
    TAILQ_INIT(q);
}

void bi_co_queue_wait(bi_co_queue *q)
{
    struct bi_co_waiter w = {.co = current};
    TAILQ_INSERT_TAIL(q, &w, link);
    while (w.co)
        bi_co_yield();
}

bool bi_co_queue_wake_next(bi_co_queue *q)
{
    struct bi_co_waiter *w = TAILQ_FIRST(q);
    if (!w)
        return false;
    TAILQ_REMOVE(q, w, link);
    bi_co *co = w->co;
    w->co = NULL;
    bi_co_wake(co);
    return true;
}

void bi_co_queue_wake_all(bi_co_queue *q)
{
    while (bi_co_queue_wake_next(q)) {
    }
}

bool bi_co_queue_empty(const bi_co_queue *q)
{
    return TAILQ_EMPTY(q);
}

void bi_co_mutex_init(bi_co_mutex *m)
{
    m->locked = false;
    bi_co_queue_init(&m->waiters);
}

void bi_co_mutex_lock(bi_co_mutex *m)
{
    while (m->locked)
        bi_co_queue_wait(&m->waiters);
    m->locked = true;
}

void bi_co_mutex_unlock(bi_co_mutex *m)
{
    m->locked = false;
    bi_co_queue_wake_next(&m->waiters);
}
