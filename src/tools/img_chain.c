/* SPDX-License-Identifier: MIT */
/* Plumbing shared by blkimg commit and rebase (see img_chain.h). */
#include "img_chain.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bi_node *chain_open(const char *filename, const char *fmt, bool image_opts,
                    enum bi_cache cache, bool no_backing, bool quiet_probe)
{
    struct bi_open_opts o;

    bi_open_opts_init(&o);
    o.cache = cache;
    o.backing_cache = cache;
    o.read_write = true;
    o.no_backing = no_backing;
    o.quiet_probe = quiet_probe;
    return cv_open_opts(filename, fmt, image_opts, &o);
}

char *chain_resolve_backing(const char *overlay, const char *backing)
{
    const char *slash = strrchr(overlay, '/');
    char *r;

    if (backing[0] == '/' || !slash) {
        return strdup(backing);
    }
    if (asprintf(&r, "%.*s%s", (int)(slash - overlay + 1), overlay, backing) <
        0) {
        return NULL;
    }
    return r;
}

static volatile sig_atomic_t chain_cancel;
static volatile sig_atomic_t chain_signal;

static void on_signal(int sig)
{
    chain_signal = sig;
    chain_cancel = 1;
}

int chain_run_copy(struct bi_convert_opts *o, bi_error *err,
                   const char **signame)
{
    struct sigaction sa, old_int, old_term;

    chain_cancel = 0;
    chain_signal = 0;
    o->cancel = &chain_cancel;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int r = bi_convert(o, err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    *signame = chain_signal == SIGTERM ? "SIGTERM" : "SIGINT";
    return r;
}
