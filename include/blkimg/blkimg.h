/* SPDX-License-Identifier: MIT */
/*
 * libblkimg public API.
 *
 * An image is a graph of nodes: a format node (raw, qcow2) over a protocol
 * node (file), optionally with a backing node. Tools hold the top node.
 *
 * Conventions: functions return 0 (or a non-negative count) on success and a
 * negative errno on failure. Functions that can fail for reasons a user must
 * read take a bi_error, which receives one human-readable line (without the
 * program name prefix), e.g. "Could not open 'x.img': No such file or
 * directory".
 *
 * Threading: the block layer runs in one thread (the thread that opened the
 * images). Concurrency comes from many requests in flight: the aio calls
 * submit and return; bi_aio_poll() runs completions.
 *
 * Structs that grow: a struct of this API only ever grows, by fields added
 * at its end, and a program built with an older header keeps working with
 * a newer library. For that the library learns the size of each struct as
 * the program was built:
 * - option structs (bi_open_opts, bi_create_opts, bi_convert_opts) carry
 *   it in their first field, struct_size, which their _init macro sets; a
 *   call given one whose struct_size is 0 (never initialised) fails with
 * -EINVAL;
 * - the functions that fill a struct are macros that pass sizeof(*out)
 *   along (bi_get_info, bi_storage_info, bi_node_stats, bi_block_status,
 *   bi_measure, bi_check);
 * fields beyond the program's size take their defaults on the way in and
 * are left out on the way out. Strings are pointers, not arrays; lists of
 * structs are arrays of pointers, so that an element can grow too. The
 * exception is bi_error, frozen (see there).
 */
#ifndef BLKIMG_H
#define BLKIMG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BI_EXPORT __attribute__((visibility("default")))

#include "blkimg/value.h"

/* ------------------------------------------------------------------ errors */

/* The one struct of the API that does not grow: a caller's buffer for one
 * line, needing no free, so that every call can take one on the stack.
 * Its layout is frozen (a longer line is cut at 1023 bytes); more detail
 * about an error would come from new calls, not new fields. */
typedef struct bi_error {
    int code;       /* negative errno, 0 if unset */
    char msg[1024]; /* one line, no trailing newline */
} bi_error;

/* Messages: what the library has to tell besides errors (warnings such as
 * the raw-probe one, the findings of bi_check, a corruption noticed in
 * use) reach the handler the program installs, one message per call,
 * without a final newline (a message may hold several lines). Without a
 * handler they are dropped: the library never prints. Install it before
 * opening images; it may be called from any library call. */
enum bi_message_kind {
    BI_MESSAGE_WARNING,
    BI_MESSAGE_CHECK, /* a finding or repair of bi_check */
    /* An error line QEMU's driver reports on its own, besides the error
     * the call returns (qemu-img prints it with its name in front). */
    BI_MESSAGE_ERROR,
    /* A line QEMU's tools print on stdout as they go (blkdebug's
     * breakpoint reports): the program prints it on its output. */
    BI_MESSAGE_INFO,
};
typedef void bi_message_fn(void *opaque, enum bi_message_kind kind,
                           const char *message);
BI_EXPORT void bi_set_message_handler(bi_message_fn *fn, void *opaque);

BI_EXPORT void bi_error_init(bi_error *err);
/* Sets err (if err is non-NULL and not already set). If errnum != 0,
 * ": <strerror(errnum)>" is appended to the formatted message.
 *
 * The rule for codes: the call that sets the message sets the code, and
 * nothing changes either afterwards (the first error wins). With an errnum
 * the code is -|errnum|; without one (errnum 0) it is -EINVAL. Inside the
 * library, a message without strerror text but with another code is set by
 * bi_error_setc (util/util.h), which the drivers' helpers call. */
