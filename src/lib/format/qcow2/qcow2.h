/* SPDX-License-Identifier: MIT */
/*
 * qcow2 format driver: internal state shared by the driver's files.
 *
 * Files: qcow2.c (header, open, close, info, driver table), qcow2_map.c
 * (cluster mapping, block status, allocating writes, zeroes, discard),
 * qcow2_refcount.c (refcounts and cluster allocation), qcow2_cache.c
 * (metadata table cache), qcow2_compress.c (zlib/zstd clusters),
 * qcow2_create.c (image creation), qcow2_snapshot.c (snapshot table),
 * qcow2_check.c (consistency check and repair), qcow2_bitmap.c (persistent
 * dirty bitmaps kept up to date).
 *
 * Locking: every request runs in a coroutine of one thread. s->lock (a
 * coroutine mutex) is held while metadata is looked up or changed; data
 * I/O done by the generic layer runs without it.
 *
 * Metadata write ordering (crash consistency, leaks allowed):
 *   data + COW  ->  refcount blocks  ->  flush  ->  L2 tables  ->  L1
 * and clusters that lose a reference are freed only after the L2 tables
 * that dropped the reference are on disk (deferred frees, applied in
 * co_flush).
 */
#ifndef BI_QCOW2_H
#define BI_QCOW2_H

#include "block/block.h"
#include "crypto/crypto.h"
#include "util/coroutine.h"
#include <endian.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

struct luks_header;

/* crypt_method in the header */
#define QCOW2_CRYPT_NONE 0
#define QCOW2_CRYPT_AES 1
#define QCOW2_CRYPT_LUKS 2

#ifndef BI_BS_RECURSE /* block.h: refine a data run with the file */
#define BI_BS_RECURSE (1u << 16)
#endif

#define QCOW2_MAGIC 0x514649fbU /* "QFI\xfb" */

#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21
#define QCOW2_MAX_L1_BYTES (32u * 1024 * 1024)
#define QCOW2_MAX_REFTABLE_BYTES (8u * 1024 * 1024)
#define QCOW2_MAX_SNAPSHOTS 65536
#define QCOW2_MAX_BACKING_NAME 1023
#define QCOW2_MAX_SNAPSHOT_EXTRA 1024

/* Header extension types */
#define QCOW2_EXT_END 0x00000000U
#define QCOW2_EXT_BACKING_FORMAT 0xe2792acaU
#define QCOW2_EXT_FEATURE_TABLE 0x6803f857U
#define QCOW2_EXT_BITMAPS 0x23852875U
#define QCOW2_EXT_CRYPTO 0x0537be77U
#define QCOW2_EXT_DATA_FILE 0x44415441U

/* Feature bits */
#define QCOW2_INCOMPAT_DIRTY (1ULL << 0)
#define QCOW2_INCOMPAT_CORRUPT (1ULL << 1)
#define QCOW2_INCOMPAT_DATA_FILE (1ULL << 2)
#define QCOW2_INCOMPAT_COMPRESSION (1ULL << 3)
#define QCOW2_INCOMPAT_EXTL2 (1ULL << 4)
#define QCOW2_INCOMPAT_KNOWN 0x1fULL
#define QCOW2_COMPAT_LAZY_REFCOUNTS (1ULL << 0)
#define QCOW2_AUTOCLEAR_BITMAPS (1ULL << 0)
#define QCOW2_AUTOCLEAR_DATA_FILE_RAW (1ULL << 1)
#define QCOW2_AUTOCLEAR_KNOWN 0x3ULL

/* Header field offsets (big endian on disk) */
#define QH_MAGIC 0
#define QH_VERSION 4
#define QH_BACKING_OFFSET 8
#define QH_BACKING_SIZE 16
#define QH_CLUSTER_BITS 20
#define QH_SIZE 24
#define QH_CRYPT 32
#define QH_L1_SIZE 36
#define QH_L1_OFFSET 40
#define QH_RT_OFFSET 48
#define QH_RT_CLUSTERS 56
#define QH_NB_SNAPSHOTS 60
#define QH_SNAPSHOTS_OFFSET 64
#define QH_INCOMPAT 72
#define QH_COMPAT 80
#define QH_AUTOCLEAR 88
#define QH_REFCOUNT_ORDER 96
#define QH_HEADER_LENGTH 100
#define QH_COMPRESSION_TYPE 104
#define QH_V2_LENGTH 72
#define QH_V3_MIN_LENGTH 104
#define QH_V3_LENGTH 112 /* with compression_type, padded */

