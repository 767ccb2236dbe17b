/* SPDX-License-Identifier: MIT */
/*
 * The generic block layer's internal view: nodes and driver tables.
 *
 * A protocol driver (file) does real I/O on requests the generic layer has
 * already aligned (offset, length and memory) and split.
 *
 * A format driver (raw, qcow2) does no data I/O of its own: it MAPS a guest
 * range to one extent (the longest run of one kind from the offset) and the
 * generic layer moves the data. Writes that allocate return the new host
 * run plus any copy-on-write head/tail bytes; the generic layer writes
 * head + guest data + tail as one vectored I/O and then calls co_write_done
 * so that the driver commits its metadata.
 *
 * Every co_* operation runs in a coroutine and may yield.
 */
#ifndef BI_BLOCK_H
#define BI_BLOCK_H

#include "blkimg/blkimg.h"
#include "blkimg/image_ops.h"
#include "util/coroutine.h"
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/uio.h>

enum bi_extent_kind {
    BI_EXT_DATA,       /* host_offset on host node, host-contiguous */
    BI_EXT_ZERO,       /* reads as zeroes */
    BI_EXT_UNALLOC,    /* not allocated here: backing file, else zeroes */
    BI_EXT_COMPRESSED, /* one compressed cluster (len <= cluster) */
};

struct bi_extent {
    enum bi_extent_kind kind;
    uint64_t len;         /* guest bytes from the mapped offset */
    bi_node *host;        /* DATA: node holding the bytes (file/data file) */
    uint64_t host_offset; /* DATA: where the mapped offset lives */
    /* BI_MAP_WRITE only: bytes to write just before / after the guest
     * data, in the same vectored write (copy-on-write of partial clusters).
     * Buffers are driver-allocated (bi_blockalign) and freed in
     * co_write_done. */
    void *cow_head;
    uint64_t cow_head_len;
    void *cow_tail;
    uint64_t cow_tail_len;
    /* The data write must be followed by a flush of host before
     * co_write_done (e.g. writethrough metadata ordering). */
    bool flush_before_done;
    void *cookie; /* driver-private, handed back to co_write_done */
};

enum bi_map_flags {
    BI_MAP_READ = 0,
    BI_MAP_WRITE = 1 << 0, /* allocate as needed; len may be cut short */
};

struct bi_check_result; /* format-specific; see blkimg/qcow2.h */

/* co_block_status only (never returned to callers): the data run lies on
 * a file whose holes read as zeroes, so the generic layer refines it with
 * the host node's status (QEMU's BDRV_BLOCK_RECURSE; qcow2 sets it for
 * metadata-preallocated images). */
#define BI_BS_RECURSE (1u << 16)

struct bi_driver {
    const char *name;
    bool is_protocol;
    size_t state_size; /* bytes of n->opaque, zeroed before open */

    /* Format probing, QEMU's rules and scores: buf holds the first
     * BI_PROBE_BYTES bytes of the file, zeroes past its end (len is
     * BI_PROBE_BYTES); filename is the name the user gave, NULL where
     * QEMU has none (json:/--image-opts, the first-sector check). Returns
     * 0 (not this format) to 100; the highest score wins (see
     * bi_probe_format). Must not read beyond buf[len - 1]. */
    int (*probe)(const uint8_t *buf, size_t len, const char *filename);

    /* Formats: n->file is open before this is called. Protocols: open
     * n->filename. Sets n->size. NULL: a format blkimg recognises (by
     * probe or by name) but cannot open yet; opening one is refused
     * before anything is read or written (src/lib/format/foreign.c). */
    int (*open)(bi_node *n, const struct bi_open_opts *o, bi_error *err);
    void (*close)(bi_node *n);
    /* Optional, in a coroutine, before close: writes what close would
     * (metadata, bitmaps, the clean flag) so that a failure reaches the
     * caller of bi_close; close then has nothing left to write. */
    int (*co_close_prepare)(bi_node *n);
    int (*create)(const char *filename, const struct bi_create_opts *o,
                  bi_error *err);
    /* Fills n->limits (protocols: detection; formats: usually from
     * children, plus their own granularity). */
    void (*refresh_limits)(bi_node *n);

    /* Protocols: aligned, memory-aligned, at most max_transfer. Return 0
     * or -errno (a short read past EOF is zero-filled by the driver). */
    int (*co_preadv)(bi_node *n, uint64_t off, uint64_t len,
                     const struct iovec *iov, int iovcnt);
    int (*co_pwritev)(bi_node *n, uint64_t off, uint64_t len,
                      const struct iovec *iov, int iovcnt, int flags);

    /* Formats: map guest [off, off+len) from off; ext->len > 0. */
    int (*co_map)(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                  struct bi_extent *ext);
    /* After the data write of a BI_MAP_WRITE extent (ret = its result). */
    int (*co_write_done)(bi_node *n, struct bi_extent *ext, int ret);
    /* Reads [off, off+len) lying in one BI_EXT_COMPRESSED extent. */
    int (*co_read_compressed)(bi_node *n, const struct bi_extent *ext,
                              uint64_t off, uint64_t len,
                              const struct iovec *iov, int iovcnt);
    /* Writes whole clusters compressed (the last may be the image's tail
     * cluster); off is cluster-aligned. len 0 ends the compressed stream
     * (the file end goes to a sector boundary). */
    int (*co_pwrite_compressed)(bi_node *n, uint64_t off, const void *buf,
                                uint64_t len);
    /* Serialisation granularity for writes (formats; 0 = none). */
    uint64_t (*write_granularity)(bi_node *n);

