/* SPDX-License-Identifier: MIT */
/*
 * qcow2 persistent dirty bitmaps kept up to date (qcow2 spec, "Bitmaps").
 *
 * Every open with a consistent bitmaps extension validates the bitmap
 * directory and the tables of the bitmaps not in use with QEMU's limits;
 * a damaged directory fails the open with one message (QEMU's text).
 *
 * Read-write opens (not check -r) keep the bitmaps: the extension's
 * autoclear bit stays set and the enabled ("auto") bitmaps that are not
 * in use are loaded into memory, one chunk per bitmap table entry
 * (NULL: all zeros, BM_ONES: all ones, else one cluster of bits).
 *
 * Before the first guest change (write, zero write, discard, compressed
 * write) the loaded bitmaps are marked in use in a new copy of the
 * directory: new clusters, refcounts and data flushed, the header
 * extension switched to it (flushed), then the old directory freed. Each
 * guest change then sets the bits of the granules it touches.
 *
 * Close stores each bitmap marked in use by us: its non-zero chunks go to
 * new data clusters, its new table to new clusters, refcounts flushed,
 * then a new directory with IN_USE cleared is switched in as above, and
 * last the old table and data clusters are freed. A crash before the
 * switch leaves the bitmaps in use (inconsistent, as the spec asks) and
 * leaks clusters only.
 *
 * Disabled bitmaps and bitmaps in use at open are not touched, except by
 * a resize: it fails on an in-use bitmap (as QEMU does) and otherwise
 * loads and resizes every bitmap, which are then stored at close.
 */
#include "blkimg/qcow2.h"
#include "qcow2.h"
#include "util/util.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* QEMU's limits (block/qcow2-bitmap.c, block/qcow2.h) */
#define BME_MAX_TABLE_SIZE 0x8000000u
#define BME_MAX_PHYS_SIZE 0x20000000u
#define BME_MIN_GRANULARITY_BITS 9
#define BME_MAX_GRANULARITY_BITS 31
#define BME_MAX_NAME_SIZE 1023
#define BME_MAX_BITMAPS 65535
#define BME_MAX_DIR_SIZE (1024u * BME_MAX_BITMAPS)
#define BME_FLAG_IN_USE (1u << 0)
#define BME_FLAG_AUTO (1u << 1)
#define BME_RESERVED_FLAGS 0xfffffffcu
#define BME_TE_RESERVED 0xff000000000001feULL
#define BME_TE_OFFSET 0x00fffffffffffe00ULL
#define BME_TE_ALL_ONES 1ULL
#define BME_TYPE_DIRTY 1
#define BME_ENTRY_HDR 24

/* Our own bounds on what is held in memory (hostile images). */
#define BM_MAX_TOTAL_ENTRIES (1ULL << 22)
#define BM_MAX_MEM (1ULL << 30)

static uint8_t bm_ones_marker;
#define BM_ONES (&bm_ones_marker)

struct qc_bm {
    uint8_t **chunks; /* chunks_alloc entries, nchunks in use */
    uint64_t chunks_alloc;
    uint64_t nchunks;
    uint64_t nbits;
    uint32_t pos;      /* of the entry in the directory */
    bool inconsistent; /* IN_USE at open: never touched */
    bool loaded;       /* contents in memory */
    bool tracking;     /* enabled: guest changes set bits */
    bool in_use;       /* we marked it in use on disk: stored at close */
};

struct qc_bm_state {
    struct qc_bm *bm; /* s->nb_bitmaps */
    uint8_t *dir;     /* the directory as on disk */
    uint64_t dir_size;
    uint64_t mem;  /* bytes of chunks in memory */
    bool keep;     /* the autoclear bit stays set */
    bool tracking; /* some bitmap tracks guest changes */
    bool begun;    /* tracking bitmaps marked in use */
    bool failed;   /* an update failed: no more updates */
};

/* Bits a bitmap of granularity 2^gbits has for an image of size bytes,
 * and the table entries (clusters of bits) they take. */
static uint64_t bm_nbits(uint64_t size, unsigned gbits)
{
    return (size >> gbits) + ((size & ((1ULL << gbits) - 1)) != 0);
}
static uint64_t bm_nchunks(const qcow2_state *s, uint64_t nbits)
{
    uint64_t per = s->cluster_size * 8;
    return nbits / per + (nbits % per != 0);
}

static const uint8_t *entry_at(const struct qc_bm_state *st, uint32_t i)
{
    return st->dir + st->bm[i].pos;
}
static const char *entry_name(const uint8_t *e, int *len)
{
    *len = qc_get16(e + 18);
    return (const char *)e + BME_ENTRY_HDR + qc_get32(e + 20);
}

/* ------------------------------------------------------------ memory */

static void free_chunks(struct qc_bm_state *st, struct qc_bm *b, uint64_t from,
                        uint64_t cs)
{
    for (uint64_t c = from; c < b->chunks_alloc; c++) {
        if (b->chunks[c] && b->chunks[c] != BM_ONES) {
            bi_free_aligned(b->chunks[c]);
            st->mem -= cs;
        }
        b->chunks[c] = NULL;
    }
}

void qc_bitmaps_free(qcow2_state *s)
{
    struct qc_bm_state *st = s->bm_state;
    if (!st)
        return;
    for (uint32_t i = 0; st->bm && i < s->nb_bitmaps; i++) {
        if (st->bm[i].chunks)
            free_chunks(st, &st->bm[i], 0, s->cluster_size);
        free(st->bm[i].chunks);
    }
    free(st->bm);
    free(st->dir);
    free(st);
    s->bm_state = NULL;
}

static int bm_reserve(struct qc_bm *b, uint64_t n)
{
    if (n <= b->chunks_alloc)
        return 0;
    uint8_t **c = realloc(b->chunks, n * sizeof(*c));
    if (!c)
        return -ENOMEM;
    memset(c + b->chunks_alloc, 0, (n - b->chunks_alloc) * sizeof(*c));
    b->chunks = c;
    b->chunks_alloc = n;
    return 0;
}

/* Zeroes the bits of chunk c at and past nbits (the tail must be zero). */
static void clear_tail(const qcow2_state *s, struct qc_bm *b, uint64_t c)
{
    uint64_t per = s->cluster_size * 8;
    uint64_t first = c * per;
    if (!b->chunks[c] || b->chunks[c] == BM_ONES || b->nbits >= first + per)
        return;
    uint64_t keep = b->nbits > first ? b->nbits - first : 0;
    uint8_t *p = b->chunks[c];
    if (keep % 8)
        p[keep / 8] &= (uint8_t)((1u << (keep % 8)) - 1);
    uint64_t from = (keep + 7) / 8;
    memset(p + from, 0, s->cluster_size - from);
}

static uint8_t *new_chunk(bi_node *n, struct qc_bm_state *st, uint8_t fill)
{
    qcow2_state *s = n->opaque;
    if (st->mem + s->cluster_size > BM_MAX_MEM)
        return NULL;
    uint8_t *p = bi_blockalign(n->file, s->cluster_size);
    if (!p)
        return NULL;
    memset(p, fill, s->cluster_size);
    st->mem += s->cluster_size;
    return p;
}

/* Sets bits [first, last] of a loaded bitmap. */
static int set_bits(bi_node *n, struct qc_bm_state *st, struct qc_bm *b,
                    uint64_t first, uint64_t last)
{
    qcow2_state *s = n->opaque;
    uint64_t per = s->cluster_size * 8;
    while (first <= last) {
        uint64_t c = first / per;
        uint64_t cend = BI_MIN(last, c * per + per - 1);
        if (first == c * per && cend == c * per + per - 1) {
            /* the whole chunk: all ones, no memory */
            if (b->chunks[c] && b->chunks[c] != BM_ONES) {
                bi_free_aligned(b->chunks[c]);
                st->mem -= s->cluster_size;
            }
            b->chunks[c] = BM_ONES;
        } else if (b->chunks[c] != BM_ONES) {
            if (!b->chunks[c]) {
                b->chunks[c] = new_chunk(n, st, 0);
                if (!b->chunks[c])
                    return -ENOMEM;
            }
            uint8_t *p = b->chunks[c];
            uint64_t a = first - c * per, z = cend - c * per + 1; /* [a,z) */
            while (a < z && (a % 8)) {
                p[a / 8] |= (uint8_t)(1u << (a % 8));
                a++;
            }
            if (z - a >= 8) {
                memset(p + a / 8, 0xff, (z - a) / 8);
                a += (z - a) / 8 * 8;
            }
            while (a < z) {
                p[a / 8] |= (uint8_t)(1u << (a % 8));
                a++;
            }
        }
        first = cend + 1;
    }
    return 0;
}