/* Table entries */
#define L1E_OFFSET_MASK 0x00fffffffffffe00ULL
#define L1E_RESERVED_MASK 0x7f000000000001ffULL
#define L2E_OFFSET_MASK 0x00fffffffffffe00ULL
#define RTE_OFFSET_MASK 0xfffffffffffffe00ULL
#define QCOW_OFLAG_COPIED (1ULL << 63)
#define QCOW_OFLAG_COMPRESSED (1ULL << 62)
#define QCOW_OFLAG_ZERO (1ULL << 0)

#define QCOW2_COMPRESSION_ZLIB 0
#define QCOW2_COMPRESSION_ZSTD 1

/* What a (sub)cluster is, as QEMU classifies it. */
enum qcow2_sc_type {
    QC_UNALLOC_PLAIN, /* no host cluster; backing / zeroes */
    QC_UNALLOC_ALLOC, /* ext L2: host cluster present, subcluster not */
    QC_ZERO_PLAIN,    /* reads zeroes, no host offset */
    QC_ZERO_ALLOC,    /* reads zeroes, host cluster preallocated */
    QC_NORMAL,        /* data at host offset */
    QC_COMPRESSED,
    QC_INVALID,
};

/* A cached metadata table (one cluster). */
struct qcow2_cache_entry {
    uint64_t offset; /* host offset of the table, 0 = free slot */
    void *table;
    uint64_t lru;
    int ref;
    bool dirty;
    bool loading;
    int hnext; /* hash chain by offset */
    int pnext; /* hash chain by table pointer */
};

struct qcow2_cache {
    const char *name; /* "L2" / "refcount" */
    int n;
    struct qcow2_cache_entry *e;
    int *buckets;  /* by offset */
    int *pbuckets; /* by table pointer */
    int nbuckets;
    uint64_t clock;
    bi_co_queue waiters; /* waiting for a slot or a load */
};

struct qcow2_feature_name {
    uint8_t type, bit;
    char name[47];
};

struct qcow2_snapshot {
    uint64_t l1_table_offset;
    uint32_t l1_size;
    char *id_str;
    char *name;
    uint32_t date_sec, date_nsec;
    uint64_t vm_clock_nsec;
    uint64_t vm_state_size;
    uint64_t disk_size;
    bool has_icount;
    uint64_t icount;
    uint32_t extra_data_size;
    uint8_t *unknown_extra; /* extra data beyond what we know */
    uint32_t unknown_extra_len;
};

/* A persistent dirty bitmap as listed in the directory (info, check);
 * qcow2_bitmap.c keeps the contents up to date. */
struct qcow2_bitmap {
    char *name;
    uint32_t flags;
    uint8_t granularity_bits;
    uint64_t table_offset;
    uint32_t table_size; /* entries */
};

/* A range of host clusters whose reference is dropped once the L2 tables
 * that no longer point to them are on disk. */
struct qcow2_free_range {
    uint64_t offset;
    uint64_t len; /* bytes (compressed clusters: sector granular) */
};

#define QC_COMP_BUFS_KEEP 16

