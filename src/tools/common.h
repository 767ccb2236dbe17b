/* SPDX-License-Identifier: MIT */
/*
 * Plumbing shared by the blkimg subcommands (and usable by blkimg-io):
 * qemu-img style error messages, size arguments, --output parsing,
 * opening images from -f/-t/-U/--image-opts, and QEMU-ordered JSON.
 */
#ifndef BI_TOOLS_COMMON_H
#define BI_TOOLS_COMMON_H

#include "blkimg/blkimg.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------ messages */

/* Program name for messages: basename(argv[0]), set by tool_init(). */
extern const char *tool_prog;
void tool_init(const char *argv0);

/* "prog: message\n" on stderr (qemu's error_report). */
/* Prints the library's messages on stderr (tool_init does it too). */
void tool_install_message_handler(void);
void tool_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* tool_error() plus "Try 'prog --help' for more information"; exits 1
 * (qemu-img's error_exit). */
void tool_error_exit(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
/* Handles getopt_long's ':' (missing argument) and '?' (unknown option)
 * returns as qemu-img 7.2 does; optstrings must start with ':'. Exits. */
void tool_getopt_error(int c, char **argv) __attribute__((noreturn));

/* ------------------------------------------------------------- numbers */

/* qemu-img's cvtnum_full(): parses a size argument ("1G", "1.5k", "0x10")
 * and prints "Invalid <name> specified. ..." on error. Returns the value
 * or a negative errno. */
int64_t tool_cvtnum_full(const char *name, const char *value, int64_t min,
                         int64_t max);
int64_t tool_cvtnum(const char *name, const char *value);
/* qemu_strtoul(s, NULL, 0, &res) semantics: whole string, base 0, a
 * leading '-' negates (as strtoul), errors -EINVAL / -ERANGE. */
int tool_strtoul(const char *s, unsigned long *res);

/* --------------------------------------------------------------- output */

enum tool_output { TOOL_OUTPUT_HUMAN, TOOL_OUTPUT_JSON };
/* Parses the --output argument (NULL: human). On error prints qemu-img's
 * "--output must be used with human or json as argument." and returns -1. */
int tool_parse_output(const char *s, enum tool_output *out);

/* ------------------------------------------------------- opening images */

struct tool_image {
    const char *filename; /* as given (the option string with image_opts) */
    const char *fmt;      /* -f, or NULL */
    bool image_opts;      /* --image-opts */
    enum bi_cache cache;  /* -t, default writeback */
    bool cache_set;
    bool read_write;
    bool force_share; /* -U */
    bool no_backing;
    bool quiet_probe;
    bool metadata_only; /* info: encrypted images open without a key */
    bool aio_set;       /* aio chosen (-i or image options) */
    enum bi_aio aio;
};
void tool_image_init(struct tool_image *ti);

/* Parsed --image-opts string (QEMU dotted keys). */
struct tool_image_opts {
    char *driver;   /* "driver" */
    char *filename; /* "file.filename", or "filename" with driver=file */
    bool has_direct, direct;     /* cache.direct */
    bool has_no_flush, no_flush; /* cache.no-flush */
    bool has_force_share, force_share;
    bool has_read_only, read_only;
    bool has_locking, locking; /* locking / file.locking */
    bool has_aio;
    enum bi_aio aio;    /* aio / file.aio */
    bool no_backing;    /* "backing": null (or the deprecated "") */
    bool discard_unmap; /* discard=unmap|on (QEMU's default: ignore) */
    enum bi_detect_zeroes detect_zeroes; /* detect-zeroes */
    char **driver_opts;                  /* other keys "k=v", NULL-terminated */
    int n_driver_opts;
    /* A protocol other than file (driver=nbd, or file.driver=nbd under a
     * format): its keys "k=v" (file.* without the prefix), the first
     * "driver=NAME", NULL-terminated; NULL for file. */
    char **protocol_opts;
    int n_protocol_opts;
};
/* Parses s; on error prints "<prefix>: ..."-less qemu text (see .c) and
 * returns -EINVAL. */
int tool_parse_image_opts(const char *s, struct tool_image_opts *io,
                          char *errbuf, size_t errlen);
void tool_image_opts_free(struct tool_image_opts *io);
/* QEMU's json:{...} file names: the object's members (nested objects
 * flattened with dots: {"file": {"driver": "http"}} is file.driver=http)
 * as an --image-opts string in *opts (malloc'd). Returns 0 when name is
 * no json: name (*opts NULL), 1 when converted, -EINVAL with errbuf set
 * to QEMU's words for a bad one. */
int tool_json_filename(const char *name, char **opts, char *errbuf,
                       size_t errlen);
/* The value tool_json_filename gives a member that is null (a byte no
 * command line carries): "backing": null opens no backing file. */
#define TOOL_JSON_NULL "\x1fnull"
/* Whether the value of the key "backing" asks for no backing file (null,
 * or "" with QEMU's deprecation warning printed); anything else names a
 * node, which the format refuses as an unknown option. */
bool tool_backing_none(const char *val);

/* The names of the registered drivers that open images, joined by sep
 * (malloc'd): formats and/or protocols (which), each kind in registry
 * order, or all sorted. */
enum { TOOL_FORMATS = 1, TOOL_PROTOCOLS = 2 };
char *tool_driver_names(unsigned which, const char *sep, bool sorted);

/* Checks a runtime option "key=value" of driver (a format or protocol
 * name) against the driver's table: unknown, refused, or a size that does
 * not parse gives -EINVAL and qemu's words in errbuf. */
int tool_check_driver_opt(const char *driver, const char *kv, char *errbuf,
                          size_t errlen);

/* --object DEF (TLS credentials, as qemu-img takes them): 0, or -1 after
 * printing qemu-img's error. */
int tool_object_add(const char *def);

/* Opens an image as qemu-img's img_open(); prints the error and returns
 * NULL on failure. Selects the aio engine when asked. ti->cache is set to
 * the cache mode in effect (--image-opts may change it). */
bi_node *tool_open(struct tool_image *ti);
/* The cause in the library's open message msg ("Could not open '<file>':
 * <cause>"), for a tool that names the image by its options instead. */
const char *tool_open_cause(const char *msg, const char *file);

/* qemu-img's print_block_option_help(): the creation options of FMT (merged
 * with the file protocol's when FILENAME is given), as `-o help` lists
 * them (img_create.c); returns the exit status. */
int img_print_create_help(const char *filename, const char *fmt);

/* qemu's option help lines ("  name=<type>  - help"), v sorted by name
 * first. */
void img_print_opt_list(const struct bi_opt_desc **v, int n);

/* A bi_create_describe_cb printing qemu-img's "Formatting 'f', fmt=x k=v
 * ..." line on stdout. */
void img_print_formatting(void *opaque, const char *filename,
                          const char *format, const char *const *items, int n);

/* blkimg's --help text (defined in blkimg.c; blkimg only); exits 0. */
void img_help(void) __attribute__((noreturn));

/* Prints "prog: <err.msg>" for a failed bi_* call. */
void tool_report(const bi_error *err);

#endif