/* ------------------------------------------------------------ loading */

/* The chunks of bitmap b from its table t: all-zero and all-ones entries
 * take no memory, the others are read from their clusters. */
static int read_chunks(bi_node *n, struct qc_bm_state *st, struct qc_bm *b,
                       const uint64_t *t)
{
    qcow2_state *s = n->opaque;
    for (uint64_t c = 0; c < b->nchunks; c++) {
        uint64_t off = t[c] & BME_TE_OFFSET;
        if (!off) {
            b->chunks[c] = (t[c] & BME_TE_ALL_ONES) ? BM_ONES : NULL;
            continue;
        }
        b->chunks[c] = new_chunk(n, st, 0);
        if (!b->chunks[c])
            return -ENOMEM;
        int ret = bi_co_pread(n->file, off, b->chunks[c], s->cluster_size);
        clear_tail(s, b, c);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static int read_table(bi_node *n, const uint8_t *e, uint64_t **out)
{
    uint32_t size = qc_get32(e + 8);
    uint64_t *t = malloc((size_t)size * 8);
    if (!t)
        return -ENOMEM;
    int ret = bi_co_pread(n->file, qc_get64(e), t, (uint64_t)size * 8);
    if (ret < 0) {
        free(t);
        return ret;
    }
    for (uint32_t i = 0; i < size; i++)
        t[i] = be64toh(t[i]);
    *out = t;
    return 0;
}

/* Loads the contents of bitmap i (its table was validated at open). */
static int load_bitmap(bi_node *n, uint32_t i, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    struct qc_bm *b = &st->bm[i];
    const uint8_t *e = entry_at(st, i);
    int nl;
    const char *name = entry_name(e, &nl);
    uint64_t *t = NULL;
    int ret = read_table(n, e, &t);
    if (ret == 0)
        ret = bm_reserve(b, b->nchunks);
    if (ret == 0)
        ret = read_chunks(n, st, b, t);
    free(t);
    if (ret < 0) {
        free_chunks(st, b, 0, s->cluster_size);
        return qc_error(err, ret, "Could not read bitmap '%.*s' from image: %s",
                        nl, name, strerror(-ret));
    }
    b->loaded = true;
    return 0;
}

/* ---------------------------------------------------------- validation */

struct range {
    uint64_t a, b; /* [a, b) */
    int what;      /* 0: metadata, 1: bitmap */
};

struct ranges {
    struct range *r;
    size_t n, alloc;
};

static int add_range(struct ranges *rs, uint64_t a, uint64_t len, int what)
{
    if (!len)
        return 0;
    if (rs->n == rs->alloc) {
        size_t na = rs->alloc ? rs->alloc * 2 : 256;
        struct range *r = realloc(rs->r, na * sizeof(*r));
        if (!r)
            return -ENOMEM;
        rs->r = r;
        rs->alloc = na;
    }
    rs->r[rs->n++] = (struct range){a, a + len, what};
    return 0;
}

static int cmp_range(const void *x, const void *y)
{
    const struct range *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* The metadata a bitmap cluster must not share (clusters we would free
 * at close): header, active L1 and L2 tables, refcount table and blocks,
 * snapshot table and L1 tables. */
static int add_metadata(bi_node *n, struct ranges *rs)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    int ret = add_range(rs, 0, cs, 0);
    if (ret == 0)
        ret = add_range(rs, s->l1_table_offset,
                        bi_align_up((uint64_t)s->l1_size * 8, cs), 0);
    for (uint32_t i = 0; ret == 0 && i < s->l1_size; i++)
        if (s->l1_table[i] & L1E_OFFSET_MASK)
            ret = add_range(rs, s->l1_table[i] & L1E_OFFSET_MASK, cs, 0);
    if (ret == 0)
        ret = add_range(rs, s->refcount_table_offset,
                        (uint64_t)s->refcount_table_clusters * cs, 0);
    for (uint64_t i = 0; ret == 0 && i < s->refcount_table_size; i++)
        if (s->refcount_table[i] & RTE_OFFSET_MASK)
            ret = add_range(rs, s->refcount_table[i] & RTE_OFFSET_MASK, cs, 0);
    if (ret == 0 && s->nb_snapshots)
        ret = add_range(rs, s->snapshots_offset,
                        bi_align_up(s->snapshots_size, cs), 0);
    for (uint32_t i = 0; ret == 0 && i < s->nb_snapshots; i++)
        ret = add_range(rs, s->snapshots[i].l1_table_offset,
                        bi_align_up((uint64_t)s->snapshots[i].l1_size * 8, cs),
                        0);
    if (ret == 0)
        ret = add_range(rs, s->bitmap_dir_offset,
                        bi_align_up(s->bitmap_dir_size, cs), 1);
    return ret;
}

/* A bitmap cluster overlapping metadata or another bitmap cluster. */
static bool ranges_overlap(struct ranges *rs)
{
    qsort(rs->r, rs->n, sizeof(*rs->r), cmp_range);
    for (size_t i = 1; i < rs->n; i++) {
        const struct range *p = &rs->r[i - 1], *c = &rs->r[i];
        if (c->a < p->b && (c->what || p->what))
            return true;
    }
    return false;
}

static bool in_file(const qcow2_state *s, uint64_t off, uint64_t len)
{
    uint64_t end = bi_align_up(s->file_size, s->cluster_size);
    return off <= end && len <= end - off;
}

struct name_ref {
    const char *p;
    int len;
};

static int cmp_name(const void *x, const void *y)
{
    const struct name_ref *a = x, *b = y;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return memcmp(a->p, b->p, (size_t)a->len);
}

/* Names are unique (sorted, not compared pairwise: 65535 bitmaps). */
static int check_names(struct qc_bm_state *st, uint32_t nb, bi_error *err)
{
    struct name_ref *v = malloc((size_t)nb * sizeof(*v));
    if (!v)
        return qc_error(err, -ENOMEM, "Could not load bitmaps: %s",
                        strerror(ENOMEM));
    for (uint32_t i = 0; i < nb; i++)
        v[i].p = entry_name(entry_at(st, i), &v[i].len);
    qsort(v, nb, sizeof(*v), cmp_name);
    int ret = 0;
    for (uint32_t i = 1; i < nb && ret == 0; i++)
        if (!cmp_name(&v[i - 1], &v[i]))
            ret = qc_error(err, -EINVAL, "Bitmap already exists: %.*s",
                           v[i].len, v[i].p);
    free(v);
    return ret;
}

/* The directory entries: QEMU's bitmap_list_load() and check_dir_entry()
 * rules, plus unique names. */
static int check_dir(bi_node *n, struct qc_bm_state *st, bi_error *err)
{
    qcow2_state *s = n->opaque;
    uint64_t pos = 0, cnt = 0;
    while (pos < st->dir_size) {
        const uint8_t *e = st->dir + pos;
        if (st->dir_size - pos < BME_ENTRY_HDR)
            return qc_error(err, -EINVAL, "Broken bitmap directory");
        if (++cnt > s->nb_bitmaps)
            return qc_error(err, -EINVAL,
                            "More bitmaps found than specified in header "
                            "extension");
        uint64_t len = bi_align_up(
            BME_ENTRY_HDR + (uint64_t)qc_get16(e + 18) + qc_get32(e + 20), 8);
        if (len > st->dir_size - pos)
            return qc_error(err, -EINVAL, "Broken bitmap directory");
        if (qc_get32(e + 20))
            return qc_error(err, -EINVAL, "Bitmap extra data is not supported");
        uint64_t toff = qc_get64(e);
        uint32_t tsize = qc_get32(e + 8), flags = qc_get32(e + 12);
        unsigned gbits = e[17];
        int nl;
        const char *name = entry_name(e, &nl);
        bool bad =
            tsize == 0 || toff == 0 || (toff & (s->cluster_size - 1)) ||
            tsize > BME_MAX_TABLE_SIZE || gbits > BME_MAX_GRANULARITY_BITS ||
            gbits < BME_MIN_GRANULARITY_BITS || (flags & BME_RESERVED_FLAGS) ||
            nl > BME_MAX_NAME_SIZE || e[16] != BME_TYPE_DIRTY;
        uint64_t phys = (uint64_t)tsize * s->cluster_size;
        if (!bad && phys > BME_MAX_PHYS_SIZE)
            bad = true;
        /* not in use: the table must cover the image */
        if (!bad && !(flags & BME_FLAG_IN_USE) &&
            bm_nbits(n->size, gbits) > phys * 8)
            bad = true;
        if (bad)
            return qc_error(err, -EINVAL,
                            "Bitmap '%.*s' doesn't satisfy the constraints", nl,
                            name);
        if (memchr(name, 0, (size_t)nl))
            return qc_error(err, -EINVAL, "Broken bitmap directory");
        st->bm[cnt - 1].pos = (uint32_t)pos;
        pos += len;
    }
    if (cnt != s->nb_bitmaps)
        return qc_error(
            err, -EINVAL,
            "Less bitmaps found than specified in header extension");
    return check_names(st, s->nb_bitmaps, err);
}

/* The tables of the bitmaps not in use: entries as the spec asks, size as
 * the image needs, clusters inside the file, nothing shared (rw only). */
static int check_tables(bi_node *n, struct qc_bm_state *st, bool rw,
                        bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct ranges rs = {0};
    uint64_t total = 0;
    int ret = rw ? add_metadata(n, &rs) : 0;
    for (uint32_t i = 0; ret == 0 && i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        const uint8_t *e = entry_at(st, i);
        int nl;
        const char *name = entry_name(e, &nl);
        uint32_t tsize = qc_get32(e + 8);
        b->inconsistent = (qc_get32(e + 12) & BME_FLAG_IN_USE) != 0;
        b->nbits = bm_nbits(n->size, e[17]);
        b->nchunks = bm_nchunks(s, b->nbits);
        if (b->inconsistent)
            continue; /* QEMU reads nothing of those */
        if (!in_file(s, qc_get64(e), (uint64_t)tsize * 8)) {
            ret = qc_error(err, -EINVAL,
                           "Could not read bitmap_table table from image for "
                           "bitmap '%.*s': %s",
                           nl, name, strerror(EINVAL));
            break;
        }
        total += tsize;
        if (total > BM_MAX_TOTAL_ENTRIES) {
            ret = qc_error(err, -EFBIG,
                           "Bitmap '%.*s' is too big: the bitmaps of this "
                           "image take more than %llu table entries",
                           nl, name, (unsigned long long)BM_MAX_TOTAL_ENTRIES);
            break;
        }
        uint64_t *t;
        ret = read_table(n, e, &t);
        if (ret < 0) {
            qc_error(err, ret,
                     "Could not read bitmap_table table from image for "
                     "bitmap '%.*s': %s",
                     nl, name, strerror(-ret));
            break;
        }
        if (rw)
            ret =
                add_range(&rs, qc_get64(e),
                          bi_align_up((uint64_t)tsize * 8, s->cluster_size), 1);
        for (uint32_t j = 0; ret == 0 && j < tsize; j++) {
            uint64_t off = t[j] & BME_TE_OFFSET;
            if ((t[j] & BME_TE_RESERVED) ||
                (off &&
                 ((t[j] & BME_TE_ALL_ONES) || (off & (s->cluster_size - 1)))) ||
                (off && !in_file(s, off, s->cluster_size))) {
                ret = qc_error(err, -EINVAL,
                               "Could not read bitmap_table table from image "
                               "for bitmap '%.*s': %s",
                               nl, name, strerror(EINVAL));
                break;
            }
            if (off && rw)
                ret = add_range(&rs, off, s->cluster_size, 1);
        }
        free(t);
        if (ret == 0 && tsize != b->nchunks)
            ret = qc_error(err, -EINVAL,
                           "Could not read bitmap '%.*s' from image: %s", nl,
                           name, strerror(EINVAL));
    }
    if (ret == -ENOMEM && err && !err->msg[0])
        qc_error(err, ret, "Could not load bitmaps: %s", strerror(ENOMEM));
    if (ret == 0 && rw && ranges_overlap(&rs))
        ret = qc_error(err, -EINVAL,
                       "Bitmap clusters overlap other metadata or each other; "
                       "run 'qemu-img check' on the image");
    free(rs.r);
    return ret;
}

int qc_bitmaps_open(bi_node *n, bool track, bi_error *err)
{
    qcow2_state *s = n->opaque;
    if (!s->has_bitmaps || !(s->autoclear & QCOW2_AUTOCLEAR_BITMAPS) ||
        s->version < 3)
        return 0;
    if (s->nb_bitmaps == 0)
        return qc_error(err, -EINVAL,
                        "found bitmaps extension with zero bitmaps");
    if (s->nb_bitmaps > BME_MAX_BITMAPS)
        return qc_error(err, -EINVAL,
                        "bitmaps_ext: Image has %" PRIu32
                        " bitmaps, exceeding the QEMU supported maximum of %d",
                        s->nb_bitmaps, BME_MAX_BITMAPS);
    if (s->bitmap_dir_size == 0)
        return qc_error(err, -EINVAL,
                        "Requested bitmap directory size is zero");
    if (s->bitmap_dir_size > BME_MAX_DIR_SIZE)
        return qc_error(err, -EINVAL,
                        "bitmaps_ext: bitmap directory size (%" PRIu64
                        ") exceeds the maximum supported size (%u)",
                        s->bitmap_dir_size, BME_MAX_DIR_SIZE);
    if (s->bitmap_dir_offset & (s->cluster_size - 1))
        return qc_error(err, -EINVAL,
                        "bitmaps_ext: invalid bitmap directory offset");
    if (!in_file(s, s->bitmap_dir_offset, s->bitmap_dir_size))
        return qc_error(err, -EINVAL, "Failed to read bitmap directory: %s",
                        strerror(EINVAL));

    struct qc_bm_state *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    s->bm_state = st;
    st->dir_size = s->bitmap_dir_size;
    st->dir = malloc(st->dir_size);
    st->bm = calloc(s->nb_bitmaps, sizeof(*st->bm));
    int ret = -ENOMEM;
    if (!st->dir || !st->bm)
        goto fail;
    ret = bi_co_pread(n->file, s->bitmap_dir_offset, st->dir, st->dir_size);
    if (ret < 0) {
        qc_error(err, ret, "Failed to read bitmap directory: %s",
                 strerror(-ret));
        goto fail;
    }
    ret = check_dir(n, st, err);
    if (ret == 0)
        ret = check_tables(n, st, track, err);
    if (ret < 0)
        goto fail;
    if (!track) {
        qc_bitmaps_free(s); /* validated; nothing is kept */
        return 0;
    }
    st->keep = true;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        if (b->inconsistent ||
            !(qc_get32(entry_at(st, i) + 12) & BME_FLAG_AUTO))
            continue;
        ret = load_bitmap(n, i, err);
        if (ret < 0)
            goto fail;
        b->tracking = true;
        st->tracking = true;
    }
    return 0;
fail:
    qc_bitmaps_free(s);
    return ret;
}

bool qc_bitmaps_kept(const qcow2_state *s)
{
    return s->bm_state && s->bm_state->keep;
}

/* ------------------------------------------------- directory updates */

/* Points the bitmaps header extension at a new directory (flushed). */
static int switch_ext(bi_node *n, uint64_t old_off, uint64_t new_off)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint8_t *h = bi_blockalign(n->file, cs);
    if (!h)
        return -ENOMEM;
    int ret = bi_co_pread(n->file, 0, h, cs);
    if (ret < 0)
        goto out;
    uint64_t end = cs, bo = qc_get64(h + QH_BACKING_OFFSET);
    if (bo && bo < cs)
        end = bo;
    ret = -EIO; /* the extension must be where the state says it is */
    for (uint64_t off = s->header_length; off + 8 <= end;) {
        uint32_t type = qc_get32(h + off), len = qc_get32(h + off + 4);
        if (type == QCOW2_EXT_END || len > end - off - 8)
            break;
        if (type == QCOW2_EXT_BITMAPS) {
            if (len >= 24 && qc_get32(h + off + 8) == s->nb_bitmaps &&
                qc_get64(h + off + 16) == s->bitmap_dir_size &&
                qc_get64(h + off + 24) == old_off) {
                uint8_t v[8];
                qc_put64(v, new_off);
                ret = qc_write_header_field(n, off + 24, v, 8);
            }
            break;
        }
        off += 8 + bi_align_up(len, 8);
    }
out:
    bi_free_aligned(h);
    return ret;
}