typedef struct qcow2_state {
    bi_node *node;
    uint32_t version;
    uint32_t cluster_bits;
    uint64_t cluster_size;
    uint32_t subcluster_bits;
    uint64_t subcluster_size;
    uint32_t sc_per_cluster; /* 1 or 32 */
    bool ext_l2;
    uint32_t l2_entry_size; /* bytes: 8 or 16 */
    uint32_t l2_bits;       /* log2 entries per L2 table */
    uint64_t l2_entries;

    uint64_t l1_table_offset;
    uint32_t l1_size;
    uint64_t *l1_table; /* host endian, l1_alloc entries */
    uint32_t l1_alloc;

    uint64_t refcount_table_offset;
    uint32_t refcount_table_clusters;
    uint64_t *refcount_table;     /* host endian */
    uint64_t refcount_table_size; /* entries */
    uint32_t refcount_order;
    uint32_t refcount_bits;
    uint64_t refcount_max;
    uint32_t rb_bits; /* log2 refcount entries per block */

    uint64_t incompat, compat, autoclear;
    uint32_t header_length;
    uint32_t compression_type;
    uint32_t crypt_method;
    bool has_crypto_hdr; /* the "full disk encryption" header extension */
    uint64_t crypto_hdr_offset, crypto_hdr_length;
    bi_value *luks_info;      /* info's "encrypt" object of a LUKS image */
    struct luks_header *luks; /* the parsed LUKS header (crypt_method 2) */
    /* the sector encryption of the data clusters, NULL until unlocked
     * (metadata-only opens); its sector positions are host offsets for
     * LUKS, guest offsets for the legacy AES (qc_crypt_pos) */
    bi_crypt *crypt;
    char *key_secret; /* encrypt.key-secret as opened (amend) */
    uint64_t csize_shift, csize_mask, cluster_offset_mask;

    uint32_t nb_snapshots;
    uint64_t snapshots_offset;
    uint64_t snapshots_size; /* bytes of the table on disk */
    struct qcow2_snapshot *snapshots;

    char *backing_file;
    char *backing_format;
    char *data_file_name;
    bi_node *data_file; /* NULL: data lives in n->file */
    bool data_file_raw;
    bool has_bitmaps;
    uint32_t nb_bitmaps; /* from the bitmaps extension (consistent only) */
    uint64_t bitmap_dir_size, bitmap_dir_offset;
    struct qcow2_bitmap *bitmaps;
    bool autoclear_pending; /* unknown/bitmap bits to clear on 1st write */
    struct qc_bm_state *bm_state; /* qcow2_bitmap.c: bitmaps kept (rw) */

    struct qcow2_feature_name *features;
    int n_features;

    struct qcow2_cache l2_cache;
    struct qcow2_cache rb_cache;
    bi_co_mutex lock;
    /* Debug events of the write being mapped (1 << BI_DBG_...), raised
     * once the lock is dropped, where QEMU raises them: a request held
     * at a breakpoint there holds no lock. Set and taken under lock. */
    uint64_t map_events;
    /* compressed writes take host space in the order they arrive (their
     * compression runs in parallel): a ticket each, served in order */
    uint64_t comp_ticket, comp_turn;
    bi_co_queue comp_wait;
    /* output buffers of compressed slices, kept for the next ones: fresh
     * 1 MiB allocations fragmented the heap (75 MiB RSS for convert -c) */
    void *comp_bufs[QC_COMP_BUFS_KEEP];
    int n_comp_bufs;

    uint64_t free_cluster_index; /* hint: no free cluster below */
    uint64_t free_byte_offset;   /* compressed packing, 0 = none */
    struct qcow2_free_range *pending_free;
    int n_pending_free, pending_free_alloc;
    uint64_t pending_free_bytes; /* what the pending ranges hold */
    bool rb_written_unflushed;   /* refcount blocks written, no flush yet */

    bool corrupt;
    bool signaled; /* a non-fatal corruption event was reported */
    bool read_only;
    bool close_prepared; /* close_co ran (bi_close reports its errors) */
    bool check_mode;     /* opened by check -r: corrupt images open writable */
    bool marked_dirty;   /* we set the dirty bit (lazy refcounts) */
    bool metadata_prealloc_checked;
    bool metadata_prealloc;
    uint64_t file_size; /* host file size at open, updated on growth */
    /* The file grown ahead of the allocations (O_DIRECT, see
     * qc_file_ahead): its length at open and how far it reaches now. */
    bool ahead_on;
    uint64_t ahead_open_len;
    uint64_t ahead_end;
} qcow2_state;

/* ---- helpers ---- */
static inline uint64_t qc_offset_into_cluster(const qcow2_state *s,
                                              uint64_t off)
{
    return off & (s->cluster_size - 1);
}
static inline uint64_t qc_start_of_cluster(const qcow2_state *s, uint64_t off)
{
    return off & ~(s->cluster_size - 1);
}
static inline uint64_t qc_size_to_clusters(const qcow2_state *s, uint64_t n)
{
    return (n + s->cluster_size - 1) >> s->cluster_bits;
}
static inline bi_node *qc_data_node(bi_node *n)
{
    qcow2_state *s = n->opaque;
    return s->data_file ? s->data_file : n->file;
}
static inline bool qc_has_data_file(const qcow2_state *s)
{
    return (s->incompat & QCOW2_INCOMPAT_DATA_FILE) != 0;
}

