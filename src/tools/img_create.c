/* SPDX-License-Identifier: MIT */
/* blkimg create: qemu-img 7.2's "create" (options, messages, exit codes). */
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ -o help */

static int cmp_desc(const void *a, const void *b)
{
    const struct bi_opt_desc *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

void img_print_opt_list(const struct bi_opt_desc **v, int n)
{
    qsort(v, (size_t)n, sizeof(v[0]), cmp_desc);
    for (int i = 0; i < n; i++) {
        char *s =
            bi_xasprintf("%s=<%s>", v[i]->name, bi_opt_type_name(v[i]->type));
        printf("  %-22s - %s\n", s, v[i]->help);
        free(s);
    }
}

/* A format blkimg knows (it may only recognise it) but cannot create:
 * prints qemu-img's refusal (after "filename: " if filename) and returns
 * true. False for any other name. */
static bool cannot_create(const char *filename, const char *fmt)
{
    int caps = bi_format_caps(fmt);
    if (bi_format_exists(fmt) < 0 || (caps & BI_FORMAT_CREATE)) {
        return false;
    }
    tool_error("%s%sFormat driver '%s' does not support image creation",
               filename ? filename : "", filename ? ": " : "", fmt);
    return true;
}

/* qemu-img's print_block_option_help(): the format's creation options,
 * merged with the protocol's when a filename is given, sorted by name. */
int img_print_create_help(const char *filename, const char *fmt)
{
    const struct bi_opt_desc **all;
    int n;

    if (cannot_create(NULL, fmt)) {
        return 1;
    }
    if (bi_create_opt_list_at(fmt, filename, &all, &n) < 0) {
        tool_error("Unknown file format '%s'", fmt);
        return 1;
    }
    if (filename) {
        printf("Supported options:\n");
    } else {
        printf("Supported %s options:\n", fmt);
    }
    img_print_opt_list(all, n);
    if (!filename) {
        printf("\n"
               "The protocol level may support further options.\n"
               "Specify the target filename to include those options.\n");
    }
    free(all);
    return 0;
}

void img_print_formatting(void *opaque, const char *filename,
                          const char *format, const char *const *items, int n)
{
    (void)opaque;
    printf("Formatting '%s', fmt=%s", filename, format);
    for (int i = 0; i < n; i++) {
        printf(" %s", items[i]);
    }
    printf("\n");
    fflush(stdout);
}

/* An option of the format or of the protocol filename is created on. */
static const struct bi_opt_desc *find_opt(const char *fmt, const char *filename,
                                          const char *key)
{
    return bi_create_opt_find_at(fmt, filename, key);
}

static bool has_opt(const char *fmt, const char *filename, const char *key)
{
    return find_opt(fmt, filename, key) != NULL;
}

struct copt {
    char *key, *value;
};

static void free_copts(struct copt *o, int n)
{
    for (int i = 0; i < n; i++) {
        free(o[i].key);
        free(o[i].value);
    }
    free(o);
}

static const char *last_value(const struct copt *o, int n, const char *key)
{
    for (int i = n - 1; i >= 0; i--) {
        if (!strcmp(o[i].key, key)) {
            return o[i].value;
        }
    }
    return NULL;
}

/* Splits "k=v,flag,nok" (",," a literal comma) and checks each value
 * against its type, with qemu's messages (prefixed "<file>: "). */
static int parse_create_options(const char *filename, const char *fmt,
                                const char *s, struct copt **out, int *nout)
{
    struct copt *v = NULL;
    int n = 0;
    const char *p = s;

    while (*p) {
        size_t klen = strcspn(p, "=,");
        char *key, *val;
        if (p[klen] == '=') {
            key = bi_xasprintf("%.*s", (int)klen, p);
            p += klen + 1;
            size_t cap = strlen(p) + 1, m = 0;
            val = bi_xmalloc(cap);
            while (*p) {
                if (*p == ',') {
                    if (p[1] == ',') {
                        val[m++] = ',';
                        p += 2;
                        continue;
                    }
                    break;
                }
                val[m++] = *p++;
            }
            val[m] = 0;
        } else {
            key = bi_xasprintf("%.*s", (int)klen, p);
            p += klen;
            if (!strncmp(key, "no", 2)) {
                char *rest = bi_xstrdup(key + 2);
                free(key);
                key = rest;
                val = bi_xstrdup("off");
            } else {
                val = bi_xstrdup("on");
            }
        }
        if (*p == ',') {
            p++;
        }
        v = realloc(v, sizeof(*v) * (size_t)(n + 1));
        if (!v) {
            abort();
        }
        v[n].key = key;
        v[n].value = val;
        n++;

        const struct bi_opt_desc *d = find_opt(fmt, filename, key);
        if (!d) {
            tool_error("%s: Invalid parameter '%s'", filename, key);
            goto fail;
        }
        if (d->type == BI_OPT_SIZE) {
            uint64_t x;
            if (bi_parse_size(val, &x) < 0) {
                tool_error("%s: Parameter '%s' expects a non-negative number "
                           "below 2^64",
                           filename, key);
                fprintf(stderr, "Optional suffix k, M, G, T, P or E means "
                                "kilo-, mega-, giga-, tera-, peta-\n"
                                "and exabytes, respectively.\n");
                goto fail;
            }
        } else if (d->type == BI_OPT_NUMBER) {
            char *end;
            errno = 0;
            strtoull(val, &end, 0);
            if (errno || end == val || *end || strchr(val, '-')) {
                tool_error("%s: Parameter '%s' expects a number", filename,
                           key);
                goto fail;
            }
        } else if (d->type == BI_OPT_BOOL) {
            if (strcmp(val, "on") && strcmp(val, "off") && strcmp(val, "yes") &&
                strcmp(val, "no") && strcmp(val, "true") &&
                strcmp(val, "false") && strcmp(val, "y") && strcmp(val, "n")) {
                tool_error("%s: Parameter '%s' expects 'on' or 'off'", filename,
                           key);
                goto fail;
            }
        }
    }
    *out = v;
    *nout = n;
    return 0;
fail:
    free_copts(v, n);
    return -1;
}

/* The library's open message is "Could not open '<file>': <cause>". */
static const char *open_cause(const char *msg, const char *file)
{
    char *pre = bi_xasprintf("Could not open '%s': ", file);
    size_t l = strlen(pre);
    const char *r = strncmp(msg, pre, l) ? msg : msg + l;
    free(pre);
    return r;
}

/* qemu's has_help_option(): an element "help" or "?" in the list. */
static bool has_help_option(const char *s)
{
    const char *p = s;
    while (*p) {
        size_t cap = strlen(p) + 1, n = 0;
        char *v = bi_xmalloc(cap);
        while (*p) {
            if (*p == ',') {
                if (p[1] == ',') {
                    v[n++] = ',';
                    p += 2;
                    continue;
                }
                break;
            }
            v[n++] = *p++;
        }
        v[n] = 0;
        if (*p) {
            p++;
        }
        bool help = !strcmp(v, "help") || !strcmp(v, "?");
        free(v);
        if (help) {
            return true;
        }
    }
    return false;
}

/* qemu's is_valid_option_list(). */
static bool valid_option_list(const char *s)
{
    size_t len = strlen(s), i;
    if (!s[0] || s[0] == ',') {
        return false;
    }
    for (i = len; i > 0 && s[i - 1] == ','; i--) {
    }
    return (len - i) % 2 == 0;
}

/* Path of a backing file as the image will resolve it: relative names are
 * relative to the image's directory. */
static char *backing_path(const char *image, const char *backing)
{
    const char *slash = strrchr(image, '/');
    if (backing[0] == '/' || !slash) {
        return bi_xstrdup(backing);
    }
    return bi_xasprintf("%.*s%s", (int)(slash - image + 1), image, backing);
}

int img_create(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"help", no_argument, 0, 'h'},
        {"object", required_argument, 0, 'O'},
        {0, 0, 0, 0},
    };
    const char *fmt = IMG_DEFAULT_FORMAT, *base_fmt = NULL,
               *base_filename = NULL;
    const char *filename;
    char *options = NULL;
    bool quiet = false, unsafe = false;
    uint64_t img_size = 0;
    bool size_set = false;
    int c, ret = 1;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":F:b:f:ho:qu", long_options, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            tool_getopt_error(c, argv);
        case 'h':
            img_help();
        case 'F':
            base_fmt = optarg;
            break;
        case 'b':
            base_filename = optarg;
            break;
        case 'f':
            fmt = optarg;
            break;
        case 'o':
            if (!valid_option_list(optarg)) {
                tool_error("Invalid option list: %s", optarg);
                goto out;
            }
            if (!options) {
                options = bi_xstrdup(optarg);
            } else {
                char *n = bi_xasprintf("%s,%s", options, optarg);
                free(options);
                options = n;
            }
            break;
        case 'q':
            quiet = true;
            break;
        case 'u':
            unsafe = true;
            break;
        case 'O':
            if (tool_object_add(optarg) < 0) {
                goto out;
            }
            break;
        }
    }

    filename = optind < argc ? argv[optind] : NULL;
    if (options && has_help_option(options)) {
        ret = img_print_create_help(filename, fmt);
        goto out;
    }
    if (optind >= argc) {
        tool_error_exit("Expecting image file name");
    }
    optind++;

    if (optind < argc) {
        int64_t sval = tool_cvtnum("image size", argv[optind++]);
        if (sval < 0) {
            goto out;
        }
        img_size = (uint64_t)sval;
        size_set = true;
    }
    if (optind != argc) {
        tool_error_exit("Unexpected argument: %s", argv[optind]);
    }

    bi_error err;
    bi_error_init(&err);

    if (cannot_create(filename, fmt)) {
        goto out;
    }
    if (bi_format_exists(fmt) < 0 ||
        !(bi_format_caps(fmt) & BI_FORMAT_CREATE)) {
        tool_error("%s: Unknown file format '%s'", filename, fmt);
        goto out;
    }

    /* Parse and check -o as qemu's bdrv_img_create() does, before
     * anything is printed or created. */
    struct copt *ol = NULL;
    int n_ol = 0;
    if (options &&
        parse_create_options(filename, fmt, options, &ol, &n_ol) < 0) {
        goto out_opts;
    }
    const char *size_opt = last_value(ol, n_ol, "size");
    if (size_opt) {
        if (size_set) {
            tool_error("%s: The image size must be specified only once",
                       filename);
            goto out_opts;
        }
        bi_parse_size(size_opt, &img_size);
        size_set = true;
    }
    if (base_filename) {
        if (!has_opt(fmt, filename, "backing_file")) {
            tool_error("%s: Backing file not supported for file format '%s'",
                       filename, fmt);
            goto out_opts;
        }
    } else {
        base_filename = last_value(ol, n_ol, "backing_file");
    }
    if (base_fmt) {
        if (!has_opt(fmt, filename, "backing_fmt")) {
            tool_error("%s: Backing file format not supported for file "
                       "format '%s'",
                       filename, fmt);
            goto out_opts;
        }
    } else {
        base_fmt = last_value(ol, n_ol, "backing_fmt");
    }
    if (base_filename) {
        if (!strcmp(filename, base_filename)) {
            tool_error("%s: Error: Trying to create an image with the same "
                       "filename as the backing file",
                       filename);
            goto out_opts;
        }
        if (!base_filename[0]) {
            tool_error("%s: Expected backing file name, got empty string",
                       filename);
            goto out_opts;
        }
    }
    if (base_filename && !unsafe) {
        /* qemu-img opens the backing file: to check it, to see that its
         * format was given, and for the size when none was given */
        struct bi_open_opts bo;
        char *bpath = backing_path(filename, base_filename);
        bi_open_opts_init(&bo);
        bo.format = base_fmt;
        bo.force_share = true;
        bo.quiet_probe = true;
        bi_node *b = bi_open(bpath, &bo, &err);
        if (!b) {
            fprintf(stderr, "%s: %s: %s\nCould not open backing image.\n",
                    tool_prog, filename, open_cause(err.msg, bpath));
            free(bpath);
            goto out_opts;
        }
        free(bpath);
        if (!base_fmt) {
            fprintf(stderr,
                    "%s: %s: Backing file specified without backing format\n"
                    "Detected format of %s.",
                    tool_prog, filename, bi_node_format(b));
            bi_close(b, NULL);
            goto out_opts;
        }
        if (!size_set) {
            int64_t len = bi_getlength(b);
            if (len < 0) {
                tool_error("%s: Could not get size of '%s': %s", filename,
                           base_filename, strerror((int)-len));
                bi_close(b, NULL);
                goto out_opts;
            }
            img_size = (uint64_t)len;
            size_set = true;
        }
        bi_close(b, NULL);
        bi_error_init(&err);
    } else if (base_filename && !base_fmt) {
        tool_error("%s: Backing file specified without backing format",
                   filename);
        goto out_opts;
    }
    if (!size_set) {
        tool_error("%s: Image creation needs a size parameter", filename);
        goto out_opts;
    }

    /* the rest of the -o list (without size) as "key=value" strings */
    char **strv = bi_xzalloc(sizeof(char *) * (size_t)(n_ol + 1));
    int ns = 0;
    for (int i = 0; i < n_ol; i++) {
        if (strcmp(ol[i].key, "size") && strcmp(ol[i].key, "backing_file") &&
            strcmp(ol[i].key, "backing_fmt")) {
            strv[ns++] = bi_xasprintf("%s=%s", ol[i].key, ol[i].value);
        }
    }

    struct bi_create_opts co;
    bi_create_opts_init(&co);
    co.format = fmt;
    co.size = img_size;
    co.size_set = true;
    co.options = (const char *const *)strv;
    co.backing_file = base_filename;
    co.backing_fmt = base_fmt;
    if (!quiet) {
        co.describe = img_print_formatting;
    }
    if (bi_create(filename, &co, &err) < 0) {
        size_t l = strlen(filename);
        if (!strncmp(err.msg, filename, l) && !strncmp(err.msg + l, ": ", 2)) {
            tool_error("%s", err.msg);
        } else {
            tool_error("%s: %s", filename,
                       err.msg[0] ? err.msg : strerror(-err.code));
        }
    } else {
        ret = 0;
    }
    for (int i = 0; i < ns; i++) {
        free(strv[i]);
    }
    free(strv);
out_opts:
    free_copts(ol, n_ol);
out:
    free(options);
    return ret;
}
