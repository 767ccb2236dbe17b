/* SPDX-License-Identifier: MIT */
/*
 * blkimg-io: a disk image exerciser with qemu-io 7.2's command line,
 * command language and output.
 *
 * Commands come from -c options (run in order, then exit) or, without -c,
 * from standard input after a "<program>> " prompt (printed whether or not
 * stdin is a terminal, as qemu-io does). The exit code is 1 if opening the
 * image or any command failed, else 0.
 */
#include "common.h"
#include "io_cmds.h"

#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef BLKIMG_VERSION
#define BLKIMG_VERSION "0.1.0"
#endif

static void usage(const char *name)
{
    char *drivers =
        tool_driver_names(TOOL_FORMATS | TOOL_PROTOCOLS, ", ", false);
    printf("Usage: %s [OPTIONS]... [-c STRING]... [file]\n"
           "blkimg disk image exerciser (qemu-io compatible)\n"
           "\n"
           "  --image-opts         the file argument is an option string\n"
           "                       (driver=raw,file.filename=x.img,...)\n"
           "  -c, --cmd STRING     run this command (repeatable; without -c,\n"
           "                       commands are read from standard input)\n"
           "  -f, --format FMT     image format (%s)\n",
           name, drivers);
    free(drivers);
    printf("  --object OBJECTDEF   define TLS credentials for NBD exports\n"
           "                       (tls-creds-psk, tls-creds-x509)\n"
           "  -r, --read-only      open the image read-only\n"
           "  -s, --snapshot       writes go to a temporary overlay; the "
           "image\n"
           "                       itself is not modified\n"
           "  -C, --copy-on-read   data read from a backing file is copied "
           "into\n"
           "                       the image\n"
           "  -n, --nocache        bypass the host page cache, short for "
           "-t none\n"
           "  -m, --misalign       misalign I/O buffers (exercises bouncing)\n"
           "  -k, --native-aio     native AIO (served by io_uring); prefer -i\n"
           "  -i, --aio=MODE       I/O engine: threads, native or io_uring\n"
           "  -t, --cache=MODE     cache mode: none, writeback, writethrough\n"
           "                       (the default, as in qemu-io), directsync,\n"
           "                       unsafe\n"
           "  -d, --discard=MODE   discard mode: unmap (default) or ignore\n"
           "  -U, --force-share    force shared permissions (read-only "
           "images)\n"
           "  --stats              when the image is closed, print the I/O\n"
           "                       engine and the statistics of its protocol\n"
           "                       (file) node: I/O calls, bytes read and\n"
           "                       written, bounced bytes, read-modify-write\n"
           "                       operations, waits on overlapping requests\n"
           "  -h, --help           display this help and exit\n"
           "  -V, --version        output version information and exit\n"
           "\n"
           "Not supported: -T (--trace).\n"
           "\n"
           "See '%s -c help' for information on available commands.\n",
           name);
}

/* ------------------------------------------------------ reading stdin */

/* Lines of at most 1023 bytes (longer ones are split), as qemu-io reads
 * them with a 1024-byte fgets. Own buffering, so that we know whether a
 * line is already waiting while requests are in flight. */
#define MAXLINE 1024
static char inbuf[65536];
static size_t in_start, in_end;
static bool in_eof;

static bool input_buffered(void)
{
    return in_start < in_end || in_eof;
}

static char *fetchline(void)
{
    static char line[MAXLINE];
    size_t n = 0;

    for (;;) {
        while (in_start < in_end && n < MAXLINE - 1) {
            char c = inbuf[in_start++];

            line[n++] = c;
            if (c == '\n') {
                goto done;
            }
        }
        if (n == MAXLINE - 1) {
            goto done;
        }
        if (in_eof) {
            break;
        }
        ssize_t r = read(STDIN_FILENO, inbuf, sizeof(inbuf));

        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            in_eof = true;
            continue;
        }
        in_start = 0;
        in_end = (size_t)r;
    }
    if (n == 0) {
        return NULL;
    }
done:
    line[n] = '\0';
    if (n > 0 && line[n - 1] == '\n') {
        line[n - 1] = '\0';
    }
    return line;
}

/* While a prompt waits for input, requests in flight keep completing. */
static void wait_for_input(void)
{
    for (;;) {
        io_poll(false);
        if (!io_busy() || input_buffered()) {
            return;
        }
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};

        if (poll(&pfd, 1, 1) > 0) {
            return;
        }
    }
}

static int command_loop(char **cmds, int ncmds)
{
    int last_error = 0, ret;
    bool tty = isatty(STDIN_FILENO);

    if (ncmds) {
        for (int i = 0; !io_quit_requested() && i < ncmds; i++) {
            ret = io_command(cmds[i]);
            if (ret < 0) {
                last_error = ret;
            }
        }
        return last_error;
    }
    while (!io_quit_requested()) {
        char *input;

        printf("%s> ", io_progname());
        fflush(stdout);
        wait_for_input();
        input = fetchline();
        if (!input) {
            if (tty) {
                printf("\n");
            }
            break;
        }
        ret = io_command(input);
        if (ret < 0) {
            last_error = ret;
        }
    }
    return last_error;
}

