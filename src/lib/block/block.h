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
    /* DATA extents of encrypted images: the host bytes are ciphertext of
     * crypt (sector encryption, crypto/crypto.h), which the generic layer
     * decrypts after reading and encrypts into its own bounce buffer
     * before writing (never in the caller's buffer), whole encryption
     * sectors at a time (partial ones read, decrypted and merged first).
     * crypt_offset is where the mapped offset lies in the cipher's sector
     * numbering (sector = position / sector size): the guest offset for a
     * LUKS image (payload-relative), the host offset for qcow2's LUKS. The
     * sectors around the range must lie host-contiguously beside it.
     * cow_head/cow_tail bytes are plaintext here too. NULL: plain. */
    struct bi_crypt *crypt;
    uint64_t crypt_offset;
};

enum bi_map_flags {
    BI_MAP_READ = 0,
    BI_MAP_WRITE = 1 << 0, /* allocate as needed; len may be cut short */
};

struct bi_check_result; /* blkimg/qcow2.h */
struct bi_optlist;      /* util/util.h */
struct bi_snapshot_info;
struct bi_bitmap_info;
struct bi_measure; /* blkimg/convert.h */

/* A format's layout facts, for the generic layer and the copy engine. */
struct bi_geometry {
    /* The allocation unit (cluster, grain, block): writes that change the
     * mapping are serialised at it, compressed writes come in multiples of
     * it, the copy engine cuts chunks at it. 0: none. */
    uint64_t cluster_size;
    /* Block status never reports a run past a multiple of this (QEMU reads
     * one metadata table per query: qcow2's L2 table); commit and rebase
     * cut their runs there so that they allocate as QEMU does. 0: none. */
    uint64_t status_span;
    /* Where the VM state lives, past the guest data (qemu-io's info);
     * 0: no VM state. */
    uint64_t vm_state_offset;
    /* Data is written compressed only, whole clusters in guest order
     * (QEMU's needs_compressed_writes: vmdk's streamOptimized): the copy
     * engine writes such a target as with -c, and ordinary writes go to
     * co_pwrite_compressed. */
    bool compressed_writes_only;
};

/* co_block_status only (never returned to callers): the data run lies on
 * a file whose holes read as zeroes, so the generic layer refines it with
 * the host node's status (QEMU's BDRV_BLOCK_RECURSE; qcow2 sets it for
 * metadata-preallocated images). */
#define BI_BS_RECURSE (1u << 16)
/* co_block_status of protocols only: the run reads as zeroes but is not
 * allocated in the storage's own view (an NBD server's allocation depth
 * 0), so the generic layer does not call it allocated. */
#define BI_BS_NOT_ALLOCATED (1u << 17)

/* Internal snapshots (blkimg/image_ops.h). The co_* calls run in a
 * coroutine; errors carry QEMU's words. */
struct bi_snapshot_ops {
    /* A snapshot of the current state named name (read-write node). */
    int (*co_create)(bi_node *n, const char *name, bi_error *err);
    /* Reverts to / deletes the snapshot with that id or name. */
    int (*co_apply)(bi_node *n, const char *name_or_id, bi_error *err);
    int (*co_delete)(bi_node *n, const char *name_or_id, bi_error *err);
    /* A read-only node reads the snapshot with that id and/or name (one
     * may be NULL) until it is closed. */
    int (*co_load_tmp)(bi_node *n, const char *id, const char *name,
                       bi_error *err);
    /* The snapshots: *out malloc'd (NULL when none), *count entries. */
    int (*list)(bi_node *n, struct bi_snapshot_info ***out, int *count);
};

/* One change to the persistent dirty bitmaps (blkimg/image_ops.h). */
enum bi_bitmap_op {
    BI_BITMAP_ADD, /* granularity (0: default), disabled */
    BI_BITMAP_REMOVE,
    BI_BITMAP_CLEAR,
    BI_BITMAP_ENABLE, /* enable: true enables, false disables */
    BI_BITMAP_MERGE,  /* every bit of src's bitmap src_name into name */
};
struct bi_bitmap_req {
    enum bi_bitmap_op op;
    const char *name;
    uint64_t granularity;
    bool flag; /* ADD: disabled; ENABLE: enable */
    bi_node *src;
    const char *src_name;
};
struct bi_bitmap_ops {
    /* The node can hold persistent bitmaps now (e.g. qcow2 v3). */
    bool (*supported)(bi_node *n);
    /* The bitmaps in directory order: *out malloc'd, *count entries. */
    int (*list)(bi_node *n, struct bi_bitmap_info ***out, int *count);
    /* One crash-safe change, in a coroutine. MERGE: src (never NULL) has
     * bitmap ops too. */
    int (*co_change)(bi_node *n, const struct bi_bitmap_req *r, bi_error *err);
};

