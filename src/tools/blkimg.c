/* SPDX-License-Identifier: MIT */
/*
 * blkimg: disk image utility, command-line compatible with qemu-img 7.2.
 *
 * main() parses the standard options (-h, -V) as qemu-img does, then runs
 * the subcommand from the dispatch table with argv[0] = the command name.
 */
#include "common.h"
#include "img.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef BLKIMG_VERSION
#define BLKIMG_VERSION "0.1.0"
#endif

struct img_cmd {
    const char *name;
    int (*handler)(int argc, char **argv);
};

/* One line per implemented command. */
static const struct img_cmd img_cmds[] = {
    {"amend", img_amend},
    {"bench", img_bench},
    {"bitmap", img_bitmap},
    {"check", img_check},
    {"commit", img_commit},
    {"compare", img_compare},
    {"convert", img_convert},
    {"create", img_create},
    {"dd", img_dd},
    {"info", img_info},
    {"map", img_map},
    {"measure", img_measure},
    {"probe", img_probe},
    {"rebase", img_rebase},
    {"resize", img_resize},
    {"snapshot", img_snapshot},
    {NULL, NULL},
};

/* Command syntax as qemu-img 7.2 prints it (and blkimg's own commands);
 * --help lists those present in img_cmds. */
static const struct {
    const char *name;
    const char *syntax;
} img_syntax[] = {
    {"amend", "amend [--object objectdef] [--image-opts] [-p] [-q] [-f fmt] "
              "[-t cache] [--force] -o options filename"},
    {"bench", "bench [-c count] [-d depth] [-f fmt] "
              "[--flush-interval=flush_interval] [-i aio] [-n] [--no-drain] "
              "[-o offset] [--pattern=pattern] [-q] [-s buffer_size] "
              "[-S step_size] [-t cache] [-w] [-U] filename"},
    {"bitmap", "bitmap (--merge SOURCE | --add | --remove | --clear | "
               "--enable | --disable)... [-b source_file [-F source_fmt]] "
               "[-g granularity] [--object objectdef] [--image-opts | -f fmt] "
               "filename bitmap"},
    {"check", "check [--object objectdef] [--image-opts] [-q] [-f fmt] "
              "[--output=ofmt] [-r [leaks | all]] [-T src_cache] [-U] "
              "filename"},
    {"commit", "commit [--object objectdef] [--image-opts] [-q] [-f fmt] "
               "[-t cache] [-b base] [-r rate_limit] [-d] [-p] filename"},
    {"compare", "compare [--object objectdef] [--image-opts] [-f fmt] "
                "[-F fmt] [-T src_cache] [-p] [-q] [-s] [-U] filename1 "
                "filename2"},
    {"convert",
     "convert [--object objectdef] [--image-opts] [--target-image-opts] "
     "[--target-is-zero] [--bitmaps] [-U] [-C] [-c] [-p] [-q] [-n] [-f fmt] "
     "[-t cache] [-T src_cache] [-O output_fmt] [-B backing_file "
     "[-F backing_fmt]] [-o options] [-l snapshot_param] [-S sparse_size] "
     "[-r rate_limit] [-m num_coroutines] [-W] [--salvage] filename "
     "[filename2 [...]] output_filename"},
    {"create", "create [--object objectdef] [-q] [-f fmt] [-b backing_file "
               "[-F backing_fmt]] [-u] [-o options] filename [size]"},
    {"dd", "dd [--image-opts] [-U] [-f fmt] [-O output_fmt] [bs=block_size] "
           "[count=blocks] [skip=blocks] if=input of=output"},
    {"info", "info [--object objectdef] [--image-opts] [-f fmt] "
             "[--output=ofmt] [--backing-chain] [-U] filename"},
    {"map", "map [--object objectdef] [--image-opts] [-f fmt] "
            "[--start-offset=offset] [--max-length=len] [--output=ofmt] [-U] "
            "filename"},
    {"measure", "measure [--output=ofmt] [-O output_fmt] [-o options] "
                "[--size N | [--object objectdef] [--image-opts] [-f fmt] "
                "[-l snapshot_param] filename]"},
    {"probe", "probe [--image-opts] [-f fmt] [-t cache] [--output=ofmt] "
              "filename"},
    {"snapshot", "snapshot [--object objectdef] [--image-opts] [-U] [-q] "
                 "[-l | -a snapshot | -c snapshot | -d snapshot] filename"},
    {"rebase", "rebase [--object objectdef] [--image-opts] [-U] [-q] "
               "[-f fmt] [-t cache] [-T src_cache] [-p] [-u] -b backing_file "
               "[-F backing_fmt] filename"},
    {"resize", "resize [--object objectdef] [--image-opts] [-f fmt] "
               "[--preallocation=prealloc] [-q] [--shrink] filename "
               "[+ | -]size"},
};