/* Reads an L2 entry (and, with extended L2, its bitmap) from a table. */
void qc_get_l2(const qcow2_state *s, const void *table, uint64_t idx,
               uint64_t *entry, uint64_t *bitmap);
void qc_set_l2(const qcow2_state *s, void *table, uint64_t idx, uint64_t entry,
               uint64_t bitmap);
/* Classifies subcluster sc of an L2 entry. */
enum qcow2_sc_type qc_sc_type(const qcow2_state *s, uint64_t entry,
                              uint64_t bitmap, unsigned sc);

/* Marks the image corrupt (header bit) and fails with -EIO. */
int qc_signal_corruption(bi_node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A corruption that fails this request only (QEMU's non-fatal event):
 * reported once, the image not marked; -EIO. */
int qc_signal_corruption_nonfatal(bi_node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Writes bytes of the header (host endian values converted). */
int qc_write_header_field(bi_node *n, uint64_t off, const void *be_bytes,
                          size_t len);
int qc_update_incompat(bi_node *n, uint64_t incompat);

/* ---- cache (qcow2_cache.c) ---- */
int qc_cache_init(struct qcow2_cache *c, const char *name, int entries);
void qc_cache_destroy(struct qcow2_cache *c);
/* Gets the table at offset (reads it unless fresh: then zero-filled). */
int qc_cache_get(bi_node *n, struct qcow2_cache *c, uint64_t offset, bool fresh,
                 void **table);
void qc_cache_put(struct qcow2_cache *c, void *table);
void qc_cache_mark_dirty(struct qcow2_cache *c, void *table);
/* Writes back dirty entries (L2: refcounts first). */
int qc_cache_writeback(bi_node *n, struct qcow2_cache *c);
/* Drops a table from the cache without writing it (freed cluster). */
void qc_cache_discard(struct qcow2_cache *c, uint64_t offset);
bool qc_cache_has_dirty(const struct qcow2_cache *c);
/* Forgets every unpinned entry without writing it. */
void qc_cache_drop_all(struct qcow2_cache *c);

/* ---- refcounts (qcow2_refcount.c) ---- */
int qc_refcount_init(bi_node *n);
int qc_get_refcount(bi_node *n, uint64_t cluster_index, uint64_t *rc);
/* Adds delta to the refcount of every cluster in [offset, offset+len). */
int qc_update_refcount(bi_node *n, uint64_t offset, uint64_t len,
                       int64_t delta);
/* Allocates nb contiguous clusters (refcount 1); returns host offset. */
int64_t qc_alloc_clusters(bi_node *n, uint64_t nb);
/* New host clusters now reach end (bytes): grows the file ahead of them
 * when that makes the data writes faster (O_DIRECT). */
void qc_file_ahead(bi_node *n, uint64_t end);
/* At close: cuts the file back to the last byte in use after growing it
 * ahead (nothing otherwise). */
void qc_file_ahead_trim(bi_node *n);
/* Allocates up to nb clusters at exactly offset (those free); returns the
 * count allocated (0 if the first is in use). */
int64_t qc_alloc_clusters_at(bi_node *n, uint64_t offset, uint64_t nb);
/* Allocates size bytes for compressed data (packing), returns offset. */
int64_t qc_alloc_bytes(bi_node *n, uint64_t size);
/* Queues a reference drop to apply after the next L2 writeback. */
void qc_defer_free(bi_node *n, uint64_t offset, uint64_t len);
void qc_free_l2_entry_clusters(bi_node *n, uint64_t entry);
int qc_apply_pending_frees(bi_node *n);
/* Before an allocation of nb clusters: when the clusters waiting to be
 * freed would hold it (and are at least QC_RECLAIM_MIN bytes), the
 * metadata goes to disk and they are freed now, so the allocation reuses
 * them instead of growing the file (as QEMU reuses freed clusters). The
 * L2 tables that dropped the references are on disk before the clusters
 * can be handed out again. 0 or -errno. */
int qc_reclaim_freed(bi_node *n, uint64_t nb);
#define QC_RECLAIM_MIN (4ULL << 20)
/* Flushes everything in the right order (refcounts, L2, frees). */
int qc_flush_metadata(bi_node *n);
/* Checks that [offset, offset+len) on n->file overlaps no metadata; on
 * overlap marks the image corrupt and returns -EIO. ign: metadata kinds
 * to ignore (bit mask of QC_OL_*). */
enum {
    QC_OL_HEADER = 1 << 0,
    QC_OL_L1 = 1 << 1,
    QC_OL_L2 = 1 << 2,
    QC_OL_REFTABLE = 1 << 3,
    QC_OL_REFBLOCK = 1 << 4,
    QC_OL_SNAPTABLE = 1 << 5,
    QC_OL_SNAP_L1 = 1 << 6,
};
int qc_check_overlap(bi_node *n, int ign, uint64_t offset, uint64_t len);
/* Size of the host file in clusters as known. */
uint64_t qc_host_clusters(bi_node *n);

/* ---- mapping (qcow2_map.c) ---- */
int qc_get_l2_table(bi_node *n, uint64_t guest_off, bool alloc, void **table,
                    uint64_t *l2_index);
int qc_write_l1_entry(bi_node *n, uint32_t idx);
/* Grows the active L1 table to min_size entries (lock held). */
int qc_grow_l1(bi_node *n, uint64_t min_size);

/* ---- compression (qcow2_compress.c) ---- */
int qc_decompress(int type, const void *src, size_t slen, void *dst,
                  size_t dlen);
/* Returns the compressed size, or -ENOSPC if it does not fit in dlen. */
/* Frees the kept output buffers of compressed writes. */
void qc_comp_bufs_free(qcow2_state *s);
long qc_compress(int type, const void *src, size_t slen, void *dst,
                 size_t dlen);
/* Reads and decompresses the cluster of L2 entry into buf (cluster size) */
int qc_read_compressed_cluster(bi_node *n, uint64_t entry, void *buf);

/* ---- snapshots (qcow2_snapshot.c) ---- */
/* How qc_read_snapshot_table treats a broken snapshot table (QEMU's
 * qcow2_do_read_snapshots). */
struct qc_snap_read {
    bool repair;            /* check -r all: drop what QEMU drops */
    bool strict;            /* plain open: refuse a table past the end of
                             * the file or an L1 table too large */
    uint32_t extra_dropped; /* out: entries whose extra data was cut */
    uint32_t reduced;       /* out: entries dropped off the end */
};
/* Reads the s->nb_snapshots entries at s->snapshots_offset into
 * s->snapshots (which must be empty) and sets s->snapshots_size; with
 * how->repair, s->nb_snapshots may shrink. 0 or -errno with err set in
 * QEMU's words; on failure no snapshot is kept. */
int qc_read_snapshot_table(bi_node *n, struct qc_snap_read *how, bi_error *err);
/* qc_read_snapshot_table for a plain open (strict, no repair). */
int qc_read_snapshots(bi_node *n, bi_error *err);
void qc_free_snapshots(qcow2_state *s);
int qc_read_bitmaps(bi_node *n, bi_error *err);
void qc_free_bitmaps(qcow2_state *s);
/* Before the first change to the image: clears the autoclear bits we do
 * not maintain (bitmaps become inconsistent, as the spec asks). */
int qc_before_write(bi_node *n);
/* Before metadata-only changes (repairs): unknown autoclear bits only;
 * the guest data, and so the bitmaps, stay valid. */
int qc_before_meta_write(bi_node *n);
/* The driver's snapshot and bitmap operations (qcow2_snapshot.c,
 * qcow2_bitmap.c). */
extern const struct bi_snapshot_ops qc_snapshot_ops;
extern const struct bi_bitmap_ops qc_bitmap_ops;
int qc_snapshot_create(bi_node *n, const char *name, bi_error *err);
int qc_snapshot_apply(bi_node *n, const char *name, bi_error *err);
int qc_snapshot_delete(bi_node *n, const char *name, bi_error *err);
/* Writes the snapshot table anew (v3 extra data for every snapshot), the
 * header switched to it (lock held). */
int qc_rewrite_snapshot_table(bi_node *n);

/* ---- on-disk fields (big-endian) and errors ---- */
static inline uint16_t qc_get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return be16toh(v);
}
static inline uint32_t qc_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}
static inline uint64_t qc_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}
static inline void qc_put16(uint8_t *p, uint16_t v)
{
    v = htobe16(v);
    memcpy(p, &v, 2);
}
static inline void qc_put32(uint8_t *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, 4);
}
static inline void qc_put64(uint8_t *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, 8);
}
/* Sets err to the message without errno text (QEMU's qcow2 messages have
 * none), code as its error code (unless one is set); returns code. */
