/* SPDX-License-Identifier: MIT */
/*
 * blkimg-io commands: qemu-io 7.2's command language, output and return
 * values, over the public libblkimg API.
 *
 * Every command returns 0 or a negative errno; the program's exit code is 1
 * if any command failed. Results go to stdout, diagnostics of the command
 * parser (unknown command, bad argument count, no file open) to stderr, as
 * qemu-io does. Asynchronous requests (aio_read, aio_write) report when
 * their completion is collected: at aio_flush, during later synchronous
 * I/O, while waiting at the prompt, or at exit.
 */
#include "io_cmds.h"
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* qemu's largest request: INT_MAX rounded down to 512 bytes. */
#define IO_MAX_BYTES 2147483136ULL
#define MISALIGN_OFFSET 16

enum {
    CMD_NOFILE_OK = 1 << 0, /* runs without an open image */
    CMD_GLOBAL = 1 << 1,    /* never checks the image */
    CMD_WRITE = 1 << 2,     /* needs a writable image */
};

struct cmdinfo {
    const char *name;
    const char *altname;
    int (*func)(int argc, char **argv);
    int argmin; /* -1: no limit */
    int argmax;
    const char *args;
    const char *oneline;
    void (*help)(void);
    unsigned flags;
};

/* ------------------------------------------------------------ state */

static const char *g_prog = "blkimg-io";
static bi_node *g_node;
static const char *g_format_name; /* as shown by "info" */
static bool g_unmap = true;       /* discard=unmap */
static bool g_no_flush;           /* cache.direct=on,cache.no-flush=on */
static bool g_cor;                /* copy-on-read */
static uint64_t g_cor_cluster;    /* granularity of copy-on-read */
static bool g_image_opts;
static bool g_misalign;
static bool g_stats;
static bool g_quit;
/* The request the open image was opened with (for reopen). */
static struct io_open_req g_req;
static char *g_req_name;
static bool g_reopening;

void io_set_progname(const char *name)
{
    g_prog = name;
}
const char *io_progname(void)
{
    return g_prog;
}
void io_set_image_opts(bool on)
{
    g_image_opts = on;
}
void io_set_misalign(bool on)
{
    g_misalign = on;
}
void io_set_stats(bool on)
{
    g_stats = on;
}
bool io_quit_requested(void)
{
    return g_quit;
}

void io_error_report(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", g_prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void io_warn_report(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: warning: ", g_prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ------------------------------------------------ numbers and output */

/* A size argument: qemu_strtosz rules, at most INT64_MAX. */
static int64_t cvtnum(const char *s)
{
    uint64_t v;
    bool hex_suffix = false;
    int ret = bi_parse_size_full(s, &v, &hex_suffix);

    if (hex_suffix) {
        io_warn_report("Using a multiplier suffix on hex numbers is "
                       "deprecated: %s",
                       s);
    }
    if (ret < 0) {
        return ret;
    }
    if (v > INT64_MAX) {
        return -ERANGE;
    }
    return (int64_t)v;
}

static void print_cvtnum_err(int64_t rc, const char *arg)
{
    switch (rc) {
    case -EINVAL:
        printf("Parsing error: non-numeric argument,"
               " or extraneous/unrecognized suffix -- %s\n",
               arg);
        break;
    case -ERANGE:
        printf("Parsing error: argument too large -- %s\n", arg);
        break;
    default:
        printf("Parsing error: %s\n", arg);
    }
}

/* cvtnum() with qemu-io's message on failure: 0, or the negative error. */
static int parse_num(const char *arg, int64_t *out)
{
    int64_t v = cvtnum(arg);
    if (v < 0) {
        print_cvtnum_err(v, arg);
        return (int)v;
    }
    *out = v;
    return 0;
}

/* The OFFSET COUNT pair of read, write and discard (argv[0], argv[1]); a
 * count above IO_MAX_BYTES is refused unless no_limit, the message ending
 * in hint (write: " without -n"). */
static int parse_off_count(char **argv, int64_t *off, int64_t *count,
                           bool no_limit, const char *hint)
{
    int ret = parse_num(argv[0], off);
    if (ret == 0) {
        ret = parse_num(argv[1], count);
    }
    if (ret < 0) {
        return ret;
    }
    if ((uint64_t)*count > IO_MAX_BYTES && !no_limit) {
        printf("length cannot exceed %llu%s, given %s\n", IO_MAX_BYTES, hint,
               argv[1]);
        return -EINVAL;
    }
    return 0;
}

/* qemu-io's human numbers: "%.3f <unit>" in powers of 1024 with ".000"
 * dropped; below 1 KiB "%f bytes" (so also "512 bytes"). */
static void cvtstr(double value, char *str, size_t size)
{
    static const struct {
        int shift;
        const char *suffix;
    } units[] = {{60, " EiB"}, {50, " PiB"}, {40, " TiB"},
                 {30, " GiB"}, {20, " MiB"}, {10, " KiB"}};
    const char *suffix = " bytes";
    char *trim;
    size_t i;

    for (i = 0; i < BI_ARRAY_SIZE(units); i++) {
        double unit = (double)(1ULL << units[i].shift);

        if (value >= unit) {
            suffix = units[i].suffix;
            snprintf(str, size - 4, "%.3f", value / unit);
            break;
        }
    }
    if (i == BI_ARRAY_SIZE(units)) {
        snprintf(str, size - 6, "%f", value);
    }
    trim = strstr(str, ".000");
    if (trim) {
        strcpy(trim, suffix);
    } else {
        strcat(str, suffix);
    }
}

static struct timespec tsub(struct timespec t1, struct timespec t2)
{
    t1.tv_nsec -= t2.tv_nsec;
    if (t1.tv_nsec < 0) {
        t1.tv_nsec += 1000000000L;
        t1.tv_sec--;
    }
    t1.tv_sec -= t2.tv_sec;
    return t1;
}

static double tdiv(double value, struct timespec tv)
{
    return value / ((double)tv.tv_sec + (double)tv.tv_nsec / 1e9);
}

/* Elapsed time as qemu-io prints it: "00.25 sec" under one second, else
 * "H:MM:SS.ss"; always the latter with -C. */
static void timestr(const struct timespec *tv, char *ts, size_t size,
                    bool fixed)
{
    double frac = (double)tv->tv_nsec / 1e9;
    unsigned h = (unsigned)(tv->tv_sec / 3600);
    unsigned m = (unsigned)((tv->tv_sec % 3600) / 60);
    unsigned s = (unsigned)(tv->tv_sec % 60);

    if (fixed || tv->tv_sec) {
        snprintf(ts, size, "%u:%02u:%05.2f", h, m, s + frac);
    } else {
        snprintf(ts, size, "%05.2f sec", frac);
    }
}

static void print_report(const char *op, struct timespec *t, int64_t offset,
                         int64_t count, int64_t total, int cnt, bool Cflag)
{
    char s1[64], s2[64], ts[64];

    timestr(t, ts, sizeof(ts), Cflag);
    if (!Cflag) {
        cvtstr((double)total, s1, sizeof(s1));
        cvtstr(tdiv((double)total, *t), s2, sizeof(s2));
        printf("%s %" PRId64 "/%" PRId64 " bytes at offset %" PRId64 "\n", op,
               total, count, offset);
        printf("%s, %d ops; %s (%s/sec and %.4f ops/sec)\n", s1, cnt, ts, s2,
               tdiv((double)cnt, *t));
    } else {
        printf("%" PRId64 ",%d,%s,%.3f,%.3f\n", total, cnt, ts,
               tdiv((double)total, *t), tdiv((double)cnt, *t));
    }
}

static void dump_buffer(const void *buffer, int64_t offset, int64_t len)
{
    const uint8_t *p = buffer;

    for (int64_t i = 0; i < len; i += 16) {
        int64_t n = BI_MIN(16, len - i);

        printf("%08" PRIx64 ":  ", (uint64_t)(offset + i));
        for (int64_t j = 0; j < n; j++) {
            printf("%02x ", p[i + j]);
        }
        printf(" ");
        for (int64_t j = 0; j < n; j++) {
            putchar(isalnum(p[i + j]) ? p[i + j] : '.');
        }
        printf("\n");
    }
}

/* A pattern byte: any strtol base, 0..255, nothing trailing. */
static int parse_pattern(const char *arg)
{
    char *end = NULL;
    long v = strtol(arg, &end, 0);

    if (v < 0 || v > UCHAR_MAX || *end != '\0') {
        printf("%s is not a valid pattern byte\n", arg);
        return -1;
    }
    return (int)v;
}

static void now(struct timespec *t)
{
    clock_gettime(CLOCK_MONOTONIC, t);
}

/* ------------------------------------------------------------ buffers */

static void *io_alloc(size_t len, int pattern)
{
    size_t extra = g_misalign ? MISALIGN_OFFSET : 0;
    uint8_t *buf = bi_blockalign(g_node, BI_MAX(len + extra, 1));

    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", g_prog);
        abort();
    }
    memset(buf, pattern, len + extra);
    return buf + extra;
}

static void io_free(void *p)
{
    if (p) {
        bi_free_aligned((uint8_t *)p - (g_misalign ? MISALIGN_OFFSET : 0));
    }
}

/* Buffer filled from a file, repeated cyclically up to len. */
static void *io_alloc_from_file(size_t len, const char *file_name)
{
    FILE *f = fopen(file_name, "r");
    uint8_t *buf;
    size_t got;

    if (!f) {
        perror(file_name);
        return NULL;
    }
    buf = io_alloc(len, 0);
    got = fread(buf, 1, len, f);
    if (ferror(f)) {
        perror(file_name);
        goto fail;
    }
    if (got == 0) {
        fprintf(stderr, "%s: file is empty\n", file_name);
        goto fail;
    }
    fclose(f);
    for (size_t done = got; done < len;) {
        size_t n = BI_MIN(got, len - done);

        memcpy(buf + done, buf, n);
        done += n;
    }
    return buf;

fail:
    io_free(buf);
    fclose(f);
    return NULL;
}

/* Vector lengths from argv: one buffer, one iovec entry per length. */
static void *create_iovec(char **argv, int nr, int pattern,
                          struct iovec **iov_out, uint64_t *size_out)
{
    size_t *sizes = bi_xzalloc(sizeof(*sizes) * (size_t)BI_MAX(nr, 1));
    uint64_t count = 0;
    struct iovec *iov;
    uint8_t *buf = NULL, *p;

    for (int i = 0; i < nr; i++) {
        int64_t len = cvtnum(argv[i]);

        if (len < 0) {
            print_cvtnum_err(len, argv[i]);
            goto out;
        }
        if ((uint64_t)len > IO_MAX_BYTES) {
            printf("Argument '%s' exceeds maximum size %llu\n", argv[i],
                   IO_MAX_BYTES);
            goto out;
        }
        if (count > IO_MAX_BYTES - (uint64_t)len) {
            printf("The total number of bytes exceed the maximum size "
                   "%llu\n",
                   IO_MAX_BYTES);
            goto out;
        }
        sizes[i] = (size_t)len;
        count += (uint64_t)len;
    }
    iov = bi_xzalloc(sizeof(*iov) * (size_t)BI_MAX(nr, 1));
    buf = p = io_alloc(count, pattern);
    for (int i = 0; i < nr; i++) {
        iov[i].iov_base = p;
        iov[i].iov_len = sizes[i];
        p += sizes[i];
    }
    *iov_out = iov;
    *size_out = count;
out:
    free(sizes);
    return buf;
}

/* The byte-range check of qemu's BlockBackend: requests must lie within
 * the image. */
static int check_range(int64_t offset, uint64_t bytes)
{
    int64_t len = bi_getlength(g_node);

    if (len < 0) {
        return (int)len;
    }
    if (offset < 0 || offset > len || bytes > (uint64_t)(len - offset)) {
        return -EIO;
    }
    return 0;
}

