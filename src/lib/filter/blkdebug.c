/* SPDX-License-Identifier: MIT */
/*
 * The "blkdebug" filter: QEMU 7.2's fault injection, compatible with its
 * config files and options.
 *
 *   blkdebug:CONFIGFILE:IMAGE     (CONFIGFILE may be empty)
 *   driver=blkdebug,config=...,image=...,align=...,inject-error.0.event=...
 *
 * A state machine (the state starts at 1) runs on the debug events the
 * drivers above raise (bi_debug_event). When an event happens, every
 * rule for it whose state is 0 or the current state fires: inject-error
 * rules become the active rules (those of an earlier event are dropped),
 * set-state rules choose the state that holds once all have run. The
 * event "none" happens once, when the filter opens. Every request on the
 * node checks the active rules: the first whose iotype covers the request
 * and whose sector is unset or inside the request decides it: its errno
 * (0: none) fails the request; a "once" rule is then gone for good.
 * QEMU's "immediately" only decides whether the error comes before or
 * after one turn of the event loop; here both fail at once.
 *
 * Breakpoints (bi_debug_breakpoint; qemu-io's break, resume, wait_break,
 * remove_break) are QEMU's suspend rules: the first request to raise the
 * breakpoint's event after it was set, in a coroutine, is suspended under
 * its tag and the breakpoint is gone. The request yields until every
 * suspension it took (one per breakpoint on that event) was resumed; a
 * resume from outside a coroutine enters it at once, as QEMU's does, so
 * it runs until it next waits before the call returns. Suspended requests
 * of every blkdebug node are in one list, so that the event loop's stall
 * hook can release the oldest when nothing else could end a wait (qemu-io
 * would hang there instead).
 *
 * align and max-transfer become the node's limits; zero writes shorter
 * than opt-write-zero (or the alignment) are refused with ENOTSUP (so the
 * layer above writes zeroes itself), discards shorter than opt-discard
 * are dropped, and longer ones are split at max-write-zero / max-discard.
 */
#include "filter/blkdebug.h"
#include "filter/filter.h"
#include "io/aio.h"
#include "util/coroutine.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* A breakpoint: QEMU's suspend rule. */
struct bd_break {
    int event; /* enum bi_debug_event */
    char *tag;
    struct bd_break *next;
};

/* A request suspended at a breakpoint (QEMU's BlkdebugSuspendedReq). */
struct bd_suspended {
    bi_node *node; /* the filter */
    bi_co *co;
    char *tag;
    struct bd_suspended *next;
};

/* Every node's suspended requests, newest first (QEMU's order). */
static struct bd_suspended *bd_suspended_list;

struct bd_state {
    int64_t state;
    struct bd_break *breaks; /* newest first */
    struct bd_rules rules;
    struct bd_rule **active; /* in the order they are checked */
    size_t nactive;
    uint64_t align, max_transfer, opt_wz, max_wz, opt_disc, max_disc;
};

static const char *const bd_prefixes[] = {"blkdebug", NULL};

/* "blkdebug:CONFIG:IMAGE" -> config=, x-image= (",," escapes a comma). */
static int bd_parse_filename(const char *filename, struct bi_optlist *opts,
                             bi_error *err)
{
    const char *p = filename + strlen("blkdebug:");
    const char *c = strchr(p, ':');
    if (!c) {
        bi_error_set(err, 0,
                     "blkdebug requires both config file and image path");
        return -EINVAL;
    }
    char *cfg = bi_xasprintf("%.*s", (int)(c - p), p);
    char *esc_cfg = bi_filter_escape(cfg), *esc_img = bi_filter_escape(c + 1);
    char *kv = *cfg ? bi_xasprintf("config=%s,x-image=%s", esc_cfg, esc_img)
                    : bi_xasprintf("x-image=%s", esc_img);
    int ret = bi_optlist_parse(opts, kv);
    free(kv);
    free(cfg);
    free(esc_cfg);
    free(esc_img);
    if (ret < 0)
        bi_error_set(err, 0, "blkdebug: invalid name '%s'", filename);
    return ret;
}

