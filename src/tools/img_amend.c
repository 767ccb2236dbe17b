/* SPDX-License-Identifier: MIT */
/* blkimg amend: qemu-img amend compatible (bi_amend). */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
#include "blkimg/image_ops.h"
#include "common.h"
#include "img.h"
#include "progress.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);
void cv_free_strv(char **v);
char **cv_optlist_strv(const struct bi_optlist *l);

/* qemu-img amend's -o help: the format's amend options, sorted. */
static int print_amend_help(const char *fmt)
{
    const struct bi_opt_desc **v;
    int n;
    if (bi_amend_opt_list(fmt, &v, &n) == 0) {
        printf("Amend options for '%s':\n", fmt);
        img_print_opt_list(v, n);
        free(v);
        return 0;
    }
    if (bi_format_exists(fmt) < 0) {
        cv_err("Unknown file format '%s'", fmt);
        return 1;
    }
    cv_err("Format driver '%s' does not support option amendment", fmt);
    return 1;
}

static bool has_help(const struct bi_optlist *l)
{
    for (int i = 0; i < l->n; i++) {
        if (!l->v[i].value &&
            (!strcmp(l->v[i].key, "help") || !strcmp(l->v[i].key, "?")))
            return true;
    }
    return false;
}

struct amend_progress {
    struct bi_progress *prog;
    bool started; /* the options were accepted */
};

static void status_cb(void *opaque, int64_t offset, int64_t total)
{
    struct amend_progress *ap = opaque;
    if (total == 0) {
        ap->started = true;
        bi_progress_print(ap->prog, 0.f, 0);
        return;
    }
    bi_progress_print(ap->prog, 100.f * (float)offset / (float)total, 0);
}

int img_amend(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"object", required_argument, NULL, 256},
        {"image-opts", no_argument, NULL, 257},
        {"force", no_argument, NULL, 258},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *cache = "writeback";
    bool progress = false, quiet = false, image_opts = false, force = false;
    bool have_opts = false;
    struct bi_optlist opts = {0, NULL};
    struct bi_progress prog;
    enum bi_cache cmode;
    bi_node *node = NULL;
    char **strv = NULL;
    bi_error err;
    int c, ret = 1;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":ho:f:t:pq", long_opts, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            bi_optlist_free(&opts);
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s amend [--object objectdef] [--image-opts] [-p] "
                   "[-q] [-f fmt] [-t cache] [--force] -o options filename\n",
                   program_invocation_short_name);
            bi_optlist_free(&opts);
            return 0;
        case 'o':
            if (bi_optlist_parse(&opts, optarg) < 0) {
                cv_err("Invalid option list: %s", optarg);
                bi_optlist_free(&opts);
                return 1;
            }
            have_opts = true;
            break;
        case 'f':
            fmt = optarg;
            break;
        case 't':
            cache = optarg;
            break;
        case 'p':
            progress = true;
            break;
        case 'q':
            quiet = true;
            break;
        case 256:
            if (tool_object_add(optarg) < 0) {
                bi_optlist_free(&opts);
                return 1;
            }
            break;
        case 257:
            image_opts = true;
            break;
        case 258:
            force = true;
            break;
        }
    }
    if (!have_opts)
        return cv_err_exit("Must specify options (-o)");
    if (quiet)
        progress = false;
    bi_progress_init(&prog, progress ? BI_PROGRESS_QEMU : BI_PROGRESS_NONE,
                     1.0f, "amend");
    const char *filename = optind == argc - 1 ? argv[argc - 1] : NULL;
    if (fmt && has_help(&opts)) {
        ret = print_amend_help(fmt);
        goto out;
    }
    if (optind != argc - 1) {
        cv_err("Expecting one image file name");
        goto out;
    }
    if (bi_cache_parse(cache, &cmode) < 0) {
        cv_err("Invalid cache option: %s", cache);
        goto out;
    }
    node = cv_open(filename, fmt, image_opts, cmode, true, false, quiet);
    if (!node)
        goto out;
    if (has_help(&opts)) {
        ret = print_amend_help(bi_node_format(node));
        goto out;
    }
    strv = cv_optlist_strv(&opts);
    bi_error_init(&err);
    struct amend_progress ap = {&prog, false};
    int r =
        bi_amend(node, (const char *const *)strv, force, status_cb, &ap, &err);
    if (ap.started)
        bi_progress_print(&prog, 100.f, 0);
    if (r < 0) {
        cv_err("%s", err.msg);
        goto out;
    }
    ret = 0;
out:
    bi_progress_end(&prog);
    cv_free_strv(strv);
    bi_optlist_free(&opts);
    if (node) {
        bi_error_init(&err);
        if (bi_close(node, &err) < 0 && ret == 0) {
            cv_err("%s", err.msg);
            ret = 1;
        }
    }
    return ret;
}