BI_EXPORT void bi_error_set(bi_error *err, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes an already set message: "<prefix>: <old message>". */
BI_EXPORT void bi_error_prefix(bi_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------ cache / aio */

enum bi_cache {
    BI_CACHE_WRITEBACK = 0, /* default */
    BI_CACHE_NONE,          /* O_DIRECT */
    BI_CACHE_WRITETHROUGH,  /* flush after each write */
    BI_CACHE_DIRECTSYNC,    /* O_DIRECT + flush after each write */
    BI_CACHE_UNSAFE,        /* flushes ignored */
};
/* Parses qemu-img's -t/-T names; returns 0 or -EINVAL. */
BI_EXPORT int bi_cache_parse(const char *s, enum bi_cache *out);
BI_EXPORT const char *bi_cache_name(enum bi_cache c);
BI_EXPORT bool bi_cache_is_direct(enum bi_cache c);

enum bi_aio {
    BI_AIO_DEFAULT = 0, /* io_uring where the kernel allows it, else threads */
    BI_AIO_IO_URING,
    BI_AIO_THREADS,
    BI_AIO_NATIVE, /* accepted as qemu does; served by io_uring */
};
BI_EXPORT int bi_aio_parse(const char *s, enum bi_aio *out);
/* Name of the engine actually running ("io_uring" or "threads"). */
BI_EXPORT const char *bi_aio_engine_name(void);
/* Chooses the process-wide engine; must be called before the first open. */
BI_EXPORT int bi_aio_select(enum bi_aio aio, bi_error *err);

/* ------------------------------------------------------------------ nodes */

typedef struct bi_node bi_node;

struct bi_open_opts {
    size_t struct_size;  /* sizeof(struct bi_open_opts): bi_open_opts_init */
    const char *format;  /* NULL: probe */
    enum bi_cache cache; /* data cache mode */
    bool read_write;
    bool force_share; /* -U: take no locks that conflict, share all */
    bool no_backing;  /* do not open backing files */
    bool no_lock;     /* take no image locks at all (locking=off) */
    bool quiet_probe; /* do not print the raw-probe warning */
    /* The image was named by image options (--image-opts), not by a file
     * name: format probing does not see the name, as in QEMU (where it
     * matters for dmg, recognised by its name alone). */
    bool named_by_options;
    /* Metadata only (like QEMU's no-I/O opens for info): an image whose
     * data cannot be read here (encrypted) still opens; its data I/O
     * fails. */
    bool metadata_only;
    /* Backing files open with this cache mode ('-T' for convert etc). */
    enum bi_cache backing_cache;
    /* Driver options as key=value (QEMU dotted keys without the driver
     * prefix, e.g. "l2-cache-size"), NULL-terminated; may be NULL. */
    const char *const *driver_opts;
    /* Options of the protocol node under the format (QEMU's "file.*" keys
     * without the prefix, or the keys of a protocol opened as the image),
     * key=value, NULL-terminated; "driver=NAME" picks the protocol (e.g.
     * "driver=nbd", "server.type=unix", "server.path=/run/s.sock",
     * "export=disk"). With them the file name may be NULL. */
    const char *const *protocol_opts;
};
/* Sets the defaults and o->struct_size (use the macro). */
BI_EXPORT void bi_open_opts_init_sized(struct bi_open_opts *o, size_t size);
#define bi_open_opts_init(o) bi_open_opts_init_sized((o), sizeof(*(o)))

BI_EXPORT bi_node *bi_open(const char *filename, const struct bi_open_opts *o,
                           bi_error *err);
/* Flushes (unless cache=unsafe) and closes the whole graph below node. */
BI_EXPORT int bi_close(bi_node *node, bi_error *err);

BI_EXPORT const char *bi_node_filename(const bi_node *n);
BI_EXPORT const char *bi_node_format(const bi_node *n); /* driver name */
BI_EXPORT bi_node *bi_node_file(bi_node *n);            /* protocol child */
BI_EXPORT bi_node *bi_node_backing(bi_node *n);
BI_EXPORT bool bi_node_read_only(const bi_node *n);
BI_EXPORT bool bi_node_format_probed(const bi_node *n);
BI_EXPORT int64_t bi_getlength(bi_node *n);
/* Bytes the node's file occupies on disk (st_blocks * 512), or -errno. */
BI_EXPORT int64_t bi_allocated_file_size(bi_node *n);

/* ----------------------------------------------------------------- limits */

enum bi_limit_source {
    BI_SRC_NONE = 0,
    BI_SRC_BUFFERED, /* no O_DIRECT: no alignment needed */
    BI_SRC_STATX,    /* statx STATX_DIOALIGN */
    BI_SRC_BLKSSZGET,
    BI_SRC_XFS_DIOINFO,
    BI_SRC_PROBE,    /* probed with reads */
    BI_SRC_FALLBACK, /* nothing said; max(4096, page size) */
    BI_SRC_CHILD,    /* inherited from the child node */
    BI_SRC_DRIVER,   /* the driver's own requirement */
    BI_SRC_SERVER,   /* the server's block-size constraints (NBD) */
};
BI_EXPORT const char *bi_limit_source_name(enum bi_limit_source s);

struct bi_limits {
    uint32_t request_alignment; /* offsets/lengths must be multiples */
    enum bi_limit_source request_alignment_source;
    uint32_t min_mem_alignment; /* below it: bounce */
    uint32_t opt_mem_alignment; /* what we allocate with (>= page size) */
    enum bi_limit_source mem_alignment_source;
    uint64_t max_transfer; /* bytes per I/O; 0 = no limit */
    uint32_t max_iov;      /* iovec entries per I/O */
    /* Preferred request size and alignment: smaller or misaligned writes
     * cost the storage a read-modify-write (an NBD server's preferred
     * block size). 0 = none stated. */
    uint32_t opt_transfer;
};
BI_EXPORT const struct bi_limits *bi_node_limits(const bi_node *n);

/* QEMU's detect-zeroes: a write of zeroes to the node becomes a zero
 * write (UNMAP: one that may unmap, as with BI_REQ_MAY_UNMAP). */
enum bi_detect_zeroes {
    BI_DETECT_ZEROES_OFF = 0,
    BI_DETECT_ZEROES_ON,
    BI_DETECT_ZEROES_UNMAP,
};
/* Parses "off", "on" or "unmap"; 0 or -EINVAL. */
BI_EXPORT int bi_detect_zeroes_parse(const char *s, enum bi_detect_zeroes *out);
/* Sets the node's detect-zeroes mode (writes made on n itself). */
BI_EXPORT void bi_node_set_detect_zeroes(bi_node *n, enum bi_detect_zeroes dz);

/* What `blkimg probe` shows, for a protocol node (file). */
struct bi_storage_info {
    uint32_t page_size;
    /* "ext4", "xfs", "tmpfs", "block device", ...: valid while the node is
     * open. */
    const char *filesystem;
    uint32_t logical_sector_size;  /* 0 if unknown */
    uint32_t physical_sector_size; /* 0 if unknown */
    bool is_block_device;
};
BI_EXPORT int bi_storage_info_sized(bi_node *n, struct bi_storage_info *out,
                                    size_t size);
#define bi_storage_info(n, out)                                                \
    bi_storage_info_sized((n), (out), sizeof(*(out)))

/* Per-node counters (for --stats). */
struct bi_stats {
    uint64_t io_calls;         /* I/Os submitted to the kernel */
    uint64_t bytes_read;       /* bytes read from the kernel */
    uint64_t bytes_written;    /* bytes written to the kernel */
    uint64_t bounced_bytes;    /* bytes copied through bounce buffers */
    uint64_t rmw_ops;          /* read-modify-write padding operations */
    uint64_t serialised_waits; /* requests that waited on overlap */
};
BI_EXPORT void bi_node_stats_sized(const bi_node *n, struct bi_stats *out,
                                   size_t size);
#define bi_node_stats(n, out) bi_node_stats_sized((n), (out), sizeof(*(out)))

/* Memory for I/O, aligned to the node's optimal memory alignment. */
BI_EXPORT void *bi_blockalign(bi_node *n, size_t size);
BI_EXPORT void bi_free_aligned(void *p);
BI_EXPORT size_t bi_page_size(void);

/* -------------------------------------------------------------------- I/O */

enum bi_req_flags {
    BI_REQ_FUA = 1 << 0,
    BI_REQ_MAY_UNMAP = 1 << 1,   /* write zeroes may punch holes */
    BI_REQ_NO_FALLBACK = 1 << 2, /* write zeroes must be fast or -ENOTSUP */
};

BI_EXPORT int bi_pread(bi_node *n, uint64_t off, void *buf, size_t len);
BI_EXPORT int bi_pwrite(bi_node *n, uint64_t off, const void *buf, size_t len,
                        int flags);
BI_EXPORT int bi_preadv(bi_node *n, uint64_t off, const struct iovec *iov,
                        int iovcnt);
BI_EXPORT int bi_pwritev(bi_node *n, uint64_t off, const struct iovec *iov,
                         int iovcnt, int flags);
BI_EXPORT int bi_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                               int flags);
BI_EXPORT int bi_pdiscard(bi_node *n, uint64_t off, uint64_t len);
BI_EXPORT int bi_flush(bi_node *n);
/* The VM state a format keeps beside the disk (qcow2: where QEMU's savevm
 * puts it, past the guest data; blkimg-io's read -b / write -b): len
 * bytes at pos of it. 0, -ENOTSUP for a format without VM state, or
 * -errno. Snapshots keep it as they keep the disk; convert does not copy
 * it. */
BI_EXPORT int bi_vmstate_pread(bi_node *n, uint64_t pos, void *buf, size_t len);
BI_EXPORT int bi_vmstate_pwrite(bi_node *n, uint64_t pos, const void *buf,
                                size_t len);
/* needed by blkimg-io: write -c. Writes [off, off+len) compressed (qcow2;
 * -ENOTSUP for formats without compression); off cluster-aligned, len a
 * multiple of the cluster size except for the image's last cluster. */
BI_EXPORT int bi_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                                   size_t len);