/* Refuses options blkdebug does not take, in QEMU's words. */
static int bd_check_keys(const struct bi_open_opts *o, bi_error *err)
{
    static const char *const known[] = {
        "config",      "image",        "x-image",        "image.filename",
        "align",       "max-transfer", "opt-write-zero", "max-write-zero",
        "opt-discard", "max-discard",  "inject-error.",  "set-state.",
        NULL};
    for (const char *const *p = o->protocol_opts; p && *p; p++) {
        size_t kl = strcspn(*p, "=");
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++) {
            size_t l = strlen(*k);
            ok = (*k)[l - 1] == '.' ? !strncmp(*p, *k, l)
                                    : (kl == l && !strncmp(*p, *k, l));
        }
        if (!ok) {
            bi_error_set(err, 0,
                         "Block protocol 'blkdebug' doesn't support the "
                         "option '%.*s'",
                         (int)kl, *p);
            return -EINVAL;
        }
    }
    return 0;
}

/* One size option: 0 when absent; a multiple of mult (0: a power of two)
 * below INT_MAX, else QEMU's "Cannot meet constraints" error. */
static int bd_size(const struct bi_open_opts *o, const char *key, uint64_t mult,
                   uint64_t *out, bi_error *err)
{
    const char *v = bi_filter_opt(o, key);
    *out = 0;
    if (!v)
        return 0;
    if (bi_parse_size(v, out) < 0) {
        bi_error_set(err, 0,
                     "Parameter '%s' expects a non-negative number below "
                     "2^64",
                     key);
        return -EINVAL;
    }
    bool bad =
        *out >= INT_MAX || (mult ? *out % mult != 0 : (*out & (*out - 1)) != 0);
    if (*out && bad) {
        bi_error_set(err, 0, "Cannot meet constraints with %s %" PRIu64, key,
                     *out);
        return -EINVAL;
    }
    return 0;
}

static int bd_limits_opts(bi_node *n, const struct bi_open_opts *o,
                          bi_error *err)
{
    struct bd_state *s = n->opaque;
    int ret = bd_size(o, "align", 0, &s->align, err);
    uint64_t a = BI_MAX(s->align, (uint64_t)n->file->limits.request_alignment);
    if (ret == 0)
        ret = bd_size(o, "max-transfer", a, &s->max_transfer, err);
    if (ret == 0)
        ret = bd_size(o, "opt-write-zero", a, &s->opt_wz, err);
    if (ret == 0)
        ret = bd_size(o, "max-write-zero", a, &s->max_wz, err);
    if (ret == 0)
        ret = bd_size(o, "opt-discard", a, &s->opt_disc, err);
    if (ret == 0)
        ret = bd_size(o, "max-discard", a, &s->max_disc, err);
    return ret;
}

static void bd_event(bi_node *n, enum bi_debug_event ev);
static void bd_close(bi_node *n);

/* The rules: the config file's, then the options'. */
static int bd_load_rules(bi_node *n, const struct bi_open_opts *o,
                         bi_error *err)
{
    struct bd_state *s = n->opaque;
    struct bd_groups g = {0};
    const char *cfg = bi_filter_opt(o, "config");
    int ret = cfg && *cfg ? bd_read_config(cfg, &g, err) : 0;
    if (ret == 0)
        ret = bd_groups_from_opts(o->protocol_opts, &g, err);
    if (ret == 0)
        ret = bd_rules_build(&g, &s->rules, err);
    bd_groups_free(&g);
    if (ret == 0)
        s->active = bi_xzalloc(sizeof(*s->active) * (s->rules.n + 1));
    return ret;
}