/* Points of a driver's work that a fault-injection filter (blkdebug) can
 * act on: QEMU 7.2's BlkdebugEvent, in its order (debug_events.def). */
enum bi_debug_event {
#define BI_DEBUG_EVENT(id, name) BI_DBG_##id,
#include "block/debug_events.def"
#undef BI_DEBUG_EVENT
    BI_DBG__MAX
};
/* The event's QEMU name ("l2_update"); NULL out of range. */
const char *bi_debug_event_name(enum bi_debug_event ev);
/* The event named name, or -1 (names as QEMU spells them). */
int bi_debug_event_lookup(const char *name);
/* Raises ev at n: the first node of n, n->file, n->file->file... whose
 * driver has debug_event gets it; nothing happens when none has. Formats
 * raise their events on their file node, as QEMU's BLKDBG_EVENT does on
 * bs->file (the walk only matters when a node sits between the format
 * and the filter). Cheap: drivers call it on hot paths. */
void bi_debug_event(bi_node *n, enum bi_debug_event ev);
/* Raises ev at n alone, if its driver has debug_event: the generic
 * request path raises pwritev and friends on the node it serves, as
 * QEMU's block/io.c does, so that they reach a filter only for the
 * requests made on the filter itself. */
void bi_debug_event_at(bi_node *n, enum bi_debug_event ev);

struct bi_driver {
    const char *name;
    bool is_protocol;
    /* Formats: guest offset X is offset X of the file and there is no
     * metadata (raw). Such a node shares its file as its user shares it
     * (no lock of its own), a probe that lands on it is a guess (the
     * warning and the protection of block 0), block status needs no
     * refinement from the file, and a copy into it may go out of order
     * and through copy_file_range. */
    bool identity_map;
    /* Formats: a new image does not read as zeroes (its unwritten
     * ciphertext decrypts to noise: luks), QEMU's has_zero_init 0. */
    bool no_zero_init;
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
    /* Creation options in QEMU's order, the "Formatting" line's (formats:
     * their own; protocols: those of every new file). */
    const struct bi_opt_desc *create_opts;
    /* Protocols: applies the creation options only it takes ("key=value",
     * NULL-terminated; e.g. nocow) to filename before the format driver
     * creates the image (the file may not exist yet). */
    int (*create_prepare)(const char *filename, const char *const *opts,
                          bi_error *err);
    /* Formats: qemu-img measure for a new image with creation options
     * opts ("key=value", keys known): for src's contents, or (src NULL) an
     * empty image of the options' size. */
    int (*measure)(const char *const *opts, bi_node *src,
                   struct bi_measure *out, bi_error *err);
    /* Options amend takes (its -o help); with amend below. */
    const struct bi_opt_desc *amend_opts;
    /* Runtime options (--image-opts) the driver knows. */
    const struct bi_opt_desc *runtime_opts;
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
    /* Formats: the layout facts (the struct comes zeroed). */
    void (*get_geometry)(bi_node *n, struct bi_geometry *g);

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
    const struct bi_snapshot_ops *snapshot; /* NULL: no snapshots */
    const struct bi_bitmap_ops *bitmap;     /* NULL: no bitmaps */

    /* ---- Protocols: how they are named, locked and copied between ---- */
    /* The prefixes of the file names this protocol opens, NULL-terminated
     * (QEMU's protocol_name: "nbd" takes "nbd:..." and "nbd://..."). A
     * name without a known prefix is a local file. */
    const char *const *prefixes;
    /* Turns a file name carrying one of the prefixes into the driver's
     * options, the keys --image-opts (and json:) give, appended to opts
     * (which holds the options given besides the name: a key the name
     * also sets is refused). Returns 0 or -errno with err set (QEMU's
     * wording). */
    int (*parse_filename)(const char *filename, struct bi_optlist *opts,
                          bi_error *err);
    /* Image locking: the node holds perm and shares shared (BI_PERM_*
     * bits, QEMU's numbering). NULL: the protocol has no locks. */
    int (*set_perm)(bi_node *n, unsigned perm, unsigned shared, bi_error *err);
    /* Copy offload: copies len bytes from off of this node to dst_off of
     * dst (a node of the same driver) without moving them through memory.
     * -ENOTSUP (or another error) when it cannot: the caller copies them
     * itself. NULL: never. */
    int (*co_copy_range)(bi_node *n, uint64_t off, bi_node *dst,
                         uint64_t dst_off, uint64_t len);
    /* Formats that can stand as another format's file (QEMU's raw with
     * offset and size: a disk inside an OVA, json:{"driver": "vmdk",
     * "file": {"driver": "raw", "offset": N, ...}}): opens the node that
     * takes the place of the file child from the protocol options naming
     * this driver ("driver=NAME", its own keys, "file.*" for its own file;
     * filename as bi_open_protocol has it). NULL with err set on failure.
     * NULL entry: the format cannot. */
    bi_node *(*open_as_file)(const char *filename, const struct bi_open_opts *o,
                             bi_error *err);
    /* Filters for fault injection: an event happened in a node above
     * (bi_debug_event). Yields only to suspend the request at a
     * breakpoint (below). NULL: passed further down. */
    void (*debug_event)(bi_node *n, enum bi_debug_event ev);
    /* Breakpoints (bi_debug_breakpoint and friends in blkimg.h, whose
     * contracts they keep); debug_event may then yield, in a coroutine,
     * to suspend the request that raised it. NULL: passed further down. */
    int (*debug_breakpoint)(bi_node *n, enum bi_debug_event ev,
                            const char *tag);
    int (*debug_remove_breakpoint)(bi_node *n, const char *tag);
    int (*debug_resume)(bi_node *n, const char *tag);
    bool (*debug_is_suspended)(bi_node *n, const char *tag);
};