/* Copy-on-read: after a read, the clusters it touched that are not
 * allocated in the image itself (their data comes from a backing file, or
 * is zero everywhere) are written to the image, whole clusters at a time;
 * ranges that read as zeroes are written as zeroes. */
static int cor_copy(int64_t offset, uint64_t bytes)
{
    uint64_t cs = g_cor_cluster ? g_cor_cluster : 65536, pos, end;
    int64_t len;
    int ret = 0;

    if (!g_cor || bytes == 0 || !bi_node_backing(g_node)) {
        return 0;
    }
    len = bi_getlength(g_node);
    if (len < 0) {
        return (int)len;
    }
    pos = bi_align_down((uint64_t)offset, cs);
    end = BI_MIN(bi_align_up((uint64_t)offset + bytes, cs), (uint64_t)len);
    while (pos < end && ret == 0) {
        struct bi_status st;
        uint64_t n;

        memset(&st, 0, sizeof(st));
        ret = bi_block_status(g_node, pos, end - pos, &st);
        if (ret < 0) {
            return ret;
        }
        n = BI_MIN(st.len, end - pos);
        if (n == 0) {
            break;
        }
        for (uint64_t done = 0;
             !(st.flags & BI_BS_ALLOCATED) && done < n && ret == 0;) {
            size_t c = (size_t)BI_MIN(n - done, 1024 * 1024);
            void *buf = bi_blockalign(g_node, c);

            if (!buf) {
                return -ENOMEM;
            }
            ret = bi_pread(g_node, pos + done, buf, c);
            if (ret == 0 && bi_buf_is_zero(buf, c)) {
                ret = bi_pwrite_zeroes(g_node, pos + done, c, 0);
            } else if (ret == 0) {
                ret = bi_pwrite(g_node, pos + done, buf, c, 0);
            }
            bi_free_aligned(buf);
            done += c;
        }
        pos += n;
    }
    return ret;
}

/* ---------------------------------------------------- async requests */

struct aio_ctx {
    struct iovec *iov;
    int iovcnt;
    uint64_t size;
    int64_t offset;
    uint8_t *buf;
    bool write;
    bool qflag, vflag, Cflag, Pflag, zflag;
    int pattern;
    struct timespec t1, t2;
    int ret;
    struct aio_ctx *next;
};

/* Completed requests, reported in completion order by collect(). */
static struct aio_ctx *done_head, **done_tail = &done_head;
static int aio_outstanding; /* submitted and not yet collected */

static void aio_cb(void *opaque, int ret)
{
    struct aio_ctx *ctx = opaque;

    now(&ctx->t2);
    ctx->ret = ret;
    ctx->next = NULL;
    *done_tail = ctx;
    done_tail = &ctx->next;
}

static void aio_report(struct aio_ctx *ctx)
{
    struct timespec t = tsub(ctx->t2, ctx->t1);

    if (!ctx->write && ctx->ret >= 0) {
        ctx->ret = cor_copy(ctx->offset, ctx->size);
    }

    if (ctx->ret < 0) {
        printf("%s failed: %s\n", ctx->write ? "aio_write" : "readv",
               strerror(-ctx->ret));
        return;
    }
    if (!ctx->write && ctx->Pflag) {
        for (uint64_t i = 0; i < ctx->size; i++) {
            if (ctx->buf[i] != ctx->pattern) {
                printf("Pattern verification failed at offset %" PRId64
                       ", %" PRIu64 " bytes\n",
                       ctx->offset, ctx->size);
                break;
            }
        }
    }
    if (ctx->qflag) {
        return;
    }
    if (!ctx->write && ctx->vflag) {
        dump_buffer(ctx->buf, ctx->offset, (int64_t)ctx->size);
    }
    print_report(ctx->write ? "wrote" : "read", &t, ctx->offset,
                 (int64_t)ctx->size, (int64_t)ctx->size, 1, ctx->Cflag);
}

static void collect(void)
{
    while (done_head) {
        struct aio_ctx *ctx = done_head;

        done_head = ctx->next;
        if (!done_head) {
            done_tail = &done_head;
        }
        aio_outstanding--;
        aio_report(ctx);
        io_free(ctx->buf);
        free(ctx->iov);
        free(ctx);
    }
}

bool io_busy(void)
{
    return aio_outstanding > 0;
}

void io_poll(bool blocking)
{
    if (bi_aio_in_flight() > 0) {
        bi_aio_poll(blocking);
    }
    collect();
}

static void drain(void)
{
    bi_aio_drain();
    collect();
}

static void aio_start(struct aio_ctx *ctx, int flags)
{
    int ret = check_range(ctx->offset, ctx->size);

    aio_outstanding++;
    now(&ctx->t1);
    if (ret < 0) {
        /* Fails without reaching the block layer; reported like any
         * other completion. */
        aio_cb(ctx, ret);
    } else if (ctx->zflag) {
        bi_aio_pwrite_zeroes(g_node, (uint64_t)ctx->offset, ctx->size, flags,
                             aio_cb, ctx);
    } else if (ctx->write) {
        bi_aio_pwritev(g_node, (uint64_t)ctx->offset, ctx->iov, ctx->iovcnt,
                       flags, aio_cb, ctx);
    } else {
        bi_aio_preadv(g_node, (uint64_t)ctx->offset, ctx->iov, ctx->iovcnt,
                      aio_cb, ctx);
    }
}

/* ------------------------------------------------------------ commands */

static void command_usage(const struct cmdinfo *ci)
{
    printf("%s %s -- %s\n", ci->name, ci->args, ci->oneline);
}

/* -------- read */

static int read_f(int argc, char **argv);
static void read_help(void)
{
    printf("\n"
           " Reads bytes from the image at the given offset.\n"
           "\n"
           " Example:\n"
           " 'read -v 512 1k' - reads 1 KiB at offset 512 and dumps it in hex\n"
           "\n"
           " -b, -- read from the VM state rather than the virtual disk\n"
           " -C, -- print the statistics as comma-separated values\n"
           " -l, -- length of the range checked with -P\n"
           " -p, -- accepted and ignored, for compatibility\n"
           " -P, -- check that every byte read equals the pattern\n"
           " -q, -- quiet: no statistics\n"
           " -s, -- start of the range checked with -P\n"
           " -v, -- hex dump of the data read\n"
           "\n");
}
static const struct cmdinfo read_cmd = {
    .name = "read",
    .altname = "r",
    .func = read_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-abCqv] [-P pattern [-s off] [-l len]] off len",
    .oneline = "reads a number of bytes at a specified offset",
    .help = read_help,
};

static int read_f(int argc, char **argv)
{
    struct timespec t1, t2;
    bool Cflag = false, qflag = false, vflag = false;
    bool Pflag = false, sflag = false, lflag = false, bflag = false;
    int c, ret, pattern = 0;
    int64_t offset, count, pattern_offset = 0, pattern_count = 0;
    uint8_t *buf;

    while ((c = getopt(argc, argv, "bCl:pP:qs:v")) != -1) {
        switch (c) {
        case 'b':
            bflag = true;
            break;
        case 'C':
            Cflag = true;
            break;
        case 'l':
            lflag = true;
            pattern_count = cvtnum(optarg);
            if (pattern_count < 0) {
                print_cvtnum_err(pattern_count, optarg);
                return (int)pattern_count;
            }
            break;
        case 'p':
            break;
        case 'P':
            Pflag = true;
            pattern = parse_pattern(optarg);
            if (pattern < 0) {
                return -EINVAL;
            }
            break;
        case 'q':
            qflag = true;
            break;
        case 's':
            sflag = true;
            pattern_offset = cvtnum(optarg);
            if (pattern_offset < 0) {
                print_cvtnum_err(pattern_offset, optarg);
                return (int)pattern_offset;
            }
            break;
        case 'v':
            vflag = true;
            break;
        default:
            command_usage(&read_cmd);
            return -EINVAL;
        }
    }
    if (optind != argc - 2) {
        command_usage(&read_cmd);
        return -EINVAL;
    }
    ret = parse_off_count(argv + optind, &offset, &count, false, "");
    if (ret < 0) {
        return ret;
    }
    if (!Pflag && (lflag || sflag)) {
        command_usage(&read_cmd);
        return -EINVAL;
    }
    if (!lflag) {
        pattern_count = count - pattern_offset;
    }
    if (pattern_count < 0 || pattern_count + pattern_offset > count) {
        printf("pattern verification range exceeds end of read data\n");
        return -EINVAL;
    }
    if (bflag) {
        if (offset % 512) {
            printf("%" PRId64 " is not a sector-aligned value for 'offset'\n",
                   offset);
            return -EINVAL;
        }
        if (count % 512) {
            printf("%" PRId64 " is not a sector-aligned value for 'count'\n",
                   count);
            return -EINVAL;
        }
    }

    /* No buffer for a request that cannot be served (up to 2 GiB). */
    ret = bflag ? 0 : check_range(offset, (uint64_t)count);
    buf = ret == 0 ? io_alloc((size_t)count, 0xab) : NULL;
    now(&t1);
    if (ret == 0 && bflag) {
        ret = bi_vmstate_pread(g_node, (uint64_t)offset, buf, (size_t)count);
    } else if (ret == 0) {
        ret = bi_pread(g_node, (uint64_t)offset, buf, (size_t)count);
    }
    if (ret == 0) {
        ret = cor_copy(offset, (uint64_t)count);
    }
    now(&t2);
    collect();

    if (ret < 0) {
        printf("read failed: %s\n", strerror(-ret));
        goto out;
    }
    ret = 0;
    if (Pflag) {
        for (int64_t i = 0; i < pattern_count; i++) {
            if (buf[pattern_offset + i] != pattern) {
                printf("Pattern verification failed at offset %" PRId64
                       ", %" PRId64 " bytes\n",
                       offset + pattern_offset, pattern_count);
                ret = -EINVAL;
                break;
            }
        }
    }
    if (qflag) {
        goto out;
    }
    if (vflag) {
        dump_buffer(buf, offset, count);
    }
    t2 = tsub(t2, t1);
    print_report("read", &t2, offset, count, count, 1, Cflag);
out:
    io_free(buf);
    return ret;
}

/* -------- readv */

static int readv_f(int argc, char **argv);
static void readv_help(void)
{
    printf("\n"
           " Reads bytes from the image at the given offset into several\n"
           " buffers, one per length given (a vectored read).\n"
           "\n"
           " Example:\n"
           " 'readv -v 512 1k 1k' - reads 2 KiB at offset 512 and dumps them\n"
           "\n"
           " -C, -- print the statistics as comma-separated values\n"
           " -P, -- check that every byte read equals the pattern\n"
           " -v, -- hex dump of the data read\n"
           " -q, -- quiet: no statistics\n"
           "\n");
}
static const struct cmdinfo readv_cmd = {
    .name = "readv",
    .func = readv_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-Cqv] [-P pattern] off len [len..]",
    .oneline = "reads a number of bytes at a specified offset",
    .help = readv_help,
};