enum bi_prealloc {
    BI_PREALLOC_OFF = 0,
    BI_PREALLOC_METADATA,
    BI_PREALLOC_FALLOC,
    BI_PREALLOC_FULL,
};
BI_EXPORT int bi_prealloc_parse(const char *s, enum bi_prealloc *out);
BI_EXPORT const char *bi_prealloc_name(enum bi_prealloc p);
BI_EXPORT int bi_truncate(bi_node *n, uint64_t size, bool exact,
                          enum bi_prealloc prealloc, bi_error *err);

/* Asynchronous requests. The iovec array and buffers must stay valid until
 * the callback runs. Callbacks run inside bi_aio_poll(). */
typedef void bi_aio_cb(void *opaque, int ret);
BI_EXPORT void bi_aio_preadv(bi_node *n, uint64_t off, const struct iovec *iov,
                             int iovcnt, bi_aio_cb *cb, void *opaque);
BI_EXPORT void bi_aio_pwritev(bi_node *n, uint64_t off, const struct iovec *iov,
                              int iovcnt, int flags, bi_aio_cb *cb,
                              void *opaque);
BI_EXPORT void bi_aio_flush(bi_node *n, bi_aio_cb *cb, void *opaque);
BI_EXPORT void bi_aio_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                                    int flags, bi_aio_cb *cb, void *opaque);
BI_EXPORT void bi_aio_pdiscard(bi_node *n, uint64_t off, uint64_t len,
                               bi_aio_cb *cb, void *opaque);