/* Write flag of the generic layer only (never reaches a driver): the
 * buffer is zeroes a zero write falls back on; detect-zeroes must not turn
 * it into a zero write again. */
#define BI_REQ_NO_DETECT_ZEROES (1 << 8)

/* Permission bits, numbered as QEMU 7.2 numbers them (its lock bytes are
 * 100 + bit held, 200 + bit not shared). */
enum {
    BI_PERM_CONSISTENT_READ = 0x01,
    BI_PERM_WRITE = 0x02,
    BI_PERM_WRITE_UNCHANGED = 0x04,
    BI_PERM_RESIZE = 0x08,
    BI_PERM_ALL = 0x0f,
};
/* Asks n's protocol driver to hold perm and share shared (no-op, 0, for a
 * protocol without locks). 0 or -errno with err set. */
int bi_node_set_perm(bi_node *n, unsigned perm, unsigned shared, bi_error *err);
/* Copy offload between two protocol nodes of one driver (co_copy_range);
 * -ENOTSUP when they cannot. In a coroutine. */
int bi_co_copy_range(bi_node *src, uint64_t off, bi_node *dst, uint64_t dst_off,
                     uint64_t len);
/* The protocol driver that opens filename: the one whose prefix it
 * carries, else file. */
const struct bi_driver *bi_protocol_for(const char *filename);
/* Creates the protocol-level file of a new image (raw, qcow2's header
 * file, data files) with its protocol: file creates it; a protocol that
 * cannot create (nbd) opens the existing storage, checks that it holds
 * o->size bytes and zeroes its first sector, as QEMU's fallback does. */
int bi_create_file(const char *filename, const struct bi_create_opts *o,
                   bi_error *err);

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
    /* Protocols: the options that make QEMU name the node (and a format
     * on it) by a json: name rather than its file name (an object with
     * "driver", as QEMU's bdrv_refresh_filename builds it); NULL: named
     * by filename. Owned; the format on it gets json:{"driver": FORMAT,
     * "file": these} once its graph is open. */
    bi_value *name_opts;
    char *backing_filename; /* as stored (formats) */
    char *backing_format;
    bi_node *file;    /* protocol child of a format node */
    bi_node *backing; /* backing node, or NULL */
    bi_node *parent;
    uint64_t size;
    bool read_only;
    bool format_probed; /* raw guessed by probing */
    /* Protocols: the driver was named by the options (driver=file), not
     * chosen by the file name (QEMU's file driver then takes regular
     * files only). */
    bool driver_named;
    enum bi_detect_zeroes detect_zeroes; /* for writes made on the node */
    enum bi_cache cache;
    struct bi_open_opts opts; /* as opened (strings not owned) */
    struct bi_limits limits;
    struct bi_stats stats;
    LIST_HEAD(, bi_tracked_req) tracked;
    /* Write requests (writes, zero writes, discards) begun on the node,
     * and their count at its last successful flush: equal when a flush
     * has nothing new to make durable (QEMU's write_gen/flushed_gen; for
     * the flush_to_disk event and blkdebug only, not to skip flushes). */
    uint64_t write_gen, flushed_gen;
};

/* Registry (src/lib/format/probe.c) */
const struct bi_driver *bi_driver_find(const char *name);
/* The i-th registered driver (0-based), NULL past the last. */
const struct bi_driver *bi_driver_at(int i);
/* The protocol new image files are created on: the first registered
 * (formats.c). */