static int readv_f(int argc, char **argv)
{
    struct timespec t1, t2;
    bool Cflag = false, qflag = false, vflag = false, Pflag = false;
    int c, ret, nr_iov, pattern = 0;
    int64_t offset;
    uint64_t size = 0;
    struct iovec *iov = NULL;
    uint8_t *buf;

    while ((c = getopt(argc, argv, "CP:qv")) != -1) {
        switch (c) {
        case 'C':
            Cflag = true;
            break;
        case 'P':
            Pflag = true;
            pattern = parse_pattern(optarg);
            if (pattern < 0) {
                return -EINVAL;
            }
            break;
        case 'q':
            qflag = true;
            break;
        case 'v':
            vflag = true;
            break;
        default:
            command_usage(&readv_cmd);
            return -EINVAL;
        }
    }
    if (optind > argc - 2) {
        command_usage(&readv_cmd);
        return -EINVAL;
    }
    ret = parse_num(argv[optind++], &offset);
    if (ret < 0) {
        return ret;
    }
    nr_iov = argc - optind;
    buf = create_iovec(&argv[optind], nr_iov, 0xab, &iov, &size);
    if (!buf) {
        return -EINVAL;
    }

    now(&t1);
    ret = check_range(offset, size);
    if (ret == 0) {
        ret = bi_preadv(g_node, (uint64_t)offset, iov, nr_iov);
    }
    if (ret == 0) {
        ret = cor_copy(offset, size);
    }
    now(&t2);
    collect();

    if (ret < 0) {
        printf("readv failed: %s\n", strerror(-ret));
        goto out;
    }
    ret = 0;
    if (Pflag) {
        for (uint64_t i = 0; i < size; i++) {
            if (buf[i] != pattern) {
                printf("Pattern verification failed at offset %" PRId64
                       ", %" PRIu64 " bytes\n",
                       offset, size);
                ret = -EINVAL;
                break;
            }
        }
    }
    if (qflag) {
        goto out;
    }
    if (vflag) {
        dump_buffer(buf, offset, (int64_t)size);
    }
    t2 = tsub(t2, t1);
    print_report("read", &t2, offset, (int64_t)size, (int64_t)size, 1, Cflag);
out:
    free(iov);
    io_free(buf);
    return ret;
}

/* -------- write */

static int write_f(int argc, char **argv);
static void write_help(void)
{
    printf("\n"
           " Writes bytes to the image at the given offset, by default from a\n"
           " buffer filled with 0xcd.\n"
           "\n"
           " Example:\n"
           " 'write 512 1k' - writes 1 KiB at offset 512\n"
           "\n"
           " -b, -- write to the VM state rather than the virtual disk\n"
           " -c, -- write compressed clusters (formats with compression)\n"
           " -f, -- force unit access: on stable storage when it returns\n"
           " -n, -- with -z, fail rather than write zeroes slowly\n"
           " -p, -- accepted and ignored, for compatibility\n"
           " -P, -- fill the buffer with this byte\n"
           " -s, -- fill the buffer with the contents of a file (repeated)\n"
           " -C, -- print the statistics as comma-separated values\n"
           " -q, -- quiet: no statistics\n"
           " -u, -- with -z, the range may be unmapped (discarded)\n"
           " -z, -- write zeroes without a data buffer\n"
           "\n");
}
static const struct cmdinfo write_cmd = {
    .name = "write",
    .altname = "w",
    .func = write_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-bcCfnquz] [-P pattern | -s source_file] off len",
    .oneline = "writes a number of bytes at a specified offset",
    .help = write_help,
    .flags = CMD_WRITE,
};

static int write_f(int argc, char **argv)
{
    struct timespec t1, t2;
    bool Cflag = false, qflag = false, bflag = false;
    bool Pflag = false, zflag = false, cflag = false, sflag = false;
    int flags = 0, c, ret, pattern = 0xcd;
    int64_t offset, count;
    const char *file_name = NULL;
    uint8_t *buf = NULL;

    while ((c = getopt(argc, argv, "bcCfnpP:qs:uz")) != -1) {
        switch (c) {
        case 'b':
            bflag = true;
            break;
        case 'c':
            cflag = true;
            break;
        case 'C':
            Cflag = true;
            break;
        case 'f':
            flags |= BI_REQ_FUA;
            break;
        case 'n':
            flags |= BI_REQ_NO_FALLBACK;
            break;
        case 'p':
            break;
        case 'P':
            Pflag = true;
            pattern = parse_pattern(optarg);
            if (pattern < 0) {
                return -EINVAL;
            }
            break;
        case 'q':
            qflag = true;
            break;
        case 's':
            sflag = true;
            file_name = optarg;
            break;
        case 'u':
            flags |= BI_REQ_MAY_UNMAP;
            break;
        case 'z':
            zflag = true;
            break;
        default:
            command_usage(&write_cmd);
            return -EINVAL;
        }
    }
    if (optind != argc - 2) {
        command_usage(&write_cmd);
        return -EINVAL;
    }
    if (bflag && zflag) {
        printf("-b and -z cannot be specified at the same time\n");
        return -EINVAL;
    }
    if ((flags & BI_REQ_FUA) && (bflag || cflag)) {
        printf("-f and -b or -c cannot be specified at the same time\n");
        return -EINVAL;
    }
    if ((flags & BI_REQ_NO_FALLBACK) && !zflag) {
        printf("-n requires -z to be specified\n");
        return -EINVAL;
    }
    if ((flags & BI_REQ_MAY_UNMAP) && !zflag) {
        printf("-u requires -z to be specified\n");
        return -EINVAL;
    }
    if (zflag + Pflag + sflag > 1) {
        printf("Only one of -z, -P, and -s "
               "can be specified at the same time\n");
        return -EINVAL;
    }
    ret = parse_off_count(argv + optind, &offset, &count,
                          (flags & BI_REQ_NO_FALLBACK) != 0, " without -n");
    if (ret < 0) {
        return ret;
    }
    if (bflag || cflag) {
        if (offset % 512) {
            printf("%" PRId64 " is not a sector-aligned value for 'offset'\n",
                   offset);
            return -EINVAL;
        }
        if (count % 512) {
            printf("%" PRId64 " is not a sector-aligned value for 'count'\n",
                   count);
            return -EINVAL;
        }
    }
    /* (beyond IO_MAX_BYTES only with -z -n, checked above) */
    ret = bflag ? 0 : check_range(offset, (uint64_t)count);
    if (!zflag) {
        if (sflag) {
            buf = io_alloc_from_file((size_t)count, file_name);
            if (!buf) {
                return -EINVAL;
            }
        } else if (ret == 0) {
            /* no buffer for a request that cannot be served */
            buf = io_alloc((size_t)count, pattern);
        }
    }
    if (!g_unmap) {
        flags &= ~BI_REQ_MAY_UNMAP; /* discard=ignore */
    }

    now(&t1);
    if (ret == 0 && zflag) {
        ret =
            bi_pwrite_zeroes(g_node, (uint64_t)offset, (uint64_t)count, flags);
    } else if (ret == 0 && cflag) {
        ret =
            bi_pwrite_compressed(g_node, (uint64_t)offset, buf, (size_t)count);
    } else if (ret == 0 && bflag) {
        ret = bi_vmstate_pwrite(g_node, (uint64_t)offset, buf, (size_t)count);
    } else if (ret == 0) {
        ret = bi_pwrite(g_node, (uint64_t)offset, buf, (size_t)count, flags);
    }
    now(&t2);
    collect();

    if (ret < 0) {
        printf("write failed: %s\n", strerror(-ret));
        goto out;
    }
    ret = 0;
    if (qflag) {
        goto out;
    }
    t2 = tsub(t2, t1);
    print_report("wrote", &t2, offset, count, count, 1, Cflag);
out:
    io_free(buf);
    return ret;
}

/* -------- writev */

static int writev_f(int argc, char **argv);
static void writev_help(void)
{
    printf("\n"
           " Writes bytes to the image at the given offset from several\n"
           " buffers, one per length given (a vectored write), by default\n"
           " filled with 0xcd.\n"
           "\n"
           " Example:\n"
           " 'writev 512 1k 1k' - writes 2 KiB at offset 512\n"
           "\n"
           " -P, -- fill the buffers with this byte\n"
           " -C, -- print the statistics as comma-separated values\n"
           " -f, -- force unit access: on stable storage when it returns\n"
           " -q, -- quiet: no statistics\n"
           "\n");
}
static const struct cmdinfo writev_cmd = {
    .name = "writev",
    .func = writev_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-Cfq] [-P pattern] off len [len..]",
    .oneline = "writes a number of bytes at a specified offset",
    .help = writev_help,
    .flags = CMD_WRITE,
};

static int writev_f(int argc, char **argv)
{
    struct timespec t1, t2;
    bool Cflag = false, qflag = false;
    int flags = 0, c, ret, nr_iov, pattern = 0xcd;
    int64_t offset;
    uint64_t size = 0;
    struct iovec *iov = NULL;
    uint8_t *buf;

    while ((c = getopt(argc, argv, "CfqP:")) != -1) {
        switch (c) {
        case 'C':
            Cflag = true;
            break;
        case 'f':
            flags |= BI_REQ_FUA;
            break;
        case 'q':
            qflag = true;
            break;
        case 'P':
            pattern = parse_pattern(optarg);
            if (pattern < 0) {
                return -EINVAL;
            }
            break;
        default:
            command_usage(&writev_cmd);
            return -EINVAL;
        }
    }
    if (optind > argc - 2) {
        command_usage(&writev_cmd);
        return -EINVAL;
    }
    ret = parse_num(argv[optind++], &offset);
    if (ret < 0) {
        return ret;
    }
    nr_iov = argc - optind;
    buf = create_iovec(&argv[optind], nr_iov, pattern, &iov, &size);
    if (!buf) {
        return -EINVAL;
    }

    now(&t1);
    ret = check_range(offset, size);
    if (ret == 0) {
        ret = bi_pwritev(g_node, (uint64_t)offset, iov, nr_iov, flags);
    }
    now(&t2);
    collect();

    if (ret < 0) {
        printf("writev failed: %s\n", strerror(-ret));
        goto out;
    }
    ret = 0;
    if (qflag) {
        goto out;
    }
    t2 = tsub(t2, t1);
    print_report("wrote", &t2, offset, (int64_t)size, (int64_t)size, 1, Cflag);
out:
    free(iov);
    io_free(buf);
    return ret;
}

/* -------- aio_read / aio_write / aio_flush */

static int aio_read_f(int argc, char **argv);
static void aio_read_help(void)
{
    printf(
        "\n"
        " Starts an asynchronous vectored read at the given offset, one\n"
        " buffer per length given.\n"
        "\n"
        " Example:\n"
        " 'aio_read -v 512 1k 1k' - reads 2 KiB at offset 512, dumps them\n"
        "\n"
        " The command returns once the request is submitted: its result\n"
        " (and any error or pattern mismatch) is printed when it completes;\n"
        " aio_flush waits for all outstanding requests.\n"
        " -C, -- print the statistics as comma-separated values\n"
        " -P, -- check that every byte read equals the pattern\n"
        " -i, -- account an invalid request and submit nothing\n"
        " -v, -- hex dump of the data read\n"
        " -q, -- quiet: no statistics\n"
        "\n");
}
static const struct cmdinfo aio_read_cmd = {
    .name = "aio_read",
    .func = aio_read_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-Ciqv] [-P pattern] off len [len..]",
    .oneline = "asynchronously reads a number of bytes",
    .help = aio_read_help,
};

static int aio_read_f(int argc, char **argv)
{
    struct aio_ctx *ctx = bi_xzalloc(sizeof(*ctx));
    int c, nr_iov;

    while ((c = getopt(argc, argv, "CP:iqv")) != -1) {
        switch (c) {
        case 'C':
            ctx->Cflag = true;
            break;
        case 'P':
            ctx->Pflag = true;
            ctx->pattern = parse_pattern(optarg);
            if (ctx->pattern < 0) {
                free(ctx);
                return -EINVAL;
            }
            break;
        case 'i':
            printf("injecting invalid read request\n");
            free(ctx);
            return 0;
        case 'q':
            ctx->qflag = true;
            break;
        case 'v':
            ctx->vflag = true;
            break;
        default:
            free(ctx);
            command_usage(&aio_read_cmd);
            return -EINVAL;
        }
    }
    if (optind > argc - 2) {
        free(ctx);
        command_usage(&aio_read_cmd);
        return -EINVAL;
    }
    ctx->offset = cvtnum(argv[optind]);
    if (ctx->offset < 0) {
        int ret = (int)ctx->offset;

        print_cvtnum_err(ret, argv[optind]);
        free(ctx);
        return ret;
    }
    optind++;
    nr_iov = argc - optind;
    ctx->buf = create_iovec(&argv[optind], nr_iov, 0xab, &ctx->iov, &ctx->size);
    if (!ctx->buf) {
        free(ctx);
        return -EINVAL;
    }
    ctx->iovcnt = nr_iov;
    aio_start(ctx, 0);
    return 0;
}