/* Runs ready completions; with blocking, waits for at least one event if
 * any request is in flight. Returns the number of requests in flight. */
BI_EXPORT int bi_aio_poll(bool blocking);
/* Waits until no request is in flight. */
BI_EXPORT void bi_aio_drain(void);
BI_EXPORT int bi_aio_in_flight(void);

/* Serving requests that other threads hand to the loop thread (the nbdkit
 * plugin): bi_aio_kick() may be called from any thread, any number of
 * times, and makes the loop thread's current or next bi_aio_wait() return.
 * bi_aio_wait(), in the loop thread only, runs ready completions and then
 * waits, even with no request in flight, until something happened: a
 * completion or a kick (kicks before the call count). Returns the number
 * of requests in flight. */
BI_EXPORT void bi_aio_kick(void);
BI_EXPORT int bi_aio_wait(void);

/* Breakpoints of a fault-injection filter (qemu-io's break, wait_break,
 * resume, remove_break; QEMU's bdrv_debug_*). Each call acts on the first
 * node of n, its file child, its file's file... whose driver has
 * breakpoints (blkdebug) and returns -ENOTSUP when none has.
 *
 * bi_debug_breakpoint: the next request to reach the debug event named
 * event (QEMU's name, "write_aio") is suspended under tag; the breakpoint
 * is then gone. -ENOENT for an unknown event. A suspended request is in
 * flight and waits until resumed; the library reports "blkdebug:
 * Suspended request 'TAG'" and "blkdebug: Resuming request 'TAG'" as
 * BI_MESSAGE_INFO lines. A wait that nothing else could end (draining,
 * closing, a synchronous request) resumes suspended requests rather than
 * waiting forever.
 * bi_debug_resume: resumes the newest request suspended under tag (it
 * runs until it next waits before the call returns); -ENOENT if none.
 * bi_debug_remove_breakpoint: removes every breakpoint tagged tag and
 * resumes every request suspended under it; 0 if a breakpoint was
 * removed, else -ENOENT (as QEMU 7.2, even when it resumed requests).
 * bi_debug_is_suspended: whether a request is suspended under tag.
 * bi_debug_wait: runs the event loop until a request is suspended under
 * tag: 0, or -EDEADLK when no request in flight can get there any more. */