/* Writes dir as the new directory (new clusters) and frees the old one. */
static int switch_dir(bi_node *n, const uint8_t *dir)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    uint64_t cs = s->cluster_size;
    uint64_t bytes = bi_align_up(st->dir_size, cs);
    int64_t off = qc_alloc_clusters(n, bytes / cs);
    if (off < 0)
        return (int)off;
    uint8_t *buf = bi_blockalign(n->file, bytes);
    int ret = -ENOMEM;
    if (buf) {
        memset(buf, 0, bytes);
        memcpy(buf, dir, st->dir_size);
        ret = qc_check_overlap(n, 0, (uint64_t)off, bytes);
        if (ret == 0)
            ret = bi_co_pwrite(n->file, (uint64_t)off, buf, bytes, 0);
        bi_free_aligned(buf);
    }
    /* the new clusters' refcounts before the header points at them */
    if (ret == 0)
        ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0)
        ret = switch_ext(n, s->bitmap_dir_offset, (uint64_t)off);
    if (ret < 0) {
        qc_update_refcount(n, (uint64_t)off, bytes, -1);
        return ret;
    }
    uint64_t old = s->bitmap_dir_offset;
    s->bitmap_dir_offset = (uint64_t)off;
    memcpy(st->dir, dir, st->dir_size);
    return qc_update_refcount(n, old, bytes, -1);
}