static bool have_cmd(const char *name)
{
    for (const struct img_cmd *c = img_cmds; c->name; c++) {
        if (!strcmp(c->name, name)) {
            return true;
        }
    }
    return false;
}

/* Installed as "qemu-img" (a drop-in), the first line reads as the qemu-img
 * version whose interface we implement, so that scripts checking for a
 * minimum qemu-img version accept it. */
static void print_version(void)
{
    if (!strncmp(tool_prog, "qemu-img", 8)) {
        printf("%s version 7.2.0 (blkimg " BLKIMG_VERSION ")\n", tool_prog);
    } else {
        printf("%s version " BLKIMG_VERSION " (qemu-img 7.2 compatible)\n",
               tool_prog);
    }
    printf("Copyright (c) 2026 the blkimg authors\n");
}

void img_help(void)
{
    print_version();
    char *formats = tool_driver_names(TOOL_FORMATS, ", ", false);
    printf("usage: %s [standard options] command [command options]\n"
           "Disk image utility (%s), command-line compatible with "
           "qemu-img\n"
           "\n"
           "    '-h', '--help'       display this help and exit\n"
           "    '-V', '--version'    output version information and exit\n"
           "\n"
           "Command syntax:\n",
           tool_prog, formats);
    free(formats);
    for (size_t i = 0; i < sizeof(img_syntax) / sizeof(img_syntax[0]); i++) {
        if (have_cmd(img_syntax[i].name)) {
            printf("  %s\n", img_syntax[i].syntax);
        }
    }
    printf(
        "\n"
        "Command parameters:\n"
        "  'filename' is a disk image filename\n"
        "  'objectdef' (--object) is not supported by %s\n"
        "  'fmt' is the disk image format. It is guessed automatically in "
        "most cases\n"
        "  'cache' is the cache mode used to write the output disk image, "
        "the valid\n"
        "    options are: 'none', 'writeback' (default, except for "
        "convert), 'writethrough',\n"
        "    'directsync' and 'unsafe' (default for convert)\n"
        "  'src_cache' is the cache mode used to read input disk images, the "
        "valid\n"
        "    options are the same as for the 'cache' option\n"
        "  'size' is the disk image size in bytes. Optional suffixes\n"
        "    'k' or 'K' (kilobyte, 1024), 'M' (megabyte, 1024k), 'G' "
        "(gigabyte, 1024M),\n"
        "    'T' (terabyte, 1024G), 'P' (petabyte, 1024T) and 'E' (exabyte, "
        "1024P)  are\n"
        "    supported. 'b' is ignored.\n"
        "  'output_filename' is the destination disk image filename\n"
        "  'output_fmt' is the destination format\n"
        "  'options' is a comma separated list of format specific options "
        "in a\n"
        "    name=value format. Use -o help for an overview of the options "
        "supported by\n"
        "    the used format\n"
        "  'ofmt' (--output) takes the format in which the output must be "
        "done (human or json)\n"
        "  '-h' with or without a command shows this help and lists the "
        "supported formats\n"
        "  '-q' use Quiet mode - do not print any output (except errors)\n"
        "  '-U' (--force-share) opens the image without taking the locks "
        "that\n"
        "       conflict with other users (read-only)\n",
        tool_prog);
    if (have_cmd("bench")) {
        printf("\n"
               "Parameters to bench subcommand:\n"
               "  '-c' number of requests (default 75000)\n"
               "  '-d' requests in flight (default 64)\n"
               "  '-i' I/O engine: 'io_uring', 'threads' or 'native' "
               "(served by io_uring)\n"
               "  '-n' native aio, same as '-i native'\n"
               "  '-o' offset of the first request, '-S' step between "
               "requests\n"
               "       (default: the buffer size), '-s' buffer size "
               "(default 4k)\n"
               "  '-w' write instead of read; '--pattern' byte written, "
               "'--flush-interval'\n"
               "       flush every N requests, '--no-drain' do not wait for "
               "requests\n"
               "       in flight before a flush\n"
               "  blkimg extensions:\n"
               "  '--random[=seed]' random offsets: each request goes to a "
               "random multiple\n"
               "       of the step size (-S, default the buffer size) in "
               "[offset, image size);\n"
               "       the sequence is fixed by the seed (default 1)\n"
               "  '--stats' after the run, print the I/O statistics of the "
               "image's protocol\n"
               "       node: I/O calls, bytes read and written, bounced "
               "bytes, read-modify-\n"
               "       write operations, waits on overlapping requests\n"
               "  '--object' an object (a secret for an encrypted image "
               "named with\n"
               "       --image-opts), as the other subcommands take it\n");
    }
    if (have_cmd("probe")) {
        printf("\n"
               "Parameters to probe subcommand:\n"
               "  shows how the image's file is accessed: the direct I/O "
               "limits (request\n"
               "  alignment, minimum and optimal memory alignment, maximum "
               "transfer) and\n"
               "  where each came from, the page size, the file system, the "
               "logical and\n"
               "  physical sector size, and the cache mode ('-t', default "
               "writeback)\n");
    }
    /* qemu-img lists its drivers by name; ours are those that open (a
     * format blkimg only recognises is refused, so it is not listed) */
    const char *names[64];
    size_t n = bi_format_names(BI_FORMAT_OPEN, names, 64);
    printf("\nSupported formats:");
    for (size_t i = 0; i < n && i < 64; i++) {
        printf(" %s", names[i]);
    }
    printf("\n");
    exit(EXIT_SUCCESS);
}