int qc_error(bi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- encryption (qcow2_luks.c) ---- */
/* Checks the encrypt.* open options against the header's method, reads
 * the LUKS header (info's "encrypt" object) and, when data will be
 * accessed, unlocks the key with the secret encrypt.key-secret names
 * into s->crypt. 0 or -errno with err set in QEMU's words. */
int qc_crypto_open(bi_node *n, qcow2_state *s, const struct bi_open_opts *o,
                   bi_error *err);
void qc_crypto_close(qcow2_state *s);
/* The luks creation keys among qcow2's "key=value" options: the
 * encrypt.* keys but encrypt.format, without the prefix (a NULL-terminated
 * copy, qc_luks_create_opts_free). */
char **qc_luks_create_opts(const char *const *opts);
void qc_luks_create_opts_free(char **v);
/* The luks code's words about its keys as qcow2 says them in QEMU
 * ("Parameter 'encrypt.key-secret' ..."). */
void qc_luks_error_words(bi_error *err);
/* Creation: allocates clusters for the LUKS header h of a new image n
 * (open read-write, no encryption yet), writes it there with key slot 0
 * holding mk under pw; the header's offset and length in *off, *len (the
 * caller writes the crypto header extension). 0 or -errno, err set. */
int qc_luks_create_header(bi_node *n, struct luks_header *h, const char *pw,
                          const uint8_t *mk, uint64_t iter_time, uint64_t *off,
                          uint64_t *len, bi_error *err);
/* Encrypts (or decrypts) len bytes of buf in place, the data at guest
 * offset guest stored at host offset host: whole 512-byte sectors, or
 * -EIO. 0 or -errno. */
int qc_crypt_buf(qcow2_state *s, bool encrypt, uint64_t guest, uint64_t host,
                 uint8_t *buf, uint64_t len);
/* Where the data at guest offset guest, stored at host offset host,
 * lies in the cipher's sector numbering. */
static inline uint64_t qc_crypt_pos(const qcow2_state *s, uint64_t guest,
                                    uint64_t host)
{
    return s->crypt_method == QCOW2_CRYPT_LUKS ? host : guest;
}

/* ---- persistent dirty bitmaps (qcow2_bitmap.c) ---- */
/* Validates the bitmaps of a consistent extension (one error for a damaged
 * directory); track: keep them up to date (read-write opens). */
int qc_bitmaps_open(bi_node *n, bool track, bi_error *err);
/* The bitmaps are kept: their autoclear bit is not cleared on writes. */
bool qc_bitmaps_kept(const qcow2_state *s);
/* A guest change of [off, off+len) (lock held, before the change). */
int qc_bitmaps_mark(bi_node *n, uint64_t off, uint64_t len);
/* Resize (lock held): fails on in-use bitmaps as QEMU, then done. */
int qc_bitmaps_truncate_begin(bi_node *n, uint64_t size, bi_error *err);
void qc_bitmaps_truncate_done(bi_node *n, uint64_t size);
/* Close (lock held, metadata flushed): stores the bitmaps in use. */
int qc_bitmaps_store(bi_node *n);
void qc_bitmaps_free(qcow2_state *s);

/* ---- create and measure (qcow2_create.c, qcow2_measure.c) ---- */
/* The creation options, in QEMU's order. */
extern const struct bi_opt_desc qc_create_opts[];
/* qemu-img measure (bi_driver.measure). */
int qcow2_measure(const char *const *opts, bi_node *src, struct bi_measure *out,
                  bi_error *err);
int qcow2_create(const char *filename, const struct bi_create_opts *o,
                 bi_error *err);

/* ---- growth preallocation, refcount structures (qcow2_prealloc.c) ---- */
/* Refcount entry i of a refcount block of the given order. */
uint64_t qc_rc_get(uint32_t order, const void *block, uint64_t i);
void qc_rc_set(uint32_t order, void *block, uint64_t i, uint64_t v);
/* Refcount blocks needed to count clusters and themselves (QEMU's
 * qcow2_refcount_metadata_size fixed point). */
uint64_t qc_refblocks_needed(uint64_t clusters, uint64_t cs, uint32_t order,
                             bool generous);
/* Highest cluster with a non-zero refcount below file_len. */
int64_t qc_last_cluster(bi_node *n, uint64_t file_len);
/* Refcount structures covering start + additional clusters, built at start
 * (new blocks, then a new table); returns the end of them. Lock held. */
int64_t qc_refcount_area(bi_node *n, uint64_t start, uint64_t additional);
/* Maps [old_len, new_len) with preallocation (lock held); head: the guest
 * bytes of the partial cluster below old_len. */
int qc_preallocate_locked(bi_node *n, uint64_t old_len, uint64_t new_len,
                          enum bi_prealloc mode, const void *head,
                          uint64_t head_len, bi_error *err);

/* ---- refcount width change (qcow2_reforder.c) ---- */
typedef void qc_reorder_status_cb(void *opaque, int64_t off, int64_t total);
/* Rebuilds the refcount structures with 2^order bit entries (lock held,
 * v3 images); progress in QEMU's walk units. */
int qc_change_refcount_order(bi_node *n, uint32_t order,
                             qc_reorder_status_cb *cb, void *opaque,
                             bi_error *err);

/* ---- driver ops defined in qcow2_map.c ---- */
int qcow2_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                 struct bi_extent *ext);
int qcow2_co_write_done(bi_node *n, struct bi_extent *ext, int ret);
int qcow2_co_read_compressed(bi_node *n, const struct bi_extent *ext,
                             uint64_t off, uint64_t len,
                             const struct iovec *iov, int iovcnt);