/* Marks every loaded bitmap in use on disk (before it changes). */
static int begin_in_use(bi_node *n)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    uint8_t *dir = malloc(st->dir_size);
    if (!dir)
        return -ENOMEM;
    memcpy(dir, st->dir, st->dir_size);
    bool any = false;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        if (!b->loaded || b->in_use)
            continue;
        uint8_t *e = dir + b->pos;
        qc_put32(e + 12, qc_get32(e + 12) | BME_FLAG_IN_USE);
        any = true;
    }
    int ret = any ? switch_dir(n, dir) : 0;
    free(dir);
    if (ret < 0) {
        st->failed = true;
        return ret;
    }
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        if (b->loaded && !b->in_use) {
            b->in_use = true;
            if (s->bitmaps)
                s->bitmaps[i].flags |= BME_FLAG_IN_USE;
        }
    }
    return 0;
}

int qc_bitmaps_mark(bi_node *n, uint64_t off, uint64_t len)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    if (!st || !st->tracking || !len)
        return 0;
    if (st->failed)
        return -EIO;
    int ret;
    if (!st->begun) {
        ret = begin_in_use(n);
        if (ret < 0)
            return ret;
        st->begun = true;
    }
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        if (!b->tracking || !b->nbits)
            continue;
        unsigned g = entry_at(st, i)[17];
        uint64_t first = off >> g;
        uint64_t last = BI_MIN((off + len - 1) >> g, b->nbits - 1);
        if (first > last)
            continue;
        ret = set_bits(n, st, b, first, last);
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* ------------------------------------------------------------- resize */

int qc_bitmaps_truncate_begin(bi_node *n, uint64_t size, bi_error *err)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    if (!st || size == n->size)
        return 0;
    if (st->failed)
        return qc_error(err, -EIO,
                        "Bitmaps of this image could not be "
                        "updated");
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        if (!st->bm[i].inconsistent)
            continue;
        int nl;
        const char *name = entry_name(entry_at(st, i), &nl);
        return qc_error(err, -ENOTSUP,
                        "Bitmap '%.*s' is inconsistent and cannot be used\n"
                        "Try block-dirty-bitmap-remove to delete this bitmap "
                        "from disk",
                        nl, name);
    }
    int ret;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        if (!b->loaded) {
            ret = load_bitmap(n, i, err);
            if (ret < 0)
                return ret;
        }
        uint64_t nb = bm_nchunks(s, bm_nbits(size, entry_at(st, i)[17]));
        if (nb > BME_MAX_TABLE_SIZE ||
            nb * s->cluster_size > BME_MAX_PHYS_SIZE) {
            int nl;
            const char *name = entry_name(entry_at(st, i), &nl);
            return qc_error(err, -EINVAL, "Bitmap '%.*s' is too big", nl, name);
        }
        if (bm_reserve(b, nb) < 0)
            return qc_error(err, -ENOMEM, "Could not resize bitmaps: %s",
                            strerror(ENOMEM));
    }
    ret = begin_in_use(n);
    if (ret < 0)
        return qc_error(err, ret, "Can't update bitmap directory: %s",
                        strerror(-ret));
    return 0;
}

void qc_bitmaps_truncate_done(bi_node *n, uint64_t size)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    uint64_t per = s->cluster_size * 8;
    if (!st)
        return;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        struct qc_bm *b = &st->bm[i];
        if (!b->loaded)
            continue;
        /* a partial all-ones last chunk becomes real bits first: only
         * its bits before the old end are ones */
        uint64_t c = b->nchunks ? b->nchunks - 1 : 0;
        if (b->nchunks && b->chunks[c] == BM_ONES && b->nbits < (c + 1) * per) {
            uint8_t *p = new_chunk(n, st, 0xff);
            if (!p) {
                st->failed = true; /* left in use at close */
                continue;
            }
            b->chunks[c] = p;
            clear_tail(s, b, c);
        }
        uint64_t old = b->nchunks;
        b->nbits = bm_nbits(size, entry_at(st, i)[17]);
        b->nchunks = bm_nchunks(s, b->nbits);
        /* shrinking drops the bits past the end; growing adds zeroes */
        if (b->nchunks < old)
            free_chunks(st, b, b->nchunks, s->cluster_size);
        if (b->nchunks)
            clear_tail(s, b, b->nchunks - 1);
    }
}

/* --------------------------------------------------------------- close */

static int write_cluster(bi_node *n, const void *buf, uint64_t *out)
{
    qcow2_state *s = n->opaque;
    int64_t off = qc_alloc_clusters(n, 1);
    if (off < 0)
        return (int)off;
    int ret = qc_check_overlap(n, 0, (uint64_t)off, s->cluster_size);
    if (ret == 0)
        ret = bi_co_pwrite(n->file, (uint64_t)off, buf, s->cluster_size, 0);
    if (ret < 0) {
        qc_update_refcount(n, (uint64_t)off, s->cluster_size, -1);
        return ret;
    }
    *out = (uint64_t)off;
    return 0;
}

static bool all_zero(const uint8_t *p, uint64_t len)
{
    return !p[0] && !memcmp(p, p + 1, len - 1);
}

static void free_table_clusters(bi_node *n, const uint64_t *t, uint64_t cnt,
                                uint64_t toff)
{
    qcow2_state *s = n->opaque;
    for (uint64_t j = 0; t && j < cnt; j++)
        if (t[j] & BME_TE_OFFSET)
            qc_update_refcount(n, t[j] & BME_TE_OFFSET, s->cluster_size, -1);
    if (toff)
        qc_update_refcount(n, toff, bi_align_up(cnt * 8, s->cluster_size), -1);
}