BI_EXPORT int bi_debug_breakpoint(bi_node *n, const char *event,
                                  const char *tag);
BI_EXPORT int bi_debug_remove_breakpoint(bi_node *n, const char *tag);
BI_EXPORT int bi_debug_resume(bi_node *n, const char *tag);
BI_EXPORT bool bi_debug_is_suspended(bi_node *n, const char *tag);
BI_EXPORT int bi_debug_wait(bi_node *n, const char *tag);

/* Runs fn(arg) on a worker thread, from a request context it waits (the
 * caller's coroutine yields); from outside it just blocks. For CPU work
 * such as compression. Returns fn's result. */
BI_EXPORT int bi_run_in_thread(int (*fn)(void *), void *arg);

/* ----------------------------------------------------------- block status */

enum bi_status_flags {
    BI_BS_DATA = 1 << 0,         /* reads return data (not known zero) */
    BI_BS_ZERO = 1 << 1,         /* reads return zeroes */
    BI_BS_ALLOCATED = 1 << 2,    /* allocated in this layer */
    BI_BS_OFFSET_VALID = 1 << 3, /* offset/file are valid */
    BI_BS_COMPRESSED = 1 << 4,
    BI_BS_EOF = 1 << 5, /* range ends at end of image */
};
struct bi_status {
    uint64_t len;    /* bytes of one kind from the queried offset */
    unsigned flags;  /* bi_status_flags */
    uint64_t offset; /* host offset in file, if OFFSET_VALID */
    bi_node *file;   /* node holding the data, if OFFSET_VALID */
    int depth;       /* (above) how many backing levels down, 0 = top */
};
/* Status of this node only: unallocated ranges are not looked up in the
 * backing chain. */
BI_EXPORT int bi_block_status_sized(bi_node *n, uint64_t off, uint64_t len,
                                    struct bi_status *st, size_t size);
#define bi_block_status(n, off, len, st)                                       \
    bi_block_status_sized((n), (off), (len), (st), sizeof(*(st)))
/* Status through the backing chain down to (excluding) base; NULL = all. */
BI_EXPORT int bi_block_status_above_sized(bi_node *n, bi_node *base,
                                          uint64_t off, uint64_t len,
                                          struct bi_status *st, size_t size);
#define bi_block_status_above(n, base, off, len, st)                           \
    bi_block_status_above_sized((n), (base), (off), (len), (st), sizeof(*(st)))

/* ------------------------------------------------------------- formats */

/* What the registered drivers (formats and protocols) offer, as tables
 * each driver carries: the tools list, check and document options from
 * these and never name a format. */

enum bi_opt_type { BI_OPT_STRING, BI_OPT_BOOL, BI_OPT_NUMBER, BI_OPT_SIZE };
/* qemu's type words in -o help: "str", "bool (on/off)", "num", "size". */
BI_EXPORT const char *bi_opt_type_name(enum bi_opt_type t);

enum bi_opt_flags {
    BI_OPT_PREFIX = 1 << 0, /* name is a prefix of keys ("encrypt.") */
    /* QEMU takes the option, blkimg refuses it; help says why (NULL:
     * "The <format> format's option '<key>' is not supported"). */
    BI_OPT_REFUSED = 1 << 1,
    /* Runtime options QEMU counts among a driver's "strong" options: one
     * given makes the node's name a json: name carrying it (luks's
     * key-secret). */
    BI_OPT_STRONG = 1 << 2,
};