static int aio_write_f(int argc, char **argv);
static void aio_write_help(void)
{
    printf("\n"
           " Starts an asynchronous vectored write at the given offset, one\n"
           " buffer per length given, by default filled with 0xcd.\n"
           "\n"
           " Example:\n"
           " 'aio_write 512 1k 1k' - writes 2 KiB at offset 512\n"
           "\n"
           " The command returns once the request is submitted: its result\n"
           " (and any error) is printed when it completes; aio_flush waits\n"
           " for all outstanding requests.\n"
           " -P, -- fill the buffers with this byte\n"
           " -C, -- print the statistics as comma-separated values\n"
           " -f, -- force unit access: on stable storage when it completes\n"
           " -i, -- account an invalid request and submit nothing\n"
           " -q, -- quiet: no statistics\n"
           " -u, -- with -z, the range may be unmapped (discarded)\n"
           " -z, -- write zeroes without a data buffer\n"
           "\n");
}
static const struct cmdinfo aio_write_cmd = {
    .name = "aio_write",
    .func = aio_write_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-Cfiquz] [-P pattern] off len [len..]",
    .oneline = "asynchronously writes a number of bytes",
    .help = aio_write_help,
    .flags = CMD_WRITE,
};

static int aio_write_f(int argc, char **argv)
{
    struct aio_ctx *ctx = bi_xzalloc(sizeof(*ctx));
    int c, nr_iov, pattern = 0xcd, flags = 0;

    ctx->write = true;
    while ((c = getopt(argc, argv, "CfiqP:uz")) != -1) {
        switch (c) {
        case 'C':
            ctx->Cflag = true;
            break;
        case 'f':
            flags |= BI_REQ_FUA;
            break;
        case 'q':
            ctx->qflag = true;
            break;
        case 'u':
            flags |= BI_REQ_MAY_UNMAP;
            break;
        case 'P':
            pattern = parse_pattern(optarg);
            if (pattern < 0) {
                free(ctx);
                return -EINVAL;
            }
            break;
        case 'i':
            printf("injecting invalid write request\n");
            free(ctx);
            return 0;
        case 'z':
            ctx->zflag = true;
            break;
        default:
            free(ctx);
            command_usage(&aio_write_cmd);
            return -EINVAL;
        }
    }
    if (optind > argc - 2) {
        free(ctx);
        command_usage(&aio_write_cmd);
        return -EINVAL;
    }
    if (ctx->zflag && optind != argc - 2) {
        printf("-z supports only a single length parameter\n");
        free(ctx);
        return -EINVAL;
    }
    if ((flags & BI_REQ_MAY_UNMAP) && !ctx->zflag) {
        printf("-u requires -z to be specified\n");
        free(ctx);
        return -EINVAL;
    }
    if (ctx->zflag && ctx->Pflag) {
        /* As in qemu-io, -P does not set Pflag here: never reached. */
        printf("-z and -P cannot be specified at the same time\n");
        free(ctx);
        return -EINVAL;
    }
    ctx->offset = cvtnum(argv[optind]);
    if (ctx->offset < 0) {
        int ret = (int)ctx->offset;

        print_cvtnum_err(ret, argv[optind]);
        free(ctx);
        return ret;
    }
    optind++;
    if (!g_unmap) {
        flags &= ~BI_REQ_MAY_UNMAP;
    }
    if (ctx->zflag) {
        int64_t count = cvtnum(argv[optind]);

        if (count < 0) {
            print_cvtnum_err(count, argv[optind]);
            free(ctx);
            return (int)count;
        }
        ctx->size = (uint64_t)count;
    } else {
        nr_iov = argc - optind;
        ctx->buf =
            create_iovec(&argv[optind], nr_iov, pattern, &ctx->iov, &ctx->size);
        if (!ctx->buf) {
            free(ctx);
            return -EINVAL;
        }
        ctx->iovcnt = nr_iov;
    }
    aio_start(ctx, flags);
    return 0;
}

static int aio_flush_f(int argc, char **argv)
{
    drain();
    return 0;
}
static const struct cmdinfo aio_flush_cmd = {
    .name = "aio_flush",
    .func = aio_flush_f,
    .oneline = "completes all outstanding aio requests",
};

/* -------- break, remove_break, resume, wait_break: the breakpoints of
 * a fault-injection filter below the image (blkdebug), as qemu-io 7.2's.
 * A request suspended at one is in flight; the filter's "Suspended" and
 * "Resuming" lines reach stdout through the message handler. */

static int break_f(int argc, char **argv)
{
    int ret = bi_debug_breakpoint(g_node, argv[1], argv[2]);

    if (ret < 0) {
        printf("Could not set breakpoint: %s\n", strerror(-ret));
    }
    return ret;
}
static const struct cmdinfo break_cmd = {
    .name = "break",
    .func = break_f,
    .argmin = 2,
    .argmax = 2,
    .args = "event tag",
    .oneline = "sets a breakpoint on event and tags the stopped request as tag",
};

static int remove_break_f(int argc, char **argv)
{
    int ret = bi_debug_remove_breakpoint(g_node, argv[1]);

    collect();
    if (ret < 0) {
        printf("Could not remove breakpoint %s: %s\n", argv[1], strerror(-ret));
    }
    return ret;
}
static const struct cmdinfo remove_break_cmd = {
    .name = "remove_break",
    .func = remove_break_f,
    .argmin = 1,
    .argmax = 1,
    .args = "tag",
    .oneline = "remove a breakpoint by tag",
};

static int resume_f(int argc, char **argv)
{
    int ret = bi_debug_resume(g_node, argv[1]);

    collect();
    if (ret < 0) {
        printf("Could not resume request: %s\n", strerror(-ret));
    }
    return ret;
}
static const struct cmdinfo resume_cmd = {
    .name = "resume",
    .func = resume_f,
    .argmin = 1,
    .argmax = 1,
    .args = "tag",
    .oneline = "resumes the request tagged as tag",
};

/* qemu-io waits forever when no request can reach the tag (or no filter
 * has breakpoints); blkimg-io says so instead. */
static int wait_break_f(int argc, char **argv)
{
    int ret = bi_debug_wait(g_node, argv[1]);

    collect();
    if (ret < 0) {
        printf("Could not wait for request '%s': %s\n", argv[1],
               strerror(-ret));
    }
    return ret;
}
static const struct cmdinfo wait_break_cmd = {
    .name = "wait_break",
    .func = wait_break_f,
    .argmin = 1,
    .argmax = 1,
    .args = "tag",
    .oneline = "waits for the suspension of a request",
};

/* -------- flush, truncate, length, info */

static int flush_f(int argc, char **argv)
{
    int ret = 0;

    if (!g_no_flush) {
        ret = bi_flush(g_node);
    }
    collect();
    return ret;
}
static const struct cmdinfo flush_cmd = {
    .name = "flush",
    .altname = "f",
    .func = flush_f,
    .oneline = "flush all in-core file state to disk",
};

static int truncate_f(int argc, char **argv);
static const struct cmdinfo truncate_cmd = {
    .name = "truncate",
    .altname = "t",
    .func = truncate_f,
    .argmin = 1,
    .argmax = 3,
    .args = "[-m prealloc_mode] off",
    .oneline = "truncates the current file at the given offset",
    .flags = CMD_WRITE,
};

static int truncate_f(int argc, char **argv)
{
    enum bi_prealloc prealloc = BI_PREALLOC_OFF;
    bi_error err;
    int64_t offset;
    int c, ret;

    while ((c = getopt(argc, argv, "m:")) != -1) {
        switch (c) {
        case 'm':
            if (bi_prealloc_parse(optarg, &prealloc) < 0) {
                io_error_report("Invalid preallocation mode '%s'", optarg);
                return -EINVAL;
            }
            break;
        default:
            command_usage(&truncate_cmd);
            return -EINVAL;
        }
    }
    if (optind >= argc) {
        command_usage(&truncate_cmd);
        return -EINVAL;
    }
    offset = cvtnum(argv[optind]);
    if (offset < 0) {
        /* qemu-io names argv[1] here, whatever the option layout. */
        print_cvtnum_err(offset, argv[1]);
        return (int)offset;
    }
    bi_error_init(&err);
    ret = bi_truncate(g_node, (uint64_t)offset, false, prealloc, &err);
    collect();
    if (ret < 0) {
        io_error_report("%s", err.msg[0] ? err.msg : strerror(-ret));
        return ret;
    }
    return 0;
}

static int length_f(int argc, char **argv)
{
    int64_t size = bi_getlength(g_node);
    char s1[64];

    if (size < 0) {
        printf("getlength: %s\n", strerror((int)-size));
        return (int)size;
    }
    cvtstr((double)size, s1, sizeof(s1));
    printf("%s\n", s1);
    return 0;
}
static const struct cmdinfo length_cmd = {
    .name = "length",
    .altname = "l",
    .func = length_f,
    .oneline = "gets the length of the current file",
};

static int info_f(int argc, char **argv)
{
    struct bi_image_info *info = bi_xzalloc(sizeof(*info));
    bi_error err;
    char s1[64], s2[64];
    int ret;

    printf("format name: %s\n", g_format_name);
    if (bi_node_file(g_node) == g_node || !bi_node_file(g_node)) {
        /* a protocol node: qemu shows its protocol name as well */
        printf("format name: %s\n", g_format_name);
    }
    bi_error_init(&err);
    ret = bi_get_info(g_node, info, &err);
    if (ret < 0) {
        if (err.msg[0]) {
            io_error_report("%s", err.msg);
        }
        bi_info_free(info);
        free(info);
        return ret;
    }
    cvtstr((double)info->cluster_size, s1, sizeof(s1));
    cvtstr((double)info->vm_state_offset, s2, sizeof(s2));
    printf("cluster size: %s\n", s1);
    printf("vm state offset: %s\n", s2);
    if (info->specific) {
        printf("Format specific information:\n");
        bi_value_print_human(stdout, 1, info->specific);
    }
    bi_info_free(info);
    free(info);
    return 0;
}
static const struct cmdinfo info_cmd = {
    .name = "info",
    .altname = "i",
    .func = info_f,
    .oneline = "prints information about the current file",
};

/* -------- discard */

static int discard_f(int argc, char **argv);
static void discard_help(void)
{
    printf("\n"
           " Discards (unmaps) bytes of the image at the given offset.\n"
           "\n"
           " Example:\n"
           " 'discard 512 1k' - discards 1 KiB at offset 512\n"
           "\n"
           " -C, -- print the statistics as comma-separated values\n"
           " -q, -- quiet: no statistics\n"
           "\n");
}
static const struct cmdinfo discard_cmd = {
    .name = "discard",
    .altname = "d",
    .func = discard_f,
    .argmin = 2,
    .argmax = -1,
    .args = "[-Cq] off len",
    .oneline = "discards a number of bytes at a specified offset",
    .help = discard_help,
    .flags = CMD_WRITE,
};

static int discard_f(int argc, char **argv)
{
    struct timespec t1, t2;
    bool Cflag = false, qflag = false;
    int c, ret;
    int64_t offset, bytes;

    while ((c = getopt(argc, argv, "Cq")) != -1) {
        switch (c) {
        case 'C':
            Cflag = true;
            break;
        case 'q':
            qflag = true;
            break;
        default:
            command_usage(&discard_cmd);
            return -EINVAL;
        }
    }
    if (optind != argc - 2) {
        command_usage(&discard_cmd);
        return -EINVAL;
    }
    ret = parse_off_count(argv + optind, &offset, &bytes, false, "");
    if (ret < 0) {
        return ret;
    }

    now(&t1);
    ret = check_range(offset, (uint64_t)bytes);
    if (ret == 0 && g_unmap) {
        ret = bi_pdiscard(g_node, (uint64_t)offset, (uint64_t)bytes);
    }
    now(&t2);
    collect();
    if (ret < 0) {
        printf("discard failed: %s\n", strerror(-ret));
        return ret;
    }
    if (!qflag) {
        t2 = tsub(t2, t1);
        print_report("discard", &t2, offset, bytes, bytes, 1, Cflag);
    }
    return 0;
}