/* Writes bitmap b's chunks and table to new clusters. */
static int store_one(bi_node *n, struct qc_bm *b, uint8_t *ones,
                     uint64_t **table, uint64_t *toff)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t tbytes = bi_align_up(b->nchunks * 8, cs);
    uint64_t *t = bi_blockalign(n->file, tbytes);
    if (!t)
        return -ENOMEM;
    memset(t, 0, tbytes);
    *table = t;
    *toff = 0;
    int ret = 0;
    for (uint64_t c = 0; ret == 0 && c < b->nchunks; c++) {
        uint8_t *p = b->chunks[c];
        if (p == BM_ONES) {
            memset(ones, 0xff, cs);
            uint64_t per = cs * 8, first = c * per;
            if (b->nbits < first + per) {
                uint64_t keep = b->nbits - first;
                if (keep % 8)
                    ones[keep / 8] = (uint8_t)((1u << (keep % 8)) - 1);
                uint64_t from = (keep + 7) / 8;
                memset(ones + from, 0, cs - from);
            }
            p = ones;
        }
        if (!p || all_zero(p, cs))
            continue; /* zeroes: no cluster, as QEMU stores them */
        ret = write_cluster(n, p, &t[c]);
    }
    if (ret == 0 && b->nchunks) {
        int64_t off = qc_alloc_clusters(n, tbytes / cs);
        if (off < 0) {
            ret = (int)off;
        } else {
            *toff = (uint64_t)off;
            for (uint64_t c = 0; c < b->nchunks; c++)
                t[c] = htobe64(t[c]);
            ret = qc_check_overlap(n, 0, (uint64_t)off, tbytes);
            if (ret == 0)
                ret = bi_co_pwrite(n->file, (uint64_t)off, t, tbytes, 0);
            for (uint64_t c = 0; c < b->nchunks; c++)
                t[c] = be64toh(t[c]);
        }
    }
    return ret;
}

int qc_bitmaps_store(bi_node *n)
{
    qcow2_state *s = n->opaque;
    struct qc_bm_state *st = s->bm_state;
    if (!st || st->failed)
        return 0; /* nothing changed, or left in use (inconsistent) */
    bool any = false;
    for (uint32_t i = 0; i < s->nb_bitmaps; i++)
        any |= st->bm[i].in_use;
    if (!any)
        return 0;
    /* the header no longer has consistent bitmaps (amend downgraded it):
     * the bitmaps are gone for every reader, nothing to store */
    if (s->version < 3 || !(s->autoclear & QCOW2_AUTOCLEAR_BITMAPS) ||
        s->corrupt)
        return 0;
    uint64_t cs = s->cluster_size;
    uint32_t nb = s->nb_bitmaps;
    uint64_t **tables = calloc(nb, sizeof(*tables));
    uint64_t *toffs = calloc(nb, sizeof(*toffs));
    uint8_t *ones = bi_blockalign(n->file, cs);
    uint8_t *dir = malloc(st->dir_size);
    uint64_t **old = calloc(nb, sizeof(*old));
    uint64_t *ooffs = calloc(nb, sizeof(*ooffs));
    uint32_t *osizes = calloc(nb, sizeof(*osizes));
    int ret = -ENOMEM;
    if (!tables || !toffs || !ones || !dir || !old || !ooffs || !osizes)
        goto fail;
    ret = 0;
    for (uint32_t i = 0; ret == 0 && i < nb; i++) {
        if (!st->bm[i].in_use)
            continue;
        ooffs[i] = qc_get64(entry_at(st, i));
        osizes[i] = qc_get32(entry_at(st, i) + 8);
        ret = read_table(n, entry_at(st, i), &old[i]);
    }
    for (uint32_t i = 0; ret == 0 && i < nb; i++)
        if (st->bm[i].in_use)
            ret = store_one(n, &st->bm[i], ones, &tables[i], &toffs[i]);
    /* data, tables and their refcounts on disk before the directory */
    if (ret == 0)
        ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret < 0)
        goto fail;
    memcpy(dir, st->dir, st->dir_size);
    for (uint32_t i = 0; i < nb; i++) {
        struct qc_bm *b = &st->bm[i];
        if (!b->in_use)
            continue;
        uint8_t *e = dir + b->pos;
        qc_put64(e, toffs[i]);
        qc_put32(e + 8, (uint32_t)b->nchunks);
        qc_put32(e + 12, qc_get32(e + 12) & ~BME_FLAG_IN_USE);
    }
    ret = switch_dir(n, dir);
    if (ret < 0)
        goto fail;
    /* the old tables and data clusters are no longer referenced */
    for (uint32_t i = 0; i < nb; i++) {
        struct qc_bm *b = &st->bm[i];
        if (!b->in_use)
            continue;
        const uint8_t *e = entry_at(st, i);
        free_table_clusters(n, old[i], osizes[i], ooffs[i]);
        if (s->bitmaps) {
            s->bitmaps[i].table_offset = qc_get64(e);
            s->bitmaps[i].table_size = qc_get32(e + 8);
            s->bitmaps[i].flags = qc_get32(e + 12);
        }
        b->in_use = false;
    }
    ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    goto out;
fail:
    /* the directory still says in use: only the new clusters leak or are
     * given back */
    for (uint32_t i = 0; tables && i < nb; i++)
        if (tables[i])
            free_table_clusters(n, tables[i], st->bm[i].nchunks, toffs[i]);
    st->failed = true;
out:
    for (uint32_t i = 0; i < nb; i++) {
        if (tables)
            bi_free_aligned(tables[i]);
        if (old)
            free(old[i]);
    }
    free(tables);
    free(toffs);
    free(old);
    free(ooffs);
    free(osizes);
    free(dir);
    bi_free_aligned(ones);
    return ret;
}

/* ------------------------------------------- qemu-img bitmap actions */
/*
 * Each action is one crash-safe transaction on disk: the new contents
 * (if any) go to new data and table clusters, the new directory to new
 * clusters, refcounts are flushed, then the header extension is switched
 * to the new directory (one header write, flushed; added or dropped with
 * the autoclear bit when the first bitmap comes or the last one goes),
 * and only then are the old directory, table and data clusters freed. A
 * crash before the switch leaks clusters only. Bitmaps we had marked in
 * use (guest writes in this session) are stored first; the in-memory
 * state is loaded again from disk after each action.
 */

/* The bitmaps extension points at nb bitmaps in a directory of size bytes
 * at off (nb == 0: no extension, autoclear bit cleared). One header write
 * of the header cluster, flushed. */
static int set_ext(bi_node *n, uint32_t nb, uint64_t size, uint64_t off)
{
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint8_t *h = bi_blockalign(n->file, cs);
    if (!h)
        return -ENOMEM;
    int ret = bi_co_pread(n->file, 0, h, cs);
    if (ret < 0)
        goto out;
    uint64_t end = cs, bo = qc_get64(h + QH_BACKING_OFFSET);
    if (bo && bo < cs)
        end = bo;
    uint64_t pos = s->header_length, ext = 0, term = 0;
    bool found_end = false;
    while (pos + 8 <= end) {
        uint32_t type = qc_get32(h + pos), len = qc_get32(h + pos + 4);
        if (type == QCOW2_EXT_END) {
            found_end = true;
            break;
        }
        if (len > end - pos - 8)
            break;
        if (type == QCOW2_EXT_BITMAPS && !ext)
            ext = pos;
        pos += 8 + bi_align_up(len, 8);
    }
    ret = -EIO;
    if (!found_end)
        goto out;
    term = pos;
    uint8_t data[24] = {0};
    qc_put32(data, nb);
    qc_put64(data + 8, size);
    qc_put64(data + 16, off);
    if (ext && qc_get32(h + ext + 4) != 24)
        goto out;
    if (nb && ext) {
        memcpy(h + ext + 8, data, 24);
    } else if (nb) {
        if (term + 32 + 8 > end) {
            ret = -ENOSPC;
            goto out;
        }
        qc_put32(h + term, QCOW2_EXT_BITMAPS);
        qc_put32(h + term + 4, 24);
        memcpy(h + term + 8, data, 24);
        memset(h + term + 32, 0, 8);
    } else if (ext) {
        memmove(h + ext, h + ext + 32, term + 8 - (ext + 32));
        memset(h + term - 24, 0, 32);
    }
    uint64_t ac = s->autoclear;
    if (nb)
        ac |= QCOW2_AUTOCLEAR_BITMAPS;
    else
        ac &= ~(uint64_t)QCOW2_AUTOCLEAR_BITMAPS;
    qc_put64(h + QH_AUTOCLEAR, ac);
    ret = bi_co_pwrite(n->file, 0, h, cs, 0);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0) {
        s->autoclear = ac;
        s->has_bitmaps = nb != 0;
        s->nb_bitmaps = nb;
        s->bitmap_dir_size = nb ? size : 0;
        s->bitmap_dir_offset = nb ? off : 0;
    }