/* One option of a driver, as QEMU describes it. Tables end with an entry
 * whose name is NULL. */
struct bi_opt_desc {
    const char *name;
    enum bi_opt_type type;
    const char *help;
    /* Creation options: the value qemu-img's "Formatting" line shows when
     * the option is not given (NULL: shown only when given). */
    const char *def;
    unsigned flags; /* bi_opt_flags */
};

/* Whether blkimg knows the image format by that name: 0, or -ENOENT.
 * Known formats include those it only recognises (see bi_format_caps). */
BI_EXPORT int bi_format_exists(const char *format);
/* Name of the i-th registered driver (formats, those only recognised
 * included, and protocols; 0-based, registry order), or NULL past the
 * last. */
BI_EXPORT const char *bi_driver_name(int i);

/* What blkimg can do with a driver (format or protocol), as flags. A
 * format that has neither OPEN nor CREATE is recognised by probing, and
 * refused. */
enum bi_format_flags {
    BI_FORMAT_OPEN = 1 << 0,      /* images open */
    BI_FORMAT_CREATE = 1 << 1,    /* images can be created */
    BI_FORMAT_BACKING = 1 << 2,   /* images can have a backing file */
    BI_FORMAT_COMPRESS = 1 << 3,  /* compressed writes (convert -c) */
    BI_FORMAT_SNAPSHOTS = 1 << 4, /* internal snapshots */
    BI_FORMAT_BITMAPS = 1 << 5,   /* persistent dirty bitmaps */
    BI_FORMAT_AMEND = 1 << 6,     /* amend */
    BI_FORMAT_MEASURE = 1 << 7,   /* measure */
    BI_FORMAT_PROTOCOL = 1 << 8,  /* a protocol driver (file), no format */
    /* A new image does not read as zeroes (encrypted: QEMU's
     * has_zero_init is 0), so a copy into it writes its zeroes. */
    BI_FORMAT_NO_ZERO_INIT = 1 << 9,
};
/* The BI_FORMAT_* flags of the driver named name, or -ENOENT. */
BI_EXPORT int bi_format_caps(const char *name);
/* Names of the drivers having all the BI_FORMAT_* flags in caps, sorted
 * by name: stores up to max of them in names (static strings) and
 * returns how many there are. */
BI_EXPORT size_t bi_format_names(unsigned caps, const char **names, size_t max);

/* The creation options of the driver named format in QEMU's order (that
 * of the "Formatting" line): with with_protocol, followed by those of the
 * protocol new files are created on, each name once (the format's wins),
 * as qemu-img merges them. *out is a malloc'd array of *n pointers into
 * the drivers' tables (free() it). 0, or -ENOENT for an unknown driver. */
BI_EXPORT int bi_create_opt_list(const char *format, bool with_protocol,
                                 const struct bi_opt_desc ***out, int *n);
/* The creation option key of format (or of the protocol new files are
 * created on), or NULL. */
BI_EXPORT const struct bi_opt_desc *bi_create_opt_find(const char *format,
                                                       const char *key);
/* The same for a new image named filename: with the options of the
 * protocol that name's prefix selects (rbd's for "rbd:..."; filename
 * NULL: the format's alone). */
BI_EXPORT int bi_create_opt_list_at(const char *format, const char *filename,
                                    const struct bi_opt_desc ***out, int *n);
BI_EXPORT const struct bi_opt_desc *bi_create_opt_find_at(const char *format,
                                                          const char *filename,
                                                          const char *key);
/* The options amend takes for format, as its -o help lists them: *out is
 * a malloc'd array of *n pointers into the driver's table (free() it).
 * 0, or -ENOTSUP if the format cannot amend (or is unknown). */
BI_EXPORT int bi_amend_opt_list(const char *format,
                                const struct bi_opt_desc ***out, int *n);
/* The runtime option (--image-opts, blkimg-io open -o) key of format, or
 * NULL if format does not know it. Mind BI_OPT_REFUSED. */
BI_EXPORT const struct bi_opt_desc *bi_runtime_opt_find(const char *format,
                                                        const char *key);