/* The standard options are parsed by hand rather than with getopt_long, so
 * that getopt's state is untouched when a subcommand starts parsing its own
 * options (glibc keeps the '+' ordering of a first parse otherwise). The
 * results, messages included, are those of qemu-img's "+:hVT:" parse. */
static int std_option(int argc, char **argv, int *i)
{
    const char *a = argv[*i];

    if (a[1] == '-') {
        static const char *const names[] = {"help", "version", "trace"};
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        int match = -1, nmatch = 0;
        for (int k = 0; k < 3; k++) {
            if (!strncmp(names[k], a + 2, len)) {
                if (strlen(names[k]) == len) {
                    match = k;
                    nmatch = 1;
                    break;
                }
                match = k;
                nmatch++;
            }
        }
        if (nmatch != 1 || (match != 2 && eq)) {
            (*i)++;
            optind = *i;
            tool_getopt_error('?', argv);
        }
        if (match == 0) {
            img_help();
        }
        if (match == 1) {
            print_version();
            return 0;
        }
        if (!eq && *i + 1 >= argc) {
            (*i)++;
            optind = *i;
            tool_getopt_error(':', argv);
        }
        tool_error("tracing (-T/--trace) is not supported");
        return 1;
    }
    for (const char *c = a + 1; *c; c++) {
        bool last = c[1] == 0;
        switch (*c) {
        case 'h':
            img_help();
        case 'V':
            print_version();
            return 0;
        case 'T':
            if (last && *i + 1 >= argc) {
                optind = *i + 1;
                tool_getopt_error(':', argv);
            }
            tool_error("tracing (-T/--trace) is not supported");
            return 1;
        default:
            optind = last ? *i + 1 : *i;
            tool_getopt_error('?', argv);
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *cmdname;
    int i;

    tool_init(argv[0]);
    if (argc < 2) {
        tool_error_exit("Not enough arguments");
    }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || !a[1]) {
            break;
        }
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        int ret = std_option(argc, argv, &i);
        if (ret >= 0) {
            return ret;
        }
    }
    if (i >= argc) {
        return 0;
    }
    cmdname = argv[i];
    argc -= i;
    argv += i;
    optind = 0; /* subcommands start a fresh getopt parse */

    for (const struct img_cmd *cmd = img_cmds; cmd->name; cmd++) {
        if (!strcmp(cmdname, cmd->name)) {
            return cmd->handler(argc, argv);
        }
    }
    tool_error_exit("Command not found: %s", cmdname);
}