/* -------------------------------------------------------------- main */

enum {
    OPTION_OBJECT = 256,
    OPTION_IMAGE_OPTS,
    OPTION_STATS,
};

int main(int argc, char **argv)
{
    static const struct option lopt[] = {
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"cmd", required_argument, NULL, 'c'},
        {"format", required_argument, NULL, 'f'},
        {"read-only", no_argument, NULL, 'r'},
        {"snapshot", no_argument, NULL, 's'},
        {"nocache", no_argument, NULL, 'n'},
        {"copy-on-read", no_argument, NULL, 'C'},
        {"misalign", no_argument, NULL, 'm'},
        {"native-aio", no_argument, NULL, 'k'},
        {"aio", required_argument, NULL, 'i'},
        {"discard", required_argument, NULL, 'd'},
        {"cache", required_argument, NULL, 't'},
        {"trace", required_argument, NULL, 'T'},
        {"object", required_argument, NULL, OPTION_OBJECT},
        {"image-opts", no_argument, NULL, OPTION_IMAGE_OPTS},
        {"force-share", no_argument, NULL, 'U'},
        {"stats", no_argument, NULL, OPTION_STATS},
        {NULL, 0, NULL, 0},
    };
    const char *sopt = "hVc:d:f:rsnCmki:t:T:U";
    char *prog = basename(bi_xstrdup(argv[0]));
    char **cmds = NULL;
    int ncmds = 0, c, ret;
    const char *format = NULL;
    bool image_opts = false;
    struct io_open_req req;

    signal(SIGPIPE, SIG_IGN);
    tool_install_message_handler();
    io_set_progname(prog);
    tool_prog = prog; /* the shared option parsing warns under it */
    io_open_req_init(&req);

    while ((c = getopt_long(argc, argv, sopt, lopt, NULL)) != -1) {
        switch (c) {
        case 's':
            req.snapshot = true;
            break;
        case 'C':
            req.copy_on_read = true;
            break;
        case 'T':
            io_error_report("tracing (-T) is not supported");
            exit(1);
        case OPTION_OBJECT: {
            bi_error oerr;
            bi_error_init(&oerr);
            int r = bi_object_add(optarg, &oerr);
            if (r < 0) {
                io_error_report("%s", r == -ENOTSUP
                                          ? "--object is not supported"
                                          : oerr.msg);
                exit(1);
            }
            break;
        }
        case 'n':
            req.nocache = true;
            req.writethrough = false;
            break;
        case 'd':
            if (io_parse_discard(optarg, &req.unmap) < 0) {
                io_error_report("Invalid discard option: %s", optarg);
                exit(1);
            }
            break;
        case 'f':
            format = optarg;
            break;
        case 'c':
            cmds = realloc(cmds, sizeof(*cmds) * (size_t)(ncmds + 1));
            if (!cmds) {
                abort();
            }
            cmds[ncmds++] = optarg;
            break;
        case 'r':
            req.read_only = true;
            break;
        case 'm':
            io_set_misalign(true);
            break;
        case 'k':
            req.aio_set = true;
            req.aio = BI_AIO_NATIVE;
            break;
        case 'i':
            if (io_parse_aio(optarg, &req.aio) < 0) {
                io_error_report("Invalid aio option: %s", optarg);
                exit(1);
            }
            req.aio_set = true;
            break;
        case 't':
            if (io_parse_cache_mode(optarg, &req) < 0) {
                io_error_report("Invalid cache option: %s", optarg);
                exit(1);
            }
            break;
        case 'V':
            printf("%s version " BLKIMG_VERSION "\n", prog);
            exit(0);
        case 'h':
            usage(prog);
            exit(0);
        case 'U':
            req.force_share = true;
            break;
        case OPTION_IMAGE_OPTS:
            image_opts = true;
            break;
        case OPTION_STATS:
            io_set_stats(true);
            break;
        default:
            usage(prog);
            exit(1);
        }
    }
    if (argc - optind > 1) {
        usage(prog);
        exit(1);
    }
    if (format && image_opts) {
        io_error_report("--image-opts and -f are mutually exclusive");
        exit(1);
    }
    io_set_image_opts(image_opts);

    if (argc - optind == 1) {
        if (image_opts) {
            if (io_parse_opts(&req.opts, argv[optind]) < 0) {
                exit(1);
            }
            if (io_openfile(NULL, &req)) {
                exit(1);
            }
        } else {
            if (format) {
                /* a literal value: no option-list syntax applies */
                req.opts.v = bi_xzalloc(sizeof(*req.opts.v));
                req.opts.v[0].key = bi_xstrdup("driver");
                req.opts.v[0].value = bi_xstrdup(format);
                req.opts.n = 1;
            }
            if (io_openfile(argv[optind], &req)) {
                exit(1);
            }
        }
    }
    io_open_req_free(&req);

    ret = command_loop(cmds, ncmds);
    free(cmds);
    if (io_shutdown() < 0) {
        ret = -EIO;
    }
    fflush(stdout);
    return ret < 0 ? 1 : 0;
}