/* -------- alloc, map */

/* Allocation in this layer of [off, off+bytes), clamped to the image:
 * 1 allocated, 0 not, *pnum bytes of that kind (0 at or past the end). */
static int is_allocated(int64_t off, int64_t bytes, int64_t *pnum)
{
    int64_t len = bi_getlength(g_node);
    struct bi_status st;
    int ret;

    if (len < 0) {
        return (int)len;
    }
    if (off >= len || bytes <= 0) {
        *pnum = 0;
        return 0;
    }
    bytes = BI_MIN(bytes, len - off);
    memset(&st, 0, sizeof(st));
    ret = bi_block_status(g_node, (uint64_t)off, (uint64_t)bytes, &st);
    if (ret < 0) {
        return ret;
    }
    *pnum = (int64_t)BI_MIN(st.len, (uint64_t)bytes);
    return (st.flags & BI_BS_ALLOCATED) ? 1 : 0;
}

static int alloc_f(int argc, char **argv)
{
    int64_t offset, start, remaining, count, num, sum_alloc = 0;
    char s1[64];
    int ret;

    start = offset = cvtnum(argv[1]);
    if (offset < 0) {
        print_cvtnum_err(offset, argv[1]);
        return (int)offset;
    }
    if (argc == 3) {
        count = cvtnum(argv[2]);
        if (count < 0) {
            print_cvtnum_err(count, argv[2]);
            return (int)count;
        }
    } else {
        count = 512;
    }
    remaining = count;
    while (remaining) {
        ret = is_allocated(offset, remaining, &num);
        if (ret < 0) {
            printf("is_allocated failed: %s\n", strerror(-ret));
            return ret;
        }
        offset += num;
        remaining -= num;
        if (ret) {
            sum_alloc += num;
        }
        if (num == 0) {
            count -= remaining;
            remaining = 0;
        }
    }
    cvtstr((double)start, s1, sizeof(s1));
    printf("%" PRId64 "/%" PRId64 " bytes allocated at offset %s\n", sum_alloc,
           count, s1);
    return 0;
}
static const struct cmdinfo alloc_cmd = {
    .name = "alloc",
    .altname = "a",
    .func = alloc_f,
    .argmin = 1,
    .argmax = 2,
    .args = "offset [count]",
    .oneline = "checks if offset is allocated in the file",
};

/* The longest run of one allocation state from offset. */
static int map_is_allocated(int64_t offset, int64_t bytes, int64_t *pnum)
{
    int64_t num;
    int ret, firstret;

    ret = is_allocated(offset, bytes, &num);
    if (ret < 0) {
        return ret;
    }
    firstret = ret;
    *pnum = num;
    while (bytes > 0 && ret == firstret) {
        offset += num;
        bytes -= num;
        ret = is_allocated(offset, bytes, &num);
        if (ret == firstret && num) {
            *pnum += num;
        } else {
            break;
        }
    }
    return firstret;
}

static int map_f(int argc, char **argv)
{
    int64_t offset = 0, bytes, num;
    char s1[64], s2[64];
    int ret;

    bytes = bi_getlength(g_node);
    if (bytes < 0) {
        io_error_report("Failed to query image length: %s",
                        strerror((int)-bytes));
        return (int)bytes;
    }
    while (bytes) {
        ret = map_is_allocated(offset, bytes, &num);
        if (ret < 0) {
            io_error_report("Failed to get allocation status: %s",
                            strerror(-ret));
            return ret;
        } else if (!num) {
            io_error_report("Unexpected end of image");
            return -EIO;
        }
        cvtstr((double)num, s1, sizeof(s1));
        cvtstr((double)offset, s2, sizeof(s2));
        printf("%s (0x%" PRIx64 ") bytes %s at offset %s (0x%" PRIx64 ")\n", s1,
               (uint64_t)num, ret ? "    allocated" : "not allocated", s2,
               (uint64_t)offset);
        offset += num;
        bytes -= num;
    }
    return 0;
}
static const struct cmdinfo map_cmd = {
    .name = "map",
    .func = map_f,
    .argmin = 0,
    .argmax = 0,
    .args = "",
    .oneline = "prints the allocated areas of a file",
};

/* -------- sleep, abort, sigraise */

static int sleep_f(int argc, char **argv)
{
    struct timespec deadline, t;
    char *end;
    long ms = strtol(argv[1], &end, 0);

    if (ms < 0 || *end != '\0') {
        printf("%s is not a valid number\n", argv[1]);
        return -EINVAL;
    }
    now(&deadline);
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    /* Requests in flight keep completing while we wait. */
    for (;;) {
        struct timespec left, step = {0, 1000000L};

        now(&t);
        left = tsub(deadline, t);
        if (left.tv_sec < 0 || (left.tv_sec == 0 && left.tv_nsec == 0)) {
            break;
        }
        if (bi_aio_in_flight() > 0) {
            io_poll(false);
            if (left.tv_sec == 0 && left.tv_nsec < step.tv_nsec) {
                step = left;
            }
            nanosleep(&step, NULL);
        } else {
            collect();
            nanosleep(&left, NULL);
        }
    }
    return 0;
}
static const struct cmdinfo sleep_cmd = {
    .name = "sleep",
    .func = sleep_f,
    .argmin = 1,
    .argmax = 1,
    .oneline = "waits for the given value in milliseconds",
    .flags = CMD_NOFILE_OK,
};

static int abort_f(int argc, char **argv)
{
    abort(); /* a crash: buffered output is lost, as with qemu-io */
}
static const struct cmdinfo abort_cmd = {
    .name = "abort",
    .func = abort_f,
    .oneline = "simulate a program crash using abort(3)",
    .flags = CMD_NOFILE_OK,
};

static int sigraise_f(int argc, char **argv)
{
    int64_t sig = cvtnum(argv[1]);

    if (sig < 0) {
        print_cvtnum_err(sig, argv[1]);
        return (int)sig;
    } else if (sig > NSIG) {
        printf("signal argument '%s' is too large to be a valid signal\n",
               argv[1]);
        return -EINVAL;
    }
    fflush(stdout);
    fflush(stderr);
    raise((int)sig);
    return 0;
}
static void sigraise_help(void)
{
    printf("\n"
           " Sends the given signal number to this process.\n"
           "\n"
           " Example:\n"
           " 'sigraise %d' - raises SIGTERM\n"
           "\n",
           SIGTERM);
}
static const struct cmdinfo sigraise_cmd = {
    .name = "sigraise",
    .func = sigraise_f,
    .argmin = 1,
    .argmax = 1,
    .args = "signal",
    .oneline = "raises a signal",
    .help = sigraise_help,
    .flags = CMD_NOFILE_OK,
};

/* -------- open, close, quit */

static void print_stats(bi_node *n)
{
    bi_node *file = bi_node_file(n); /* n itself for a protocol node */
    struct bi_stats st;

    if (!file) {
        file = n;
    }
    bi_node_stats(file, &st);
    printf("stats for '%s' (protocol node):\n", bi_node_filename(file));
    printf("  aio engine: %s\n", bi_aio_engine_name());
    printf("  io calls: %" PRIu64 "\n", st.io_calls);
    printf("  bytes read: %" PRIu64 "\n", st.bytes_read);
    printf("  bytes written: %" PRIu64 "\n", st.bytes_written);
    printf("  bounced bytes: %" PRIu64 "\n", st.bounced_bytes);
    printf("  rmw operations: %" PRIu64 "\n", st.rmw_ops);
    printf("  serialised waits: %" PRIu64 "\n", st.serialised_waits);
}

static int close_image(void)
{
    bi_error err;
    int ret;

    drain();
    if (g_stats) {
        print_stats(g_node);
    }
    bi_error_init(&err);
    ret = bi_close(g_node, &err);
    g_node = NULL;
    if (ret < 0) {
        io_error_report("%s", err.msg[0] ? err.msg : strerror(-ret));
    }
    return ret;
}

static int close_f(int argc, char **argv)
{
    return close_image();
}
static const struct cmdinfo close_cmd = {
    .name = "close",
    .altname = "c",
    .func = close_f,
    .oneline = "close the current open file",
};

void io_open_req_init(struct io_open_req *r)
{
    memset(r, 0, sizeof(*r));
    r->writethrough = true;
    r->unmap = true;
}

void io_open_req_free(struct io_open_req *r)
{
    bi_optlist_free(&r->opts);
}

int io_parse_cache_mode(const char *s, struct io_open_req *r)
{
    if (!strcmp(s, "off") || !strcmp(s, "none")) {
        r->nocache = true;
        r->no_flush = false;
        r->writethrough = false;
    } else if (!strcmp(s, "directsync")) {
        r->nocache = true;
        r->no_flush = false;
        r->writethrough = true;
    } else if (!strcmp(s, "writeback")) {
        r->nocache = false;
        r->no_flush = false;
        r->writethrough = false;
    } else if (!strcmp(s, "unsafe")) {
        r->nocache = false;
        r->no_flush = true;
        r->writethrough = false;
    } else if (!strcmp(s, "writethrough")) {
        r->nocache = false;
        r->no_flush = false;
        r->writethrough = true;
    } else {
        return -EINVAL;
    }
    return 0;
}

int io_parse_aio(const char *s, enum bi_aio *out)
{
    if (!strcmp(s, "threads")) {
        *out = BI_AIO_THREADS;
    } else if (!strcmp(s, "native")) {
        *out = BI_AIO_NATIVE;
    } else if (!strcmp(s, "io_uring")) {
        *out = BI_AIO_IO_URING;
    } else {
        return -EINVAL;
    }
    return 0;
}

int io_parse_discard(const char *s, bool *unmap)
{
    if (!strcmp(s, "off") || !strcmp(s, "ignore")) {
        *unmap = false;
    } else if (!strcmp(s, "on") || !strcmp(s, "unmap")) {
        *unmap = true;
    } else {
        return -EINVAL;
    }
    return 0;
}

int io_parse_opts(struct bi_optlist *l, const char *s)
{
    int first = l->n;

    if (bi_optlist_parse(l, s) < 0) {
        io_error_report("Invalid option list: %s", s);
        return -EINVAL;
    }
    for (int i = first; i < l->n; i++) {
        struct bi_opt *o = &l->v[i];

        if (o->key[0] == '\0') {
            io_error_report("Invalid parameter ''");
            return -EINVAL;
        }
        if (!o->value) {
            /* Short-form booleans: "key" is key=on, "nokey" key=off. */
            bool neg = strncmp(o->key, "no", 2) == 0;
            char *key = bi_xstrdup(neg ? o->key + 2 : o->key);

            io_warn_report("short-form boolean option '%s' deprecated", key);
            fprintf(stderr, "Please use %s=%s instead\n", key,
                    neg ? "off" : "on");
            free(o->key);
            o->key = key;
            o->value = bi_xstrdup(neg ? "off" : "on");
        }
    }
    return 0;
}

/* Last value of key, or NULL. */
static const char *opt_get(const struct bi_optlist *l, const char *key)
{
    for (int i = l->n - 1; i >= 0; i--) {
        if (strcmp(l->v[i].key, key) == 0) {
            return l->v[i].value;
        }
    }
    return NULL;
}

