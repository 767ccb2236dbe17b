/* SPDX-License-Identifier: MIT */
/*
 * blkimg-io: the command interpreter (qemu-io 7.2's command language) and
 * the image opening shared by the command line and the "open" command.
 */
#ifndef BI_TOOLS_IO_CMDS_H
#define BI_TOOLS_IO_CMDS_H

#include "blkimg/blkimg.h"
#include "util/util.h"

#include <stdbool.h>

/* Program name as invoked (basename of argv[0]): error prefix and prompt. */
void io_set_progname(const char *name);
const char *io_progname(void);

/* "<prog>: <message>" on stderr, as qemu's error_report. */
void io_error_report(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
void io_warn_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Process-wide settings from the command line. */
void io_set_image_opts(bool on); /* file argument is an option string */
void io_set_misalign(bool on);   /* -m: misalign I/O buffers by 16 bytes */
void io_set_stats(bool on);      /* --stats: print node stats on close */

/* How to open an image, as qemu-io's flags + option dictionary. */
struct io_open_req {
    bool read_only;
    bool nocache;      /* O_DIRECT (cache.direct) */
    bool no_flush;     /* flushes ignored (cache.no-flush) */
    bool writethrough; /* qemu-io's default is true */
    bool force_share;
    bool aio_set;
    enum bi_aio aio;
    bool unmap;             /* discard=unmap (default) or ignore */
    bool snapshot;          /* -s: writes go to a temporary overlay */
    bool copy_on_read;      /* -C: data read from backing files is copied up */
    struct bi_optlist opts; /* QEMU dotted options (driver, file.filename..) */
};
void io_open_req_init(struct io_open_req *r);
void io_open_req_free(struct io_open_req *r);

/* Option value parsers with qemu's semantics; 0 or -EINVAL. */
int io_parse_cache_mode(const char *s, struct io_open_req *r);
int io_parse_aio(const char *s, enum bi_aio *out);
int io_parse_discard(const char *s, bool *unmap);
/* Appends a QemuOpts-style "key=value,..." string to l, warning about
 * short-form booleans as qemu does; 0, or -EINVAL with the error printed. */
int io_parse_opts(struct bi_optlist *l, const char *s);

/* Opens the image (name may be NULL when the options name the file);
 * returns 0, or 1 with the error printed ("can't open device ..."). */
int io_openfile(const char *name, struct io_open_req *r);

/* Runs one command line; returns 0 or a negative errno. */
int io_command(const char *line);
bool io_quit_requested(void);

/* Runs completions that are ready (or waits for one if blocking and any
 * request is in flight). */
void io_poll(bool blocking);
/* True if asynchronous requests are in flight. */
bool io_busy(void);

/* Drains outstanding requests and closes the image (end of program);
 * returns 0 or the negative errno of a failed final flush. */
int io_shutdown(void);

#endif