out:
    bi_free_aligned(h);
    return ret;
}

/* The on-disk directory now, one entry per bitmap (NULL if none). */
struct edit_dir {
    uint8_t *dir;
    uint64_t size;
    uint32_t nb;
    uint64_t *pos; /* entry offsets */
};

static void edit_dir_free(struct edit_dir *d)
{
    free(d->dir);
    free(d->pos);
    memset(d, 0, sizeof(*d));
}

static int edit_dir_read(bi_node *n, struct edit_dir *d)
{
    qcow2_state *s = n->opaque;
    memset(d, 0, sizeof(*d));
    if (!s->bm_state && (!s->has_bitmaps || !s->nb_bitmaps ||
                         !(s->autoclear & QCOW2_AUTOCLEAR_BITMAPS)))
        return 0;
    struct qc_bm_state *st = s->bm_state;
    if (!st)
        return -EIO; /* opened read-only or never validated */
    d->size = st->dir_size;
    d->nb = s->nb_bitmaps;
    d->dir = malloc(d->size ? d->size : 1);
    d->pos = calloc(d->nb ? d->nb : 1, sizeof(*d->pos));
    if (!d->dir || !d->pos) {
        edit_dir_free(d);
        return -ENOMEM;
    }
    memcpy(d->dir, st->dir, d->size);
    for (uint32_t i = 0; i < d->nb; i++)
        d->pos[i] = st->bm[i].pos;
    return 0;
}

static uint64_t entry_len(const uint8_t *e)
{
    return bi_align_up(
        BME_ENTRY_HDR + (uint64_t)qc_get16(e + 18) + qc_get32(e + 20), 8);
}

static int find_entry(const struct edit_dir *d, const char *name)
{
    size_t len = strlen(name);
    for (uint32_t i = 0; i < d->nb; i++) {
        int nl;
        const char *p = entry_name(d->dir + d->pos[i], &nl);
        if ((size_t)nl == len && !memcmp(p, name, len))
            return (int)i;
    }
    return -1;
}

/* Loads the bitmap of entry e of node n (clusters validated at open) into
 * a fresh struct (chunks only; freed with drop_loaded). */
static int load_entry(bi_node *n, struct qc_bm_state *mem, const uint8_t *e,
                      struct qc_bm *b)
{
    qcow2_state *s = n->opaque;
    memset(b, 0, sizeof(*b));
    b->nbits = bm_nbits(n->size, e[17]);
    b->nchunks = bm_nchunks(s, b->nbits);
    uint64_t *t = NULL;
    int ret = bm_reserve(b, b->nchunks ? b->nchunks : 1);
    if (ret == 0 && qc_get32(e + 8) != b->nchunks)
        ret = -EINVAL;
    if (ret == 0)
        ret = read_table(n, e, &t);
    if (ret == 0)
        ret = read_chunks(n, mem, b, t);
    free(t);
    b->loaded = ret == 0;
    return ret;
}

static void drop_loaded(qcow2_state *s, struct qc_bm_state *mem,
                        struct qc_bm *b)
{
    if (b->chunks)
        free_chunks(mem, b, 0, s->cluster_size);
    free(b->chunks);
    memset(b, 0, sizeof(*b));
}

static bool bit_set(const qcow2_state *s, const struct qc_bm *b, uint64_t i)
{
    uint64_t per = s->cluster_size * 8;
    const uint8_t *p = b->chunks[i / per];
    if (!p)
        return false;
    if (p == BM_ONES)
        return true;
    uint64_t j = i % per;
    return (p[j / 8] >> (j % 8)) & 1;
}

/* dst |= src (granularities gd, gs; both cover the same guest size). */
static int merge_bits(bi_node *n, struct qc_bm_state *mem, struct qc_bm *dst,
                      unsigned gd, bi_node *sn, const struct qc_bm *src,
                      unsigned gs)
{
    qcow2_state *ss = sn->opaque;
    uint64_t per = ss->cluster_size * 8;
    for (uint64_t c = 0; c < src->nchunks; c++) {
        const uint8_t *p = src->chunks[c];
        if (!p)
            continue;
        uint64_t first = c * per, last = BI_MIN(first + per, src->nbits);
        for (uint64_t i = first; i < last;) {
            if (p != BM_ONES && (i % 8) == 0 && !p[(i - first) / 8]) {
                i += 8;
                continue;
            }
            if (!bit_set(ss, src, i)) {
                i++;
                continue;
            }
            uint64_t j = i + 1; /* run of set bits [i, j) */
            while (j < last && bit_set(ss, src, j))
                j++;
            uint64_t a = i << gs, z = (j << gs) - 1;
            uint64_t da = a >> gd, dz = BI_MIN(z >> gd, dst->nbits - 1);
            if (da <= dz) {
                int ret = set_bits(n, mem, dst, da, dz);
                if (ret < 0)
                    return ret;
            }
            i = j;
        }
    }
    return 0;
}

/* Frees the table and data clusters of an entry (the old copy of a bitmap
 * no longer referenced). An in-use bitmap's table was never validated:
 * only clusters that are aligned, inside the file and not metadata are
 * given back, the rest leaks. */
static void free_entry_clusters(bi_node *n, const uint8_t *e)
{
    qcow2_state *s = n->opaque;
    uint64_t toff = qc_get64(e);
    uint32_t tsize = qc_get32(e + 8);
    uint64_t cs = s->cluster_size;
    uint64_t tbytes = bi_align_up((uint64_t)tsize * 8, cs);
    if (!toff || !tsize || (toff & (cs - 1)) || !in_file(s, toff, tbytes) ||
        tsize > BME_MAX_TABLE_SIZE)
        return;
    uint64_t *t = NULL;
    if (read_table(n, e, &t) < 0)
        return;
    for (uint32_t j = 0; j < tsize; j++) {
        uint64_t off = t[j] & BME_TE_OFFSET;
        if (!off || (t[j] & BME_TE_RESERVED) || (off & (cs - 1)) ||
            !in_file(s, off, cs) || qc_check_overlap(n, 0, off, cs) < 0)
            continue;
        qc_update_refcount(n, off, cs, -1);
    }
    free(t);
    if (qc_check_overlap(n, 0, toff, tbytes) == 0)
        qc_update_refcount(n, toff, tbytes, -1);
}

/* Switches to directory nd (nb entries; the old entry old_e, if any, is
 * freed after the switch) and loads the state again. */