/* qemu's boolean option values; -1 if not one. */
static int parse_bool(const char *v)
{
    if (!strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true") ||
        !strcmp(v, "y")) {
        return 1;
    }
    if (!strcmp(v, "off") || !strcmp(v, "no") || !strcmp(v, "false") ||
        !strcmp(v, "n")) {
        return 0;
    }
    return -1;
}

/* Options the tool itself interprets (everything else without a "file."
 * prefix goes to the format driver). */
static const char *const generic_opts[] = {
    "driver",         "file",        "file.filename", "file.driver",
    "file.locking",   "file.aio",    "cache.direct",  "cache.no-flush",
    "read-only",      "force-share", "discard",       "node-name",
    "file.node-name", "filename",    "detect-zeroes", NULL,
};

/* A protocol driver other than file (nbd). */
static bool other_protocol(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_PROTOCOL) && strcmp(name, "file");
}

/* A protocol driver, file included (driver=file,filename=...). */
static bool is_protocol_driver(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_PROTOCOL);
}

/* A file.driver that names a format standing as the image's file (raw
 * with offset and size: a disk inside an OVA); its keys go to the
 * library as the file's. */
static bool file_format_driver(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_OPEN) && !(caps & BI_FORMAT_PROTOCOL);
}

static bool is_generic_opt(const char *key)
{
    for (int i = 0; generic_opts[i]; i++) {
        if (strcmp(generic_opts[i], key) == 0) {
            return true;
        }
    }
    return false;
}

/* bi_open words its errors as qemu-img does: "Could not open 'f': <cause>".
 * qemu-io prints the cause alone ("Image is not in qcow2 format", "Unknown
 * driver 'x'"), except for failures of the file itself, which read "Could
 * not open 'f': No such file or directory" in both tools. */
static const char *open_error_text(const bi_error *err, const char *fname)
{
    char *wrap = bi_xasprintf("Could not open '%s': ", fname ? fname : "");
    size_t n = strlen(wrap);
    const char *inner = err->msg;

    if (strncmp(err->msg, wrap, n) == 0 && err->msg[n]) {
        inner = err->msg + n;
        if (err->code && strcmp(inner, strerror(-err->code)) == 0) {
            inner = err->msg; /* a bare errno: the file's own failure */
        }
    }
    free(wrap);
    return inner;
}

/* Checks a format option ("key=value") against what the format takes;
 * prints the error (after prefix) and returns -EINVAL if it does not. */
static int check_driver_opt(const char *prefix, const char *fmt, const char *kv)
{
    size_t kl = strcspn(kv, "=");
    char msg[1024];

    if (kl == 7 && !strncmp(kv, "backing", 7)) {
        /* a node name, and qemu-io has no other nodes */
        io_error_report("%sCould not open backing file: Cannot find "
                        "device='%s' nor node-name='%s'",
                        prefix, kv + 8, kv + 8);
        return -EINVAL;
    }
    if (kl >= 7 && !strncmp(kv, "backing", 7) && kv[7] == '.' &&
        tool_check_driver_opt(fmt, kv, msg, sizeof(msg)) < 0) {
        /* the backing file's options a format takes (its key secret) */
        io_error_report("%sOption '%.*s' is not supported", prefix, (int)kl,
                        kv);
        return -EINVAL;
    }
    if (tool_check_driver_opt(fmt, kv, msg, sizeof(msg)) < 0) {
        io_error_report("%s%s", prefix, msg);
        return -EINVAL;
    }
    return 0;
}

/* As qemu-io: the format of -s's temporary overlay, and the format an
 * image opened without one is named by in messages. */
#define IO_OVERLAY_FORMAT "qcow2"
#define IO_DEFAULT_FORMAT "raw"

/* Snapshot mode (-s): the image, opened read-only, becomes the backing
 * file of a temporary qcow2 overlay that takes all writes; the overlay is
 * unlinked once open, so it disappears with the process. */
static bi_node *open_snapshot(bi_node *base, const char *fname,
                              const struct bi_open_opts *bo, const char *prefix)
{
    const char *dir = getenv("TMPDIR");
    char *tmp, *real = realpath(fname, NULL);
    struct bi_create_opts co;
    struct bi_open_opts o = *bo;
    const char *fmt = bi_node_format(base);
    int64_t size = bi_getlength(base);
    bi_node *n = NULL;
    bi_error err;
    int fd;

    tmp = bi_xasprintf("%s/blkimg-io-snapshot.XXXXXX",
                       dir && *dir ? dir : "/var/tmp");
    bi_close(base, NULL);
    if (!real || size < 0) {
        io_error_report("%sCould not resolve '%s': %s", prefix, fname,
                        strerror(size < 0 ? (int)-size : errno));
        goto out;
    }
    fd = mkstemp(tmp);
    if (fd < 0) {
        io_error_report("%sCould not create temporary overlay '%s': %s", prefix,
                        tmp, strerror(errno));
        goto out;
    }
    close(fd);
    bi_create_opts_init(&co);
    co.format = IO_OVERLAY_FORMAT;
    co.size = (uint64_t)size;
    co.size_set = true;
    co.backing_file = real;
    co.backing_fmt = fmt;
    bi_error_init(&err);
    if (bi_create(tmp, &co, &err) < 0) {
        io_error_report("%sCould not create temporary overlay '%s': %s", prefix,
                        tmp, err.msg);
        unlink(tmp);
        goto out;
    }
    o.format = IO_OVERLAY_FORMAT;
    o.driver_opts = NULL;
    o.quiet_probe = true;
    bi_error_init(&err);
    n = bi_open(tmp, &o, &err);
    unlink(tmp);
    if (!n) {
        io_error_report("%s%s", prefix, open_error_text(&err, tmp));
    }
out:
    free(real);
    free(tmp);
    return n;
}

static void optlist_add(struct bi_optlist *l, const char *key,
                        const char *value)
{
    struct bi_opt *nv = bi_xmalloc(sizeof(*nv) * (size_t)(l->n + 1));
    if (l->n) {
        memcpy(nv, l->v, sizeof(*nv) * (size_t)l->n);
    }
    free(l->v);
    l->v = nv;
    l->v[l->n].key = bi_xstrdup(key);
    l->v[l->n].value = value ? bi_xstrdup(value) : NULL;
    l->n++;
}

static void save_request(const char *name, const struct io_open_req *r)
{
    io_open_req_free(&g_req);
    free(g_req_name);
    g_req = *r;
    memset(&g_req.opts, 0, sizeof(g_req.opts));
    for (int i = 0; i < r->opts.n; i++) {
        optlist_add(&g_req.opts, r->opts.v[i].key, r->opts.v[i].value);
    }
    g_req_name = name ? bi_xstrdup(name) : NULL;
}

/* One open, phase by phase: what the request and its options say. */
struct io_open_plan {
    char prefix[PATH_MAX + 32]; /* "can't open device NAME: " */
    const char *driver, *fname;
    const char *proto;           /* nbd...: driver=nbd or file.driver=nbd */
    const char *file_driver;     /* file.driver= as given */
    const char **dopts, **popts; /* the format's and the protocol's keys */
    int nd, np;
    bool nocache, no_flush, read_only, force_share, unmap, no_lock, aio_set;
    bool no_backing;
    enum bi_detect_zeroes dz;
    enum bi_aio aio;
};

static void plan_free(struct io_open_plan *p)
{
    for (int i = 0; i < p->nd; i++)
        free((char *)p->dopts[i]);
    free(p->dopts);
    for (int i = 0; i < p->np; i++)
        free((char *)p->popts[i]);
    free(p->popts);
}

/* The error prefix, and a json:{...} name turned into the request's
 * options (*name NULL then). 0, or 1 with the error printed. */
static int plan_name(struct io_open_plan *p, const char **name,
                     struct io_open_req *r)
{
    if (g_reopening) {
        p->prefix[0] = 0; /* qemu-io's reopen names no device */
        return 0;
    }
    if (*name)
        snprintf(p->prefix, sizeof(p->prefix), "can't open device %s: ", *name);
    else
        snprintf(p->prefix, sizeof(p->prefix), "can't open: ");
    if (!*name)
        return 0;
    /* json:{...}: its keys, as --image-opts would give them */
    char *json = NULL, jerr[1024] = "";
    int j = tool_json_filename(*name, &json, jerr, sizeof(jerr));
    if (j < 0) {
        io_error_report("%s%s", p->prefix, jerr);
        return 1;
    }
    if (j > 0) {
        j = io_parse_opts(&r->opts, json);
        free(json);
        if (j < 0)
            return 1;
        *name = NULL;
    }
    return 0;
}

/* The file name and the protocol driver, from the name or the options,
 * with qemu-io's refusals. 0, or 1 with the error printed. */
static int plan_target(struct io_open_plan *p, const char *name,
                       const struct bi_optlist *l)
{
    const char *v;
    p->driver = opt_get(l, "driver");
    p->fname = name ? name : opt_get(l, "file.filename");
    v = opt_get(l, "file");
    if (!p->fname && v) {
        /* "file=<name>" refers to an existing node, of which we have none */
        io_error_report("%sCannot find device='%s' nor node-name='%s'",
                        p->prefix, v, v);
        return 1;
    }
    if (!p->fname && p->driver && is_protocol_driver(p->driver))
        p->fname = opt_get(l, "filename"); /* file, host_device... */
    v = p->file_driver = opt_get(l, "file.driver");
    if (v && (other_protocol(v) || file_format_driver(v))) {
        p->proto = v;
    } else if (p->driver && other_protocol(p->driver)) {
        p->proto = p->driver;
    } else if (v && strcmp(v, "file") != 0 && strcmp(v, "host_device") != 0) {
        io_error_report("%sUnknown protocol driver '%s'", p->prefix, v);
        return 1;
    }
    struct stat sb;
    if (v && !strcmp(v, "host_device") && p->fname &&
        stat(p->fname, &sb) == 0 && !S_ISBLK(sb.st_mode) &&
        !S_ISCHR(sb.st_mode)) {
        io_error_report("%s'host_device' driver requires '%s' to be "
                        "either a character or block device",
                        p->prefix, p->fname);
        return 1;
    }
    if (p->fname || p->proto)
        return 0;
    if (p->driver && strcmp(p->driver, "file") != 0)
        io_error_report("%sA block device must be specified for \"file\"",
                        p->prefix);
    else if (p->driver)
        io_error_report("%sThe 'file' block driver requires a file name",
                        p->prefix);
    else
        io_error_report("%sMust specify either driver or file", p->prefix);
    return 1;
}

/* Each option to the protocol's list (file.* without the prefix), the
 * format's list, or neither (generic options, read by plan_flags),
 * refusing the keys qemu-io refuses. 0, or 1 with the error printed. */
static int plan_split_opts(struct io_open_plan *p, const struct bi_optlist *l)
{
    const char *driver = p->driver, *proto = p->proto, *fd = p->file_driver;
    p->dopts = bi_xzalloc(sizeof(*p->dopts) * (size_t)(l->n + 1));
    p->popts = bi_xzalloc(sizeof(*p->popts) * (size_t)(l->n + 2));
    if (proto && proto != driver)
        p->popts[p->np++] = bi_xasprintf("driver=%s", proto);
    else if (!proto && fd && !strcmp(fd, "file"))
        p->popts[p->np++] = bi_xstrdup("driver=file"); /* regular files only */
    for (int i = 0; i < l->n; i++) {
        const char *key = l->v[i].key;
        const char *val = l->v[i].value;

        if (proto && strcmp(key, "driver") && strcmp(key, "file.driver") &&
            !is_generic_opt(key) &&
            (proto == driver || !strncmp(key, "file.", 5))) {
            p->popts[p->np++] = bi_xasprintf(
                "%s=%s", proto == driver ? key : key + 5, val ? val : "on");
            continue;
        }
        if (!strcmp(key, "backing") && val && tool_backing_none(val)) {
            p->no_backing = true;
            continue;
        }
        if ((!strcmp(key, "locking") || !strcmp(key, "aio")) && driver &&
            is_protocol_driver(driver))
            continue; /* the protocol's, read by plan_flags */
        if (is_generic_opt(key)) {
            if (!strcmp(key, "filename") &&
                (!driver || !is_protocol_driver(driver))) {
                io_error_report("%sBlock format '%s' does not support the "
                                "option 'filename'",
                                p->prefix, driver ? driver : IO_DEFAULT_FORMAT);
                return 1;
            }
            continue;
        }
        if (!strncmp(key, "file.", 5) || (driver && !strcmp(driver, "file"))) {
            io_error_report("%sBlock protocol 'file' doesn't support the "
                            "option '%s'",
                            p->prefix,
                            !strncmp(key, "file.", 5) ? key + 5 : key);
            return 1;
        }
        p->dopts[p->nd++] = bi_xasprintf("%s=%s", key, val);
        if (driver && bi_format_exists(driver) == 0 &&
            check_driver_opt(p->prefix, driver, p->dopts[p->nd - 1]) < 0)
            return 1;
    }
    return 0;
}