/* The image child: image.filename=, image= or the name's x-image=. */
static int bd_open_image(bi_node *n, const struct bi_open_opts *o,
                         bi_error *err)
{
    const char *image = bi_filter_opt(o, "image.filename");
    if (!image)
        image = bi_filter_opt(o, "image");
    if (!image)
        image = bi_filter_opt(o, "x-image");
    if (!image || !*image) {
        bi_error_set(err, 0, "A block device must be specified for \"image\"");
        return -EINVAL;
    }
    struct bi_open_opts co = *o;
    co.protocol_opts = NULL;
    n->file = bi_open_protocol(image, &co, err);
    if (!n->file)
        return -EIO;
    n->file->parent = n;
    n->size = n->file->size;
    n->read_only = n->file->read_only;
    return 0;
}

static int bd_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct bd_state *s = n->opaque;
    int ret = bd_check_keys(o, err);
    if (ret == 0)
        ret = bd_load_rules(n, o, err);
    if (ret == 0)
        ret = bd_open_image(n, o, err);
    if (ret == 0)
        ret = bd_limits_opts(n, o, err);
    if (ret < 0) {
        if (n->file) { /* the caller frees n alone */
            if (n->file->drv->close)
                n->file->drv->close(n->file);
            bi_node_free(n->file);
            n->file = NULL;
        }
        bd_close(n);
        return ret;
    }
    s->state = 1;
    bd_event(n, BI_DBG_NONE);
    return 0;
}

/* Drops n's suspended requests without resuming them: none is left
 * after the drain that precedes a close. */
static void bd_drop_suspended(bi_node *n)
{
    for (struct bd_suspended **p = &bd_suspended_list; *p;) {
        struct bd_suspended *r = *p;
        if (r->node != n) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        free(r->tag);
        free(r);
    }
}

static void bd_close(bi_node *n)
{
    struct bd_state *s = n->opaque;
    while (s->breaks) {
        struct bd_break *b = s->breaks;
        s->breaks = b->next;
        free(b->tag);
        free(b);
    }
    bd_drop_suspended(n);
    free(s->rules.v);
    free(s->active);
    s->rules.v = NULL;
    s->active = NULL;
}

static void bd_refresh_limits(bi_node *n)
{
    struct bd_state *s = n->opaque;
    n->limits = n->file->limits;
    n->limits.request_alignment_source = BI_SRC_CHILD;
    if (s->align) {
        n->limits.request_alignment = (uint32_t)s->align;
        n->limits.request_alignment_source = BI_SRC_DRIVER;
    }
    if (s->max_transfer)
        n->limits.max_transfer = s->max_transfer;
}

/* Whether co still has a suspension nobody resumed. */
static bool bd_holds(bi_co *co)
{
    for (struct bd_suspended *r = bd_suspended_list; r; r = r->next)
        if (r->co == co)
            return true;
    return false;
}

/* QEMU's suspend rules of ev, newest first: each suspends the running
 * request under its tag and is removed; the request then waits until
 * each of its suspensions was resumed. Outside a coroutine (nothing can
 * wait there) the breakpoints stay. */
static void bd_suspend(bi_node *n, enum bi_debug_event ev)
{
    struct bd_state *s = n->opaque;
    bi_co *self = bi_co_self();
    bool any = false;
    for (struct bd_break **p = &s->breaks; self && *p;) {
        struct bd_break *b = *p;
        if (b->event != (int)ev) {
            p = &b->next;
            continue;
        }
        *p = b->next;
        struct bd_suspended *r = bi_xzalloc(sizeof(*r));
        *r = (struct bd_suspended){n, self, b->tag, bd_suspended_list};
        bd_suspended_list = r;
        free(b);
        bi_message(BI_MESSAGE_INFO, "blkdebug: Suspended request '%s'", r->tag);
        any = true;
    }
    while (any && bd_holds(self))
        bi_co_yield(); /* woken spuriously: still suspended */
}

/* Unlinks *p and lets its request go on: at once from outside a
 * coroutine (QEMU enters it), else at the loop's next turn. */