static int commit_dir(bi_node *n, const uint8_t *nd, uint64_t nsize,
                      uint32_t nb, const uint8_t *old_e, bool *switched,
                      bi_error *err)
{
    *switched = false;
    qcow2_state *s = n->opaque;
    uint64_t cs = s->cluster_size;
    uint64_t old_off = s->bitmap_dir_offset, old_size = s->bitmap_dir_size;
    bool had = s->bm_state != NULL;
    uint32_t old_nb = s->nb_bitmaps;
    int64_t off = 0;
    uint64_t bytes = bi_align_up(nsize, cs);
    int ret = 0;
    if (nb) {
        off = qc_alloc_clusters(n, bytes / cs);
        if (off < 0)
            return (int)off;
        uint8_t *buf = bi_blockalign(n->file, bytes);
        ret = -ENOMEM;
        if (buf) {
            memset(buf, 0, bytes);
            memcpy(buf, nd, nsize);
            ret = qc_check_overlap(n, 0, (uint64_t)off, bytes);
            if (ret == 0)
                ret = bi_co_pwrite(n->file, (uint64_t)off, buf, bytes, 0);
            bi_free_aligned(buf);
        }
    }
    if (ret == 0)
        ret = qc_flush_metadata(n);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0)
        ret = set_ext(n, nb, nsize, (uint64_t)off);
    if (ret < 0) {
        if (nb)
            qc_update_refcount(n, (uint64_t)off, bytes, -1);
        return qc_error(err, ret, "Can't update bitmap directory: %s",
                        strerror(-ret));
    }
    /* the switch is done: the old copies are garbage now */
    *switched = true;
    if (old_e)
        free_entry_clusters(n, old_e);
    if (had && old_size)
        qc_update_refcount(n, old_off, bi_align_up(old_size, cs), -1);
    ret = qc_flush_metadata(n);
    s->nb_bitmaps = old_nb; /* what the state in memory was built for */
    qc_bitmaps_free(s);
    qc_free_bitmaps(s);
    s->nb_bitmaps = nb;
    /* the checks of the new directory see the file as it is now */
    int64_t fsz = bi_getlength(n->file);
    if (fsz > 0 && (uint64_t)fsz > s->file_size)
        s->file_size = (uint64_t)fsz;
    if (ret == 0 && nb) {
        ret = qc_bitmaps_open(n, true, err);
        if (ret == 0)
            ret = qc_read_bitmaps(n, err);
    }
    if (ret < 0 && err && !err->msg[0])
        qc_error(err, ret, "Can't update bitmap directory: %s", strerror(-ret));
    return ret;
}

/* Writes the contents b for an entry (new data and table clusters). */
static int write_contents(bi_node *n, struct qc_bm *b, uint64_t **t,
                          uint64_t *toff)
{
    qcow2_state *s = n->opaque;
    uint8_t *ones = bi_blockalign(n->file, s->cluster_size);
    if (!ones)
        return -ENOMEM;
    *t = NULL;
    int ret = store_one(n, b, ones, t, toff);
    bi_free_aligned(ones);
    if (ret < 0 && *t) {
        free_table_clusters(n, *t, b->nchunks, *toff);
        bi_free_aligned(*t);
        *t = NULL;
    }
    return ret;
}

struct bm_act {
    bi_node *n;
    int op;
    const char *name;
    uint64_t granularity;
    bool flag;
    bi_node *src;
    const char *src_name;
    bi_error *err;
};

enum { ACT_ADD, ACT_REMOVE, ACT_CLEAR, ACT_ENABLE, ACT_MERGE };

static const char *inconsistent_msg =
    "Bitmap '%s' is inconsistent and cannot be used\n"
    "Try block-dirty-bitmap-remove to delete this bitmap from disk";

static int do_add(struct bm_act *a, struct edit_dir *d)
{
    bi_node *n = a->n;
    qcow2_state *s = n->opaque;
    bi_error *err = a->err;
    const char *name = a->name;
    uint64_t g = a->granularity;
    if (!name[0])
        return qc_error(err, -EINVAL, "Bitmap name cannot be empty");
    if (g && (g < 512 || (g & (g - 1)) || g > (1ULL << 31)))
        return qc_error(err, -EINVAL,
                        "Granularity must be power of 2 and at least 512");
    if (!g) /* QEMU's default: the cluster size within [4 KiB, 64 KiB] */
        g = BI_MIN(BI_MAX(s->cluster_size, 4096), 65536);
    unsigned gbits = 0;
    while ((1ULL << gbits) < g)
        gbits++;
    const char *pre = "Can't make bitmap '%s' persistent in '%s': %s";
    size_t nl = strlen(name);
    if (s->version < 3)
        return qc_error(err, -ENOTSUP, pre, name, n->filename,
                        "Cannot store dirty bitmaps in qcow2 v2 files");
    if (nl > BME_MAX_NAME_SIZE)
        return qc_error(err, -ENAMETOOLONG, pre, name, n->filename,
                        "Name length exceeds maximum (1023 characters)");
    uint64_t nbits = bm_nbits(n->size, gbits);
    uint64_t nchunks = bm_nchunks(s, nbits);
    if (nchunks > BME_MAX_TABLE_SIZE ||
        nchunks * s->cluster_size > BME_MAX_PHYS_SIZE)
        return qc_error(err, -EINVAL, pre, name, n->filename,
                        "Too much space will be occupied by the bitmap. Use "
                        "larger granularity");
    if (d->nb >= BME_MAX_BITMAPS)
        return qc_error(err, -EINVAL, pre, name, n->filename,
                        "Maximum number of persistent bitmaps is already "
                        "reached");
    uint64_t elen = bi_align_up(BME_ENTRY_HDR + nl, 8);
    if (d->size + elen > BME_MAX_DIR_SIZE)
        return qc_error(err, -EINVAL, pre, name, n->filename,
                        "Not enough space in the bitmap directory");
    if (find_entry(d, name) >= 0)
        return qc_error(err, -EEXIST, "Bitmap already exists: %s", name);
    if (!nchunks)
        return qc_error(err, -EINVAL, pre, name, n->filename,
                        "Image size is zero");

    struct qc_bm_state mem = {0};
    struct qc_bm b = {0};
    b.nbits = nbits;
    b.nchunks = nchunks;
    uint64_t *t = NULL, toff = 0;
    int ret = bm_reserve(&b, nchunks);
    if (ret == 0)
        ret = write_contents(n, &b, &t, &toff);
    drop_loaded(s, &mem, &b);
    if (ret < 0)
        return qc_error(err, ret, "Could not write bitmap '%s': %s", name,
                        strerror(-ret));
    uint8_t *nd = calloc(1, d->size + elen);
    if (!nd) {
        free_table_clusters(n, t, nchunks, toff);
        bi_free_aligned(t);
        return -ENOMEM;
    }
    if (d->size)
        memcpy(nd, d->dir, d->size);
    uint8_t *e = nd + d->size;
    qc_put64(e, toff);
    qc_put32(e + 8, (uint32_t)nchunks);
    qc_put32(e + 12, a->flag ? 0 : BME_FLAG_AUTO);
    e[16] = BME_TYPE_DIRTY;
    e[17] = (uint8_t)gbits;
    e[18] = (uint8_t)(nl >> 8);
    e[19] = (uint8_t)nl;
    memcpy(e + BME_ENTRY_HDR, name, nl);
    bool sw;
    ret = commit_dir(n, nd, d->size + elen, d->nb + 1, NULL, &sw, err);
    if (ret < 0 && !sw)
        free_table_clusters(n, t, nchunks, toff);
    bi_free_aligned(t);
    free(nd);
    return ret;
}

/* Removes entry i from d into a new buffer. */
static uint8_t *without(const struct edit_dir *d, uint32_t i, uint64_t *size)
{
    uint64_t len = entry_len(d->dir + d->pos[i]);
    uint8_t *nd = malloc(d->size - len + 1);
    if (!nd)
        return NULL;
    memcpy(nd, d->dir, d->pos[i]);
    memcpy(nd + d->pos[i], d->dir + d->pos[i] + len, d->size - d->pos[i] - len);
    *size = d->size - len;
    return nd;
}