    /* Both kinds. */
    int (*co_pwrite_zeroes)(bi_node *n, uint64_t off, uint64_t len, int flags);
    int (*co_pdiscard)(bi_node *n, uint64_t off, uint64_t len);
    int (*co_flush)(bi_node *n); /* own state only; the generic layer
                                    flushes the children after */
    int (*co_truncate)(bi_node *n, uint64_t size, bool exact,
                       enum bi_prealloc prealloc, bi_error *err);
    int (*co_block_status)(bi_node *n, uint64_t off, uint64_t len,
                           struct bi_status *st);
    int64_t (*get_allocated_file_size)(bi_node *n);
    int (*get_info)(bi_node *n, struct bi_image_info *info, bi_error *err);
    int (*storage_info)(bi_node *n, struct bi_storage_info *out);
    int (*check)(bi_node *n, struct bi_check_result *res, int fix,
                 bi_error *err);
    /* Image operations (blkimg/image_ops.h); NULL: -ENOTSUP. */
    int (*change_backing_file)(bi_node *n, const char *backing_file,
                               const char *backing_fmt, bi_error *err);
    int (*co_make_empty)(bi_node *n);
    int (*amend)(bi_node *n, const char *const *options, bool force,
                 bi_amend_status_cb *cb, void *opaque, bi_error *err);
};

/* A write (or RMW) in flight, for overlap serialisation. */
struct bi_tracked_req {
    uint64_t start, end; /* padded range */
    bool serialising;
    bi_co_queue waiters;
    LIST_ENTRY(bi_tracked_req) link;
};

struct bi_node {
    const struct bi_driver *drv;
    void *opaque;
    char *filename;
    char *backing_filename; /* as stored (formats) */
    char *backing_format;
    bi_node *file;    /* protocol child of a format node */
    bi_node *backing; /* backing node, or NULL */
    bi_node *parent;
    uint64_t size;
    bool read_only;
    bool format_probed; /* raw guessed by probing */
    enum bi_cache cache;
    struct bi_open_opts opts; /* as opened (strings not owned) */
    struct bi_limits limits;
    struct bi_stats stats;
    LIST_HEAD(, bi_tracked_req) tracked;
};

/* Registry (src/lib/format/probe.c) */
const struct bi_driver *bi_driver_find(const char *name);
/* Bytes of an image that probing looks at: QEMU's BLOCK_PROBE_BUF_SIZE,
 * also the block 0 a probed raw image protects (io.c). */
#define BI_PROBE_BYTES 512
/* The format driver whose probe scores highest on buf (BI_PROBE_BYTES
 * bytes, zero-filled past the end of the file; see bi_driver.probe); ties
 * go to the driver listed first, as in QEMU. Raw when no format claims
 * it (raw scores 1). Never NULL. */
const struct bi_driver *bi_probe_format(const uint8_t *buf, size_t len,
                                        const char *filename);
extern const struct bi_driver bi_drv_file;
extern const struct bi_driver bi_drv_raw;
extern const struct bi_driver bi_drv_qcow2;

/* Opens a protocol node on filename (used by format drivers for external
 * data files and by the generic open). */
bi_node *bi_open_protocol(const char *filename, const struct bi_open_opts *o,
                          bi_error *err);
/* Opens a node with an explicit format over filename (backing files). */
bi_node *bi_open_node(const char *filename, const char *format,
                      const struct bi_open_opts *o, bi_error *err);
void bi_node_free(bi_node *n);

/* Hints applied to a new image file before its driver creates it
 * (src/lib/protocol/file_hints.c). */
struct bi_file_create_hints {
    bool nocow;
    uint64_t extent_size_hint; /* bytes; 0 = none */
};
int bi_file_apply_create_hints(const char *filename,
                               const struct bi_file_create_hints *h);

/* Coroutine versions of the public I/O calls: the generic request path.
 * Any alignment, any buffer. */
int bi_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                 const struct iovec *iov, int iovcnt);
int bi_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                  const struct iovec *iov, int iovcnt, int flags);
int bi_co_pread(bi_node *n, uint64_t off, void *buf, uint64_t len);
int bi_co_pwrite(bi_node *n, uint64_t off, const void *buf, uint64_t len,
                 int flags);
int bi_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags);
int bi_co_pdiscard(bi_node *n, uint64_t off, uint64_t len);
int bi_co_flush(bi_node *n);
int bi_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                       struct bi_status *st);
/* Writes clusters compressed through the format driver. */
int bi_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                            uint64_t len);

/* Runs fn(arg) in a fresh coroutine and waits for it (from the main
 * context: polls the loop; from a coroutine: calls fn directly). */
int bi_run_co(int (*fn)(void *arg), void *arg);

/* Stats helpers used by drivers. */
static inline void bi_stats_io(bi_node *n, uint64_t rd, uint64_t wr)
{
    n->stats.io_calls++;
    n->stats.bytes_read += rd;
    n->stats.bytes_written += wr;
}

#endif