static void bd_release(struct bd_suspended **p)
{
    struct bd_suspended *r = *p;
    bi_co *co = r->co;
    *p = r->next;
    bi_message(BI_MESSAGE_INFO, "blkdebug: Resuming request '%s'", r->tag);
    free(r->tag);
    free(r);
    if (bi_in_co())
        bi_co_wake(co);
    else
        bi_co_enter(co);
}

static int bd_breakpoint(bi_node *n, enum bi_debug_event ev, const char *tag)
{
    struct bd_state *s = n->opaque;
    struct bd_break *b = bi_xzalloc(sizeof(*b));
    *b = (struct bd_break){(int)ev, bi_xstrdup(tag), s->breaks};
    s->breaks = b;
    return 0;
}

/* Resumes n's newest request suspended under tag; -ENOENT if none. */
static int bd_resume(bi_node *n, const char *tag)
{
    for (struct bd_suspended **p = &bd_suspended_list; *p; p = &(*p)->next) {
        if ((*p)->node == n && !strcmp((*p)->tag, tag)) {
            bd_release(p);
            return 0;
        }
    }
    return -ENOENT;
}

/* QEMU 7.2's remove_breakpoint: its answer is whether a breakpoint was
 * removed; resuming the suspended requests does not change it. */
static int bd_remove_breakpoint(bi_node *n, const char *tag)
{
    struct bd_state *s = n->opaque;
    int ret = -ENOENT;
    for (struct bd_break **p = &s->breaks; *p;) {
        struct bd_break *b = *p;
        if (strcmp(b->tag, tag)) {
            p = &b->next;
            continue;
        }
        *p = b->next;
        free(b->tag);
        free(b);
        ret = 0;
    }
    while (bd_resume(n, tag) == 0)
        ;
    return ret;
}

static bool bd_is_suspended(bi_node *n, const char *tag)
{
    for (struct bd_suspended *r = bd_suspended_list; r; r = r->next)
        if (r->node == n && !strcmp(r->tag, tag))
            return true;
    return false;
}

/* The loop's stall hook: resumes the oldest suspended request. */
static bool bd_release_oldest(void)
{
    struct bd_suspended **p = &bd_suspended_list;
    if (!*p)
        return false;
    while ((*p)->next)
        p = &(*p)->next;
    bd_release(p);
    return true;
}

__attribute__((constructor)) static void bd_register_stall_hook(void)
{
    bi_loop_set_stall_hook(bd_release_oldest);
}

/* QEMU's process_rule for every rule of ev, newest first as QEMU keeps
 * them: the first inject-error rule drops the active ones; each is put
 * in front, so that they are checked in the order they were given. */
static void bd_event(bi_node *n, enum bi_debug_event ev)
{
    struct bd_state *s = n->opaque;
    int64_t new_state = s->state;
    bool injected = false;
    for (size_t i = s->rules.n; i-- > 0;) {
        struct bd_rule *r = &s->rules.v[i];
        if (r->removed || r->event != (int)ev ||
            (r->state && r->state != s->state))
            continue;
        if (!r->inject) {
            new_state = r->new_state;
            continue;
        }
        if (!injected)
            s->nactive = 0;
        injected = true;
        memmove(s->active + 1, s->active, s->nactive * sizeof(*s->active));
        s->active[0] = r;
        s->nactive++;
    }
    s->state = new_state;
    bd_suspend(n, ev);
}

/* The error the active rules give a request of type t on [off, off+len)
 * (len 0: flush, matched only by rules without a sector); 0 if none. */
static int bd_check(bi_node *n, uint64_t off, uint64_t len, enum bd_iotype t)
{
    struct bd_state *s = n->opaque;
    for (size_t i = 0; i < s->nactive; i++) {
        struct bd_rule *r = s->active[i];
        bool hit = r->offset == UINT64_MAX ||
                   (len && r->offset >= off && r->offset - off < len);
        if (!hit || !(r->iotype_mask & (1u << t)))
            continue;
        /* QEMU returns -errno as is: a negative errno succeeds there
         * (here the request goes on); a huge one becomes EIO */
        if (r->error <= 0)
            return 0;
        int e = r->error < 4096 ? r->error : EIO;
        if (r->once) {
            r->removed = true;
            memmove(s->active + i, s->active + i + 1,
                    (s->nactive - i - 1) * sizeof(*s->active));
            s->nactive--;
        }
        return -e;
    }
    return 0;
}