/* An on/off option over *out when given. 0, or 1 with the error printed. */
static int plan_bool(const struct io_open_plan *p, const struct bi_optlist *l,
                     const char *key, bool *out)
{
    const char *v = opt_get(l, key);
    int b;
    if (!v)
        return 0;
    if ((b = parse_bool(v)) < 0) {
        io_error_report("%sParameter '%s' expects 'on' or 'off'", p->prefix,
                        key);
        return 1;
    }
    *out = b;
    return 0;
}

/* The protocol's own key (file.KEY, or KEY when the driver is a
 * protocol), or NULL. */
static const char *plan_proto_opt(const struct io_open_plan *p,
                                  const struct bi_optlist *l, const char *key)
{
    char fkey[32];
    snprintf(fkey, sizeof(fkey), "file.%s", key);
    const char *v = opt_get(l, fkey);
    if (!v && p->driver && is_protocol_driver(p->driver))
        v = opt_get(l, key);
    return v;
}

/* The generic options over the request's flags: cache.*, read-only,
 * force-share, locking, aio, discard, detect-zeroes. 0, or 1 with the
 * error printed. */
static int plan_flags(struct io_open_plan *p, const struct bi_optlist *l)
{
    bool ro = p->read_only;
    const char *v;
    if (plan_bool(p, l, "cache.direct", &p->nocache) ||
        plan_bool(p, l, "cache.no-flush", &p->no_flush) ||
        plan_bool(p, l, "read-only", &ro))
        return 1;
    if (ro && !p->read_only) {
        io_error_report("%sBlock node is read-only", p->prefix);
        return 1;
    }
    if (plan_bool(p, l, "force-share", &p->force_share))
        return 1;
    v = plan_proto_opt(p, l, "locking");
    if (v && strcmp(v, "auto") != 0) {
        int b = parse_bool(v);
        if (b < 0) {
            io_error_report("%sinvalid parameter value: %s", p->prefix, v);
            return 1;
        }
        p->no_lock = !b;
    }
    v = plan_proto_opt(p, l, "aio");
    if (v) {
        if (io_parse_aio(v, &p->aio) < 0) {
            io_error_report("%sinvalid parameter value: %s", p->prefix, v);
            return 1;
        }
        p->aio_set = true;
    }
    v = opt_get(l, "discard");
    if (v && io_parse_discard(v, &p->unmap) < 0) {
        io_error_report("%sInvalid discard option", p->prefix);
        return 1;
    }
    v = opt_get(l, "detect-zeroes");
    if (v && bi_detect_zeroes_parse(v, &p->dz) < 0) {
        io_error_report("%sinvalid parameter value: %s", p->prefix, v);
        return 1;
    }
    return 0;
}

/* The combinations qemu-io refuses, then the I/O engine asked for.
 * 0, or 1 with the error printed. */
static int plan_validate(const struct io_open_plan *p,
                         const struct io_open_req *r)
{
    const char *e = NULL;
    if (p->dz == BI_DETECT_ZEROES_UNMAP && !p->unmap)
        e = "setting detect-zeroes to unmap is not allowed without setting "
            "discard operation to unmap";
    else if (p->aio_set && p->aio == BI_AIO_NATIVE && !p->nocache)
        e = "aio=native was specified, but it requires cache.direct=on, "
            "which was not specified.";
    else if (r->copy_on_read && p->read_only)
        e = "Can't use copy-on-read on read-only device";
    else if (p->force_share && !p->read_only)
        e = "force-share=on can only be used with read-only images";
    if (e) {
        io_error_report("%s%s", p->prefix, e);
        return 1;
    }
    bi_error err;
    bi_error_init(&err);
    if (p->aio_set && bi_aio_select(p->aio, &err) < 0) {
        io_error_report("%s%s", p->prefix, err.msg);
        return 1;
    }
    return 0;
}

/* The library's open options for the plan. */
static void plan_open_opts(const struct io_open_plan *p,
                           const struct io_open_req *r, const char *name,
                           struct bi_open_opts *o)
{
    bi_open_opts_init(o);
    o->format = p->driver;
    o->no_backing = p->no_backing;
    if (p->no_flush)
        o->cache = p->nocache ? BI_CACHE_NONE : BI_CACHE_UNSAFE;
    else if (p->nocache)
        o->cache = r->writethrough ? BI_CACHE_DIRECTSYNC : BI_CACHE_NONE;
    else
        o->cache = r->writethrough ? BI_CACHE_WRITETHROUGH : BI_CACHE_WRITEBACK;
    o->backing_cache = o->cache;
    /* with -s the image is the overlay's backing file */
    o->read_write = !p->read_only && !r->snapshot;
    o->force_share = p->force_share;
    o->no_lock = p->no_lock;
    o->named_by_options = !name; /* --image-opts: no file name to probe */
    o->driver_opts = p->nd ? p->dopts : NULL;
    o->protocol_opts = p->np ? p->popts : NULL;
}

/* Opens the plan's image (and -s's overlay over it), checking the format
 * options against a probed format. The node, or NULL with the error
 * printed. */
static bi_node *plan_open(const struct io_open_plan *p,
                          const struct io_open_req *r, const char *name)
{
    struct bi_open_opts o;
    bi_error err;
    plan_open_opts(p, r, name, &o);
    bi_error_init(&err);
    bi_node *n = bi_open(p->fname, &o, &err);
    if (!n) {
        io_error_report("%s%s", p->prefix, open_error_text(&err, p->fname));
        return NULL;
    }
    for (int i = 0; !p->driver && i < p->nd; i++) {
        /* probed: check the options against the format found */
        if (check_driver_opt(p->prefix, bi_node_format(n), p->dopts[i]) < 0) {
            bi_close(n, NULL);
            return NULL;
        }
    }
    if (r->snapshot) {
        o.read_write = !p->read_only;
        n = open_snapshot(n, p->fname, &o, p->prefix);
    }
    return n;
}

/* The open node becomes the current one, with the request's settings. */
static void plan_adopt(const struct io_open_plan *p, bi_node *n,
                       const char *name, const struct io_open_req *r)
{
    bi_node_set_detect_zeroes(n, p->dz);
    g_node = n;
    g_format_name = bi_node_format(n);
    g_cor = r->copy_on_read;
    g_cor_cluster = 0;
    if (g_cor) {
        struct bi_image_info *info = bi_xzalloc(sizeof(*info));

        if (bi_get_info(n, info, NULL) == 0)
            g_cor_cluster = info->cluster_size;
        bi_info_free(info);
        free(info);
    }
    g_unmap = p->unmap;
    g_no_flush = p->no_flush && p->nocache;
    save_request(name, r);
}

int io_openfile(const char *name, struct io_open_req *r)
{
    struct io_open_plan p = {
        .nocache = r->nocache,
        .no_flush = r->no_flush,
        .read_only = r->read_only,
        .force_share = r->force_share,
        .unmap = r->unmap,
        .aio_set = r->aio_set,
        .aio = r->aio,
        .dz = BI_DETECT_ZEROES_OFF,
    };
    int ret = 1;

    if (g_node) {
        io_error_report("file open already, try 'help close'");
        return 1;
    }
    if (plan_name(&p, &name, r))
        return 1;
    if (r->force_share) {
        const char *v = opt_get(&r->opts, "force-share");
        if (v && strcmp(v, "on") != 0) {
            io_error_report("-U conflicts with image options");
            return 1;
        }
    }
    if (plan_target(&p, name, &r->opts))
        return 1;
    if (!plan_split_opts(&p, &r->opts) && !plan_flags(&p, &r->opts) &&
        !plan_validate(&p, r)) {
        bi_node *n = plan_open(&p, r, name);
        if (n) {
            plan_adopt(&p, n, name, r);
            ret = 0;
        }
    }
    plan_free(&p);
    return ret;
}

static int open_f(int argc, char **argv);
static void open_help(void)
{
    printf("\n"
           " Opens an image for the other commands.\n"
           "\n"
           " Example:\n"
           " 'open -n -o driver=raw /tmp/data' - opens a raw image read-write\n"
           "   with the host page cache bypassed (O_DIRECT)\n"
           "\n"
           " -r, -- read-only\n"
           " -s, -- snapshot mode: writes go to a temporary overlay\n"
           " -C, -- copy-on-read: data read from a backing file is copied\n"
           "        into the image\n"
           " -n, -- bypass the host page cache, short for -t none\n"
           " -U, -- force shared permissions (read-only images only)\n"
           " -k, -- native AIO (served by io_uring), prefer -i\n"
           " -i, -- AIO engine: threads, native or io_uring\n"
           " -t, -- cache mode: none, writeback, writethrough, directsync,\n"
           "        unsafe\n"
           " -d, -- discard mode: unmap or ignore\n"
           " -o, -- image options (driver=raw,file.locking=off,...)\n"
           "\n");
}
static const struct cmdinfo open_cmd = {
    .name = "open",
    .altname = "o",
    .func = open_f,
    .argmin = 1,
    .argmax = -1,
    .args = "[-rsCnkU] [-t cache] [-d discard] [-o options] [path]",
    .oneline = "open the file specified by path",
    .help = open_help,
    .flags = CMD_NOFILE_OK,
};

static int open_f(int argc, char **argv)
{
    struct io_open_req r;
    int c, ret;

    io_open_req_init(&r);
    while ((c = getopt(argc, argv, "snCro:ki:t:d:U")) != -1) {
        switch (c) {
        case 's':
            r.snapshot = true;
            break;
        case 'C':
            r.copy_on_read = true;
            break;
        case 'n':
            r.nocache = true;
            r.writethrough = false;
            break;
        case 'r':
            r.read_only = true;
            break;
        case 'k':
            r.aio_set = true;
            r.aio = BI_AIO_NATIVE;
            break;
        case 't':
            if (io_parse_cache_mode(optarg, &r) < 0) {
                io_error_report("Invalid cache option: %s", optarg);
                io_open_req_free(&r);
                return -EINVAL;
            }
            break;
        case 'd':
            if (io_parse_discard(optarg, &r.unmap) < 0) {
                io_error_report("Invalid discard option: %s", optarg);
                io_open_req_free(&r);
                return -EINVAL;
            }
            break;
        case 'i':
            if (io_parse_aio(optarg, &r.aio) < 0) {
                io_error_report("Invalid aio option: %s", optarg);
                io_open_req_free(&r);
                return -EINVAL;
            }
            r.aio_set = true;
            break;
        case 'o':
            if (g_image_opts) {
                printf("--image-opts and 'open -o' are mutually exclusive\n");
                io_open_req_free(&r);
                return -EINVAL;
            }
            if (io_parse_opts(&r.opts, optarg) < 0) {
                io_open_req_free(&r);
                return -EINVAL;
            }
            break;
        case 'U':
            r.force_share = true;
            break;
        default:
            io_open_req_free(&r);
            command_usage(&open_cmd);
            return -EINVAL;
        }
    }
    if (g_image_opts && optind == argc - 1) {
        if (io_parse_opts(&r.opts, argv[optind]) < 0) {
            io_open_req_free(&r);
            return -EINVAL;
        }
        optind++;
    }
    if (optind == argc - 1) {
        ret = io_openfile(argv[optind], &r);
    } else if (optind == argc) {
        ret = io_openfile(NULL, &r);
    } else {
        io_open_req_free(&r);
        command_usage(&open_cmd);
        return -EINVAL;
    }
    io_open_req_free(&r);
    return ret ? -EINVAL : 0;
}