static int bm_action_locked(struct bm_act *a)
{
    bi_node *n = a->n;
    qcow2_state *s = n->opaque;
    bi_error *err = a->err;
    struct qc_bm_state *st = s->bm_state;
    if (n->read_only)
        return qc_error(err, -EACCES, "Image '%s' is read-only", n->filename);
    if (st && st->failed)
        return qc_error(err, -EIO,
                        "Bitmaps of this image could not be "
                        "updated");
    if (st && st->begun) {
        int ret = qc_bitmaps_store(n);
        if (ret < 0)
            return qc_error(err, ret, "Could not store bitmaps: %s",
                            strerror(-ret));
        st->begun = false;
    }
    int ret = qc_before_write(n);
    if (ret < 0)
        return qc_error(err, ret, "Could not update the image header: %s",
                        strerror(-ret));
    struct edit_dir d;
    ret = edit_dir_read(n, &d);
    if (ret < 0)
        return qc_error(err, ret, "Could not read the bitmap directory: %s",
                        strerror(-ret));
    if (a->op == ACT_ADD) {
        ret = do_add(a, &d);
        edit_dir_free(&d);
        return ret;
    }
    int i = find_entry(&d, a->name);
    if (i < 0) {
        edit_dir_free(&d);
        return qc_error(err, -ENOENT, "Dirty bitmap '%s' not found", a->name);
    }
    uint8_t *e = d.dir + d.pos[i];
    uint32_t flags = qc_get32(e + 12);
    uint8_t *nd = NULL;
    uint64_t nsize = d.size;
    bool sw = false;
    if (a->op == ACT_REMOVE) {
        nd = without(&d, (uint32_t)i, &nsize);
        ret = nd ? commit_dir(n, nd, nsize, d.nb - 1, e, &sw, err) : -ENOMEM;
        goto out;
    }
    if (flags & BME_FLAG_IN_USE) {
        ret = qc_error(err, -EBUSY, inconsistent_msg, a->name);
        goto out;
    }
    nd = malloc(d.size);
    if (!nd) {
        ret = -ENOMEM;
        goto out;
    }
    memcpy(nd, d.dir, d.size);
    uint8_t *ne = nd + d.pos[i];
    if (a->op == ACT_ENABLE) {
        qc_put32(ne + 12,
                 a->flag ? flags | BME_FLAG_AUTO : flags & ~BME_FLAG_AUTO);
        ret = commit_dir(n, nd, nsize, d.nb, NULL, &sw, err);
        goto out;
    }
    /* clear or merge: new contents */
    struct qc_bm_state mem = {0};
    struct qc_bm b = {0}, sb = {0};
    if (a->op == ACT_CLEAR) {
        b.nbits = bm_nbits(n->size, e[17]);
        b.nchunks = bm_nchunks(s, b.nbits);
        ret = bm_reserve(&b, b.nchunks ? b.nchunks : 1);
    } else {
        bi_node *sn = a->src;
        struct edit_dir sd = {0};
        const uint8_t *se = NULL;
        if (sn == n) {
            int j = find_entry(&d, a->src_name);
            se = j >= 0 ? d.dir + d.pos[j] : NULL;
        } else if (sn->drv == &bi_drv_qcow2) {
            ret = edit_dir_read(sn, &sd);
            qcow2_state *ss = sn->opaque;
            if (ret == -EIO && ss->nb_bitmaps && ss->bitmaps) {
                /* opened read-only: read the directory as listed */
                ret = 0;
                sd.nb = 0;
                uint8_t *tmp = malloc(ss->bitmap_dir_size);
                if (tmp && bi_co_pread(sn->file, ss->bitmap_dir_offset, tmp,
                                       ss->bitmap_dir_size) == 0) {
                    sd.dir = tmp;
                    sd.size = ss->bitmap_dir_size;
                    sd.pos = calloc(ss->nb_bitmaps, sizeof(*sd.pos));
                    for (uint64_t p = 0; sd.pos && sd.nb < ss->nb_bitmaps &&
                                         p + BME_ENTRY_HDR <= sd.size;) {
                        sd.pos[sd.nb++] = p;
                        p += entry_len(tmp + p);
                    }
                } else {
                    free(tmp);
                }
            }
            int j = ret == 0 ? find_entry(&sd, a->src_name) : -1;
            se = j >= 0 ? sd.dir + sd.pos[j] : NULL;
        }
        if (!se) {
            ret = qc_error(err, -ENXIO, "Dirty bitmap '%s' not found",
                           a->src_name);
        } else if (qc_get32(se + 12) & BME_FLAG_IN_USE) {
            ret = qc_error(err, -ESTALE, inconsistent_msg, a->src_name);
        } else if (sn->size != n->size) {
            ret = qc_error(err, -EINVAL,
                           "Bitmaps are incompatible and can't be merged");
        } else {
            ret = load_entry(n, &mem, e, &b);
            if (ret == 0)
                ret = load_entry(sn, &mem, se, &sb);
            if (ret == 0)
                ret = merge_bits(n, &mem, &b, e[17], sn, &sb, se[17]);
            if (ret < 0)
                qc_error(err, ret, "Could not merge bitmap '%s': %s",
                         a->src_name, strerror(-ret));
        }
        drop_loaded(sn->opaque, &mem, &sb);
        edit_dir_free(&sd);
    }
    uint64_t *t = NULL, toff = 0;
    if (ret == 0) {
        ret = write_contents(n, &b, &t, &toff);
        if (ret < 0)
            qc_error(err, ret, "Could not write bitmap '%s': %s", a->name,
                     strerror(-ret));
    }
    if (ret == 0) {
        qc_put64(ne, toff);
        qc_put32(ne + 8, (uint32_t)b.nchunks);
        ret = commit_dir(n, nd, nsize, d.nb, e, &sw, err);
        if (ret < 0 && !sw)
            free_table_clusters(n, t, b.nchunks, toff);
    }
    bi_free_aligned(t);
    drop_loaded(s, &mem, &b);
out:
    free(nd);
    edit_dir_free(&d);
    return ret;
}

static int bm_action_co(void *opaque)
{
    struct bm_act *a = opaque;
    qcow2_state *s = a->n->opaque;
    bi_co_mutex_lock(&s->lock);
    int ret = bm_action_locked(a);
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

/* A request of the generic layer as this file's action, under the lock. */
static int qc_bitmap_change(bi_node *n, const struct bi_bitmap_req *r,
                            bi_error *err)
{
    static const int ops[] = {
        [BI_BITMAP_ADD] = ACT_ADD,     [BI_BITMAP_REMOVE] = ACT_REMOVE,
        [BI_BITMAP_CLEAR] = ACT_CLEAR, [BI_BITMAP_ENABLE] = ACT_ENABLE,
        [BI_BITMAP_MERGE] = ACT_MERGE,
    };
    struct bm_act a = {n,       ops[r->op], r->name,     r->granularity,
                       r->flag, r->src,     r->src_name, err};
    /* a source of another format: its bitmaps are not ours to read */
    if (r->op == BI_BITMAP_MERGE && r->src->drv != n->drv)
        return qc_error(err, -ENXIO, "Dirty bitmap '%s' not found",
                        r->src_name);
    return bm_action_co(&a);
}

static bool qc_bitmap_supported(bi_node *node)
{
    return ((qcow2_state *)node->opaque)->version >= 3;
}

/* The directory as the library lists it. */
static int qc_bitmap_list(bi_node *node, struct bi_bitmap_info ***out,
                          int *count)
{
    *out = NULL;
    *count = 0;
    qcow2_state *s = node->opaque;
    if (!s->bitmaps || !s->nb_bitmaps)
        return 0;
    struct bi_bitmap_info **v = bi_xzalloc(s->nb_bitmaps * sizeof(*v));
    for (uint32_t i = 0; i < s->nb_bitmaps; i++) {
        const struct qcow2_bitmap *b = &s->bitmaps[i];
        v[i] = bi_xzalloc(sizeof(*v[i]));
        v[i]->name = bi_xstrdup(b->name);
        v[i]->granularity = 1ULL << b->granularity_bits;
        v[i]->enabled = (b->flags & BME_FLAG_AUTO) != 0;
        v[i]->in_use = (b->flags & BME_FLAG_IN_USE) != 0;
    }
    *out = v;
    *count = (int)s->nb_bitmaps;
    return 0;
}

const struct bi_bitmap_ops qc_bitmap_ops = {
    .supported = qc_bitmap_supported,
    .list = qc_bitmap_list,
    .co_change = qc_bitmap_change,
};