static int bd_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                        const struct iovec *iov, int iovcnt)
{
    int ret = bd_check(n, off, len, BD_IO_READ);
    return ret ? ret : bi_co_preadv(n->file, off, len, iov, iovcnt);
}

static int bd_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                         const struct iovec *iov, int iovcnt, int flags)
{
    int ret = bd_check(n, off, len, BD_IO_WRITE);
    return ret ? ret : bi_co_pwritev(n->file, off, len, iov, iovcnt, flags);
}

/* Passes [off, off+len) on in pieces of at most max (0: whole). */
static int bd_split(bi_node *n, uint64_t off, uint64_t len, uint64_t max,
                    int flags, bool zero)
{
    int ret = 0;
    for (uint64_t done = 0; done < len && ret == 0;) {
        uint64_t l = max ? BI_MIN(max, len - done) : len - done;
        ret = zero ? bi_co_pwrite_zeroes(n->file, off + done, l, flags)
                   : bi_co_pdiscard(n->file, off + done, l);
        done += l;
    }
    return ret;
}

static int bd_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                               int flags)
{
    struct bd_state *s = n->opaque;
    uint64_t align = BI_MAX((uint64_t)n->limits.request_alignment, s->opt_wz);
    if (len < align)
        return -ENOTSUP;
    int ret = bd_check(n, off, len, BD_IO_WRITE_ZEROES);
    return ret ? ret : bd_split(n, off, len, s->max_wz, flags, true);
}

static int bd_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    struct bd_state *s = n->opaque;
    uint64_t align = BI_MAX((uint64_t)n->limits.request_alignment, s->opt_disc);
    if (len < align)
        return 0; /* advisory */
    int ret = bd_check(n, off, len, BD_IO_DISCARD);
    return ret ? ret : bd_split(n, off, len, s->max_disc, 0, false);
}

/* The generic layer flushes the file after this. */
static int bd_co_flush(bi_node *n)
{
    /* QEMU checks the rules in flush_to_disk, which it skips when
     * nothing was written since the last flush */
    if (n->write_gen == n->flushed_gen)
        return 0;
    return bd_check(n, 0, 0, BD_IO_FLUSH);
}

static int bd_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                              struct bi_status *st)
{
    int ret = bd_check(n, off, len, BD_IO_BLOCK_STATUS);
    return ret ? ret : bi_co_block_status(n->file, off, len, st);
}

static int bd_co_truncate(bi_node *n, uint64_t size, bool exact,
                          enum bi_prealloc prealloc, bi_error *err)
{
    n->write_gen++;
    return bi_filter_truncate(n, size, exact, prealloc, err);
}

const struct bi_driver bi_drv_blkdebug = {
    .name = "blkdebug",
    .is_protocol = true,
    .state_size = sizeof(struct bd_state),
    .prefixes = bd_prefixes,
    .parse_filename = bd_parse_filename,
    .open = bd_open,
    .close = bd_close,
    .refresh_limits = bd_refresh_limits,
    .co_preadv = bd_co_preadv,
    .co_pwritev = bd_co_pwritev,
    .co_pwrite_zeroes = bd_co_pwrite_zeroes,
    .co_pdiscard = bd_co_pdiscard,
    .co_flush = bd_co_flush,
    .co_truncate = bd_co_truncate,
    .co_block_status = bd_co_block_status,
    .get_allocated_file_size = bi_filter_allocated_size,
    .set_perm = bi_filter_set_perm,
    .debug_event = bd_event,
    .debug_breakpoint = bd_breakpoint,
    .debug_remove_breakpoint = bd_remove_breakpoint,
    .debug_resume = bd_resume,
    .debug_is_suspended = bd_is_suspended,
};