/* --------------------------------------------------------------- creation */

/* qemu-img's "Formatting 'filename', fmt=format k=v ..." line as data: the
 * creation options in QEMU's order as "key=value" strings (the given
 * value, sizes and numbers in decimal; else the default), n of them. */
typedef void bi_create_describe_cb(void *opaque, const char *filename,
                                   const char *format, const char *const *items,
                                   int n);

struct bi_create_opts {
    size_t struct_size; /* sizeof(struct bi_create_opts): the _init macro */
    const char *format; /* a format driver's name */
    uint64_t size;
    bool size_set;
    enum bi_prealloc prealloc;
    /* Format options as given with -o, "key=value" strings in order,
     * NULL-terminated, e.g. "cluster_size=65536". size and preallocation
     * may appear here too. */
    const char *const *options;
    const char *backing_file;
    const char *backing_fmt;
    /* Called once the options are accepted, before the file is created
     * (qemu-img create prints it); NULL: not called. */
    bi_create_describe_cb *describe;
    void *describe_opaque;
};
/* Sets the defaults (all empty) and o->struct_size (use the macro). */
BI_EXPORT void bi_create_opts_init_sized(struct bi_create_opts *o, size_t size);
#define bi_create_opts_init(o) bi_create_opts_init_sized((o), sizeof(*(o)))
/* Creates filename as o says; the format driver does the work. */
BI_EXPORT int bi_create(const char *filename, const struct bi_create_opts *o,
                        bi_error *err);

/* ------------------------------------------------------------------- info */

struct bi_snapshot_info {
    char *id;   /* malloc'd, never NULL */
    char *name; /* malloc'd, never NULL ("" if none) */
    uint64_t vm_state_size;
    uint64_t date_sec;
    uint32_t date_nsec;
    uint64_t vm_clock_nsec;
    uint64_t icount; /* UINT64_MAX if absent */
};
struct bi_image_info {
    const char *format; /* the driver's name (a static string) */
    uint64_t virtual_size;
    int64_t actual_size;      /* -1 if unknown */
    uint64_t cluster_size;    /* 0 if none */
    uint64_t vm_state_offset; /* where VM state is kept; 0 if none */
    bool encrypted;
    bool has_dirty_flag;
    bool dirty_flag;
    /* Backing file, malloc'd, NULL if none: as stored in the image,
     * resolved (NULL if unknown), and its format as stored (NULL if
     * none). */
    char *backing_filename;
    char *full_backing_filename;
    char *backing_format;
    /* qemu-img info's "format-specific" "data" (its "type" is the format
     * name): an object the driver fills, NULL if it has nothing to say.
     * bi_info_free frees it. */
    bi_value *specific;
    int n_snapshots;
    struct bi_snapshot_info **snapshots; /* freed by bi_info_free */
};
/* Fills *info (use the macro); bi_info_free releases it, also after a
 * failure. */
BI_EXPORT int bi_get_info_sized(bi_node *n, struct bi_image_info *info,
                                size_t size, bi_error *err);
#define bi_get_info(n, info, err)                                              \
    bi_get_info_sized((n), (info), sizeof(*(info)), (err))
BI_EXPORT void bi_info_free_sized(struct bi_image_info *info, size_t size);
#define bi_info_free(info) bi_info_free_sized((info), sizeof(*(info)))

/* ---------------------------------------------------------------- objects */

/* Defines an object as qemu-img's --object does ("tls-creds-psk,id=tls0,
 * dir=/path,endpoint=client"): TLS credentials that image options name
 * with tls-creds=ID. The credential files are checked now, as QEMU does.
 * Returns 0, or -errno with err set (QEMU's wording). */
BI_EXPORT int bi_object_add(const char *def, bi_error *err);

/* ------------------------------------------------------------ utilities */

/* qemu-img size parsing: "1G", "512", "1.5M", "1T"... Returns 0, -EINVAL
 * (not a number / bad suffix) or -ERANGE (too large). */
BI_EXPORT int bi_parse_size(const char *s, uint64_t *out);
/* qemu's human size: "1 GiB", "512 B", "1.5 MiB" (size_to_str). */
BI_EXPORT void bi_format_size(uint64_t v, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