int qcow2_co_pwrite_compressed(bi_node *n, uint64_t off, const void *buf,
                               uint64_t len);
int qcow2_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len, int flags);
int qcow2_co_pdiscard(bi_node *n, uint64_t off, uint64_t len);
int qcow2_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                          struct bi_status *st);
int qcow2_co_truncate(bi_node *n, uint64_t size, bool exact,
                      enum bi_prealloc prealloc, bi_error *err);
int qcow2_check_image(bi_node *n, struct bi_check_result *res, int fix,
                      bi_error *err);
int qcow2_change_backing_file(bi_node *n, const char *backing_file,
                              const char *backing_fmt, bi_error *err);
int qcow2_co_make_empty(bi_node *n);
int qcow2_amend(bi_node *n, const char *const *options, bool force,
                bi_amend_status_cb *cb, void *opaque, bi_error *err);
/* The options amend takes, as qemu-img amend -o help lists them. */
extern const struct bi_opt_desc qc_amend_opts[];

/* An allocating write in flight (qcow2_map.c), from map to commit. */
struct qc_alloc {
    uint64_t guest;  /* first cluster's guest offset */
    uint64_t nb;     /* clusters */
    uint64_t host;   /* host offset of the first cluster */
    bool allocated;  /* host run newly allocated (refcount 1 each) */
    uint64_t wstart; /* host range written (head..tail) */
    uint64_t wend;
    uint64_t *old_entry; /* nb entries */
    uint64_t *old_bitmap;
};

/* The pieces of the allocating write that decide without I/O
 * (qcow2_map.c; unit-tested in tests/unit/test_qcow2_wplan.c). */
bool qc_mw_in_place(const qcow2_state *s, uint64_t entry, uint64_t bitmap,
                    uint64_t a, uint64_t b);
bool qc_mw_has_old_data(const qcow2_state *s, uint64_t entry, uint64_t bitmap);
bool qc_mw_needs_bitmap_update(const qcow2_state *s, uint64_t entry);
bool qc_mw_is_own_zero(const qcow2_state *s, uint64_t entry);
void qc_mw_cow_bounds(const qcow2_state *s, const struct qc_alloc *a,
                      uint64_t off, uint64_t wend, bool partial, bool more,
                      uint64_t *head, uint64_t *tail);

#endif
