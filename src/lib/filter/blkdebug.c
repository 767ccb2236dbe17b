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
 * align and max-transfer become the node's limits; zero writes shorter
 * than opt-write-zero (or the alignment) are refused with ENOTSUP (so the
 * layer above writes zeroes itself), discards shorter than opt-discard
 * are dropped, and longer ones are split at max-write-zero / max-discard.
 */
#include "filter/blkdebug.h"
#include "filter/filter.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct bd_state {
    int64_t state;
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

static void bd_close(bi_node *n)
{
    struct bd_state *s = n->opaque;
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
};