const struct bi_driver *bi_create_protocol(void);
/* The entry of an option table (may be NULL) named key, or, for a
 * BI_OPT_PREFIX entry, that key starts with; NULL if none. */
const struct bi_opt_desc *bi_opt_lookup(const struct bi_opt_desc *table,
                                        const char *key);
/* What probing falls back on (an empty file, bytes no format claims): the
 * first registered format without metadata (identity_map: raw). */
const struct bi_driver *bi_probe_fallback(void);
/* Bytes of an image that probing looks at: QEMU's BLOCK_PROBE_BUF_SIZE,
 * also the block 0 a probed raw image protects (io.c). */
#define BI_PROBE_BYTES 512
/* The format driver whose probe scores highest on buf (BI_PROBE_BYTES
 * bytes, zero-filled past the end of the file; see bi_driver.probe); ties
 * go to the driver listed first, as in QEMU. Raw when no format claims
 * it (raw scores 1). Never NULL. */
const struct bi_driver *bi_probe_format(const uint8_t *buf, size_t len,
                                        const char *filename);
/* Every registered driver's table, bi_drv_<name>. */
#define BI_DRIVER(name) extern const struct bi_driver bi_drv_##name;
#include "format/drivers.def"
#undef BI_DRIVER

/* "json:" and v in QEMU's one-line form, members in QDict order: the
 * name QEMU gives a node opened with options (malloc'd). */
char *bi_json_name(const bi_value *v);
/* Opens a protocol node on filename (used by format drivers for external
 * data files and by the generic open). */
bi_node *bi_open_protocol(const char *filename, const struct bi_open_opts *o,
                          bi_error *err);
/* Opens a node of drv, a filter (is_protocol, passing its requests on to
 * its file child), over child, which it takes: child is closed with the
 * node; when the open fails, child stays the caller's. o->protocol_opts are
 * drv's own options; the node is writable when child is. Sets its limits. NULL
 * with err set on failure. */
bi_node *bi_open_filter_over(const struct bi_driver *drv, bi_node *child,
                             const char *filename, const struct bi_open_opts *o,
                             bi_error *err);
/* Opens a node with an explicit format over filename (backing files). */
bi_node *bi_open_node(const char *filename, const char *format,
                      const struct bi_open_opts *o, bi_error *err);
void bi_node_free(bi_node *n);

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
/* For a protocol's co_block_status on storage of size bytes: st says
 * "offset off of n" (no flags yet). At or past size it answers zeroes to
 * the end and returns true (done); otherwise *len is cut at size and it
 * returns false. */
bool bi_status_protocol_start(bi_node *n, uint64_t size, uint64_t off,
                              uint64_t *len, struct bi_status *st);
/* Writes clusters compressed through the format driver. */
int bi_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                            uint64_t len);

/* The node's geometry (all zero for drivers without one). */
void bi_node_geometry(bi_node *n, struct bi_geometry *g);

/* Limits of a node that takes any byte range (request alignment 1, the
 * driver's own choice): a format driver that maps ranges onto children
 * which align their own I/O (max_transfer 0: no limit of its own), or a
 * protocol whose library takes any offset and length (with its
 * max_transfer, 0 for none, and no memory alignment). */
void bi_limits_any_range(struct bi_limits *l, uint64_t max_transfer);
void bi_limits_any_buffer(struct bi_limits *l, uint64_t max_transfer);
/* The node whose internal snapshots n has: n when its driver has
 * snapshot ops, else the file of an identity-map format (QEMU's fallback
 * to the primary child: raw on RBD lists the RBD image's), else n. */
bi_node *bi_snapshot_node(bi_node *n);
/* For get_info: replaces the malloc'd string *field with a copy of value
 * (NULL or "": none, *field becomes NULL). */
void bi_info_set(char **field, const char *value);

/* Runs fn(arg) in a fresh coroutine and waits for it (from the main
 * context: polls the loop; from a coroutine: calls fn directly). */
int bi_run_co(int (*fn)(void *arg), void *arg);
/* A format driver's open body run as bi_run_co runs fn: fn(n, o, err) in
 * a coroutine (it reads through the request path); on failure cleanup(n)
 * (may be NULL) frees what fn left. Returns fn's result. */
int bi_run_co_open(int (*fn)(bi_node *n, const struct bi_open_opts *o,
                             bi_error *err),
                   void (*cleanup)(bi_node *n), bi_node *n,
                   const struct bi_open_opts *o, bi_error *err);

/* Stats helpers used by drivers. */
static inline void bi_stats_io(bi_node *n, uint64_t rd, uint64_t wr)
{
    n->stats.io_calls++;
    n->stats.bytes_read += rd;
    n->stats.bytes_written += wr;
}

#endif