/* Whether reopen -o may change key on an image of format fmt: the cache
 * and read-only switches, discard, and the format's runtime options. */
static bool reopen_key_ok(const char *fmt, const char *key)
{
    static const char *const common[] = {"read-only", "cache.direct",
                                         "cache.no-flush", "discard", NULL};
    for (int i = 0; common[i]; i++) {
        if (!strcmp(key, common[i])) {
            return true;
        }
    }
    const struct bi_opt_desc *d = bi_runtime_opt_find(fmt, key);
    return d && !(d->flags & BI_OPT_REFUSED);
}

static int reopen_f(int argc, char **argv);
static void reopen_help(void)
{
    printf("\n"
           " Changes the open options of an already opened image\n"
           "\n"
           " Example:\n"
           " 'reopen -o lazy-refcounts=on' - activates lazy refcount "
           "writeback on a qcow2 image\n"
           "\n"
           " -r, -- Reopen the image read-only\n"
           " -w, -- Reopen the image read-write\n"
           " -c, -- Change the cache mode to the given value\n"
           " -o, -- Changes block driver options (cf. 'open' command)\n"
           "\n");
}
static const struct cmdinfo reopen_cmd = {
    .name = "reopen",
    .func = reopen_f,
    .argmin = 0,
    .argmax = -1,
    .args = "[(-r|-w)] [-c cache] [-o options]",
    .oneline = "reopens an image with new options",
    .help = reopen_help,
};

/*
 * qemu-io's reopen: the image is closed and opened again with the changed
 * request (read-only, cache mode, options); if that fails, the error is
 * printed and the image is opened again as it was.
 */
static int reopen_f(int argc, char **argv)
{
    struct io_open_req r;
    struct bi_optlist o;
    bool has_rw = false, has_cache = false, rw = false;
    int c, ret = -EINVAL;

    memset(&o, 0, sizeof(o));
    r = g_req;
    memset(&r.opts, 0, sizeof(r.opts));
    while ((c = getopt(argc, argv, "c:o:rw")) != -1) {
        switch (c) {
        case 'c':
            if (io_parse_cache_mode(optarg, &r) < 0) {
                io_error_report("Invalid cache option: %s", optarg);
                goto out;
            }
            has_cache = true;
            break;
        case 'o':
            if (io_parse_opts(&o, optarg) < 0) {
                goto out;
            }
            break;
        case 'r':
        case 'w':
            if (has_rw) {
                io_error_report("Only one -r/-w option may be given");
                goto out;
            }
            has_rw = true;
            rw = c == 'w';
            break;
        default:
            command_usage(&reopen_cmd);
            goto out;
        }
    }
    if (optind != argc) {
        command_usage(&reopen_cmd);
        goto out;
    }
    if (has_rw) {
        r.read_only = !rw;
    }
    for (int i = 0; i < o.n; i++) {
        const char *k = o.v[i].key, *v = o.v[i].value ? o.v[i].value : "on";
        int b;
        if (!reopen_key_ok(g_format_name, k)) {
            /* the same value as now is no change */
            const char *cur =
                !strcmp(k, "driver") ? g_format_name : opt_get(&g_req.opts, k);
            if (cur && o.v[i].value && !strcmp(cur, o.v[i].value)) {
                continue;
            }
            const char *dot = strrchr(k, '.');
            io_error_report("Cannot change the option '%s'", dot ? dot + 1 : k);
            goto out;
        }
        if (!strcmp(k, "read-only")) {
            if (has_rw) {
                io_error_report("Cannot set both -r/-w and 'read-only'");
                goto out;
            }
            if ((b = parse_bool(v)) < 0) {
                io_error_report("Parameter 'read-only' expects 'on' or 'off'");
                goto out;
            }
            if (b && !g_req.read_only) {
                /* as QEMU: the image's user still holds it for writing */
                io_error_report("Read-only block node '%s' cannot support "
                                "read-write users",
                                bi_node_filename(g_node));
                goto out;
            }
            r.read_only = b;
        } else if (!strcmp(k, "cache.direct") || !strcmp(k, "cache.no-flush")) {
            if (has_cache) {
                io_error_report("Cannot set both -c and the cache options");
                goto out;
            }
            if ((b = parse_bool(v)) < 0) {
                io_error_report("Parameter '%s' expects 'on' or 'off'", k);
                goto out;
            }
            if (k[6] == 'd') {
                r.nocache = b;
            } else {
                r.no_flush = b;
            }
        } else if (!strcmp(k, "discard")) {
            if (io_parse_discard(v, &r.unmap) < 0) {
                io_error_report("Invalid discard option: %s", v);
                goto out;
            }
        }
    }
    if (g_req.snapshot) {
        io_error_report("Cannot reopen an image opened with -s: its "
                        "temporary overlay would be lost");
        goto out;
    }
    /* the saved options, less the switches set above, then the new ones */
    for (int i = 0; i < g_req.opts.n; i++) {
        const char *k = g_req.opts.v[i].key;
        if (strcmp(k, "read-only") && strcmp(k, "cache.direct") &&
            strcmp(k, "cache.no-flush") && strcmp(k, "discard")) {
            optlist_add(&r.opts, k, g_req.opts.v[i].value);
        }
    }
    for (int i = 0; i < o.n; i++) {
        const char *k = o.v[i].key;
        if (reopen_key_ok(g_format_name, k) && strcmp(k, "read-only") &&
            strcmp(k, "cache.direct") && strcmp(k, "cache.no-flush") &&
            strcmp(k, "discard")) {
            optlist_add(&r.opts, k, o.v[i].value);
        }
    }

    struct io_open_req old = g_req;
    char *old_name = g_req_name ? bi_xstrdup(g_req_name) : NULL;
    memset(&old.opts, 0, sizeof(old.opts));
    for (int i = 0; i < g_req.opts.n; i++) {
        optlist_add(&old.opts, g_req.opts.v[i].key, g_req.opts.v[i].value);
    }
    close_image();
    g_reopening = true;
    if (io_openfile(old_name, &r) == 0) {
        ret = 0;
    } else if (io_openfile(old_name, &old) != 0) {
        io_error_report("could not open the image again as it was");
    }
    g_reopening = false;
    free(old_name);
    io_open_req_free(&old);
out:
    io_open_req_free(&r);
    bi_optlist_free(&o);
    return ret;
}

static int quit_f(int argc, char **argv)
{
    g_quit = true;
    return 0;
}
static const struct cmdinfo quit_cmd = {
    .name = "quit",
    .altname = "q",
    .func = quit_f,
    .argmin = -1,
    .argmax = -1,
    .oneline = "exit the program",
    .flags = CMD_GLOBAL,
};

/* -------- help and the table */

static int help_f(int argc, char **argv);
static const struct cmdinfo help_cmd = {
    .name = "help",
    .altname = "?",
    .func = help_f,
    .argmin = 0,
    .argmax = 1,
    .args = "[command]",
    .oneline = "help for one or all commands",
    .flags = CMD_GLOBAL,
};

/* Sorted by name, as help lists them. */
static const struct cmdinfo *const cmdtab[] = {
    &abort_cmd,    &aio_flush_cmd,    &aio_read_cmd, &aio_write_cmd,
    &alloc_cmd,    &break_cmd,        &close_cmd,    &discard_cmd,
    &flush_cmd,    &help_cmd,         &info_cmd,     &length_cmd,
    &map_cmd,      &open_cmd,         &quit_cmd,     &read_cmd,
    &readv_cmd,    &remove_break_cmd, &reopen_cmd,   &resume_cmd,
    &sigraise_cmd, &sleep_cmd,        &truncate_cmd, &wait_break_cmd,
    &write_cmd,    &writev_cmd,
};

static const struct cmdinfo *find_command(const char *cmd)
{
    for (size_t i = 0; i < BI_ARRAY_SIZE(cmdtab); i++) {
        const struct cmdinfo *ct = cmdtab[i];

        if (!strcmp(ct->name, cmd) ||
            (ct->altname && !strcmp(ct->altname, cmd))) {
            return ct;
        }
    }
    return NULL;
}

static void help_oneline(const char *cmd, const struct cmdinfo *ct)
{
    printf("%s ", cmd);
    if (ct->args) {
        printf("%s ", ct->args);
    }
    printf("-- %s\n", ct->oneline);
}

static int help_f(int argc, char **argv)
{
    const struct cmdinfo *ct;

    if (argc < 2) {
        for (size_t i = 0; i < BI_ARRAY_SIZE(cmdtab); i++) {
            help_oneline(cmdtab[i]->name, cmdtab[i]);
        }
        printf("\nUse 'help commandname' for extended help.\n");
        return 0;
    }
    ct = find_command(argv[1]);
    if (!ct) {
        printf("command %s not found\n", argv[1]);
        return -EINVAL;
    }
    help_oneline(argv[1], ct);
    if (ct->help) {
        ct->help();
    }
    return 0;
}

/* -------- dispatch */

static int run_command(const struct cmdinfo *ct, int argc, char **argv)
{
    const char *cmd = argv[0];

    if (!(ct->flags & CMD_GLOBAL) && !(ct->flags & CMD_NOFILE_OK) && !g_node) {
        fprintf(stderr, "no file open, try 'help open'\n");
        return -EINVAL;
    }
    if (argc - 1 < ct->argmin || (ct->argmax != -1 && argc - 1 > ct->argmax)) {
        if (ct->argmax == -1) {
            fprintf(stderr,
                    "bad argument count %d to %s, expected at least %d "
                    "arguments\n",
                    argc - 1, cmd, ct->argmin);
        } else if (ct->argmin == ct->argmax) {
            fprintf(stderr,
                    "bad argument count %d to %s, expected %d arguments\n",
                    argc - 1, cmd, ct->argmin);
        } else {
            fprintf(stderr,
                    "bad argument count %d to %s, expected between %d and "
                    "%d arguments\n",
                    argc - 1, cmd, ct->argmin, ct->argmax);
        }
        return -EINVAL;
    }
    if ((ct->flags & CMD_WRITE) && bi_node_read_only(g_node)) {
        io_error_report("Block node is read-only");
        return -EPERM;
    }
    optind = 0; /* glibc: full getopt reinitialisation */
    return ct->func(argc, argv);
}

int io_command(const char *line)
{
    char *input = bi_xstrdup(line);
    char **v = bi_xzalloc(sizeof(char *));
    char *p, *save = input;
    int c = 0, ret = 0;

    /* Words are separated by single spaces; empty words are dropped. */
    while ((p = strsep(&save, " ")) != NULL) {
        if (!*p) {
            continue;
        }
        v = realloc(v, sizeof(char *) * (size_t)(c + 2));
        if (!v) {
            abort();
        }
        v[c++] = p;
        v[c] = NULL;
    }
    if (c) {
        const struct cmdinfo *ct = find_command(v[0]);

        if (ct) {
            ret = run_command(ct, c, v);
        } else {
            fprintf(stderr, "command \"%s\" not found\n", v[0]);
            ret = -EINVAL;
        }
    }
    free(input);
    free(v);
    return ret;
}

int io_shutdown(void)
{
    int ret = 0;
    drain();
    if (g_node) {
        ret = close_image();
    }
    io_open_req_free(&g_req);
    free(g_req_name);
    g_req_name = NULL;
    return ret;
}
