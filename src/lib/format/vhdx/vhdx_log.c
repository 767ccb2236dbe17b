/* SPDX-License-Identifier: MIT */
/*
 * vhdx log replay (MS-VHDX "Log"): the log is a circular buffer of 4 KiB
 * sectors holding entries; each entry is a header sector with
 * descriptors (more descriptor sectors if needed) and one data sector per
 * data descriptor. The active sequence is the run of valid entries with
 * consecutive sequence numbers that ends highest; replaying writes every
 * descriptor's sector (or zeroes) to its file offset, grows the file to
 * the entry's last file offset, flushes, and only then marks the log
 * empty (log GUID zero) in the headers, so a crash during replay leaves a
 * log that is replayed again, with the same result.
 *
 * blkimg refuses, where QEMU would write them, entries whose writes reach
 * the header section or the log itself, or lie past the file's end and
 * the entry's last file offset.
 */
#include "format/vhdx/vhdx.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define LS VHDX_LOG_SECTOR

/* The log in memory, and what is known about it. */
struct log_view {
    const uint8_t *buf; /* log_length bytes */
    uint32_t nsect;     /* sectors in the log */
    const uint8_t *guid;
};

/* An entry found valid: where it starts, how many sectors, its header. */
struct log_entry {
    uint32_t start, sectors;
    uint64_t seq;
};

static const uint8_t *sect(const struct log_view *l, uint64_t i)
{
    return l->buf + (size_t)(i % l->nsect) * LS;
}

/* The sectors the descriptors of an entry with count of them take. */
static uint32_t desc_sectors(uint32_t count)
{
    return (uint32_t)(((uint64_t)count + 2 + 127) / 128);
}

/* Descriptor k of the entry starting at sector start (32 bytes). */
static const uint8_t *desc_at(const struct log_view *l, uint32_t start,
                              uint32_t k)
{
    uint64_t byte = 64 + (uint64_t)k * 32;
    return sect(l, start + byte / LS) + byte % LS;
}

/* Checks the CRC-32C over the entry's sectors (checksum field zero). */
static bool entry_crc_ok(const struct log_view *l, uint32_t start,
                         uint32_t sectors)
{
    static const uint8_t zero[4];
    const uint8_t *h = sect(l, start);
    uint32_t c = vhdx_crc32c(0, h, 4);
    c = vhdx_crc32c(c, zero, 4);
    c = vhdx_crc32c(c, h + 8, LS - 8);
    for (uint32_t i = 1; i < sectors; i++)
        c = vhdx_crc32c(c, sect(l, start + i), LS);
    return c == bi_ld_le32(h + 4);
}

/* Checks the descriptors and data sectors of the entry at start: each
 * "desc" or "zero" with the entry's sequence number and 4 KiB-aligned
 * offsets, one "data" sector per data descriptor, same number. */
static bool descs_ok(const struct log_view *l, uint32_t start, uint32_t count,
                     uint32_t sectors, uint64_t seq)
{
    uint32_t data = desc_sectors(count);
    for (uint32_t k = 0; k < count; k++) {
        const uint8_t *d = desc_at(l, start, k);
        if (vhdx_ld64(d + 24) != seq || vhdx_ld64(d + 16) % LS)
            return false;
        if (!memcmp(d, "zero", 4)) {
            if (vhdx_ld64(d + 8) % LS)
                return false;
        } else if (!memcmp(d, "desc", 4)) {
            if (data >= sectors)
                return false;
            const uint8_t *ds = sect(l, start + data++);
            uint64_t dseq =
                ((uint64_t)bi_ld_le32(ds + 4) << 32) | bi_ld_le32(ds + LS - 4);
            if (memcmp(ds, "data", 4) || dseq != seq)
                return false;
        } else {
            return false;
        }
    }
    return true;
}

/* Whether a valid entry starts at sector start; fills *e. */
static bool entry_at(const struct log_view *l, uint32_t start,
                     struct log_entry *e)
{
    const uint8_t *h = sect(l, start);
    uint32_t len = bi_ld_le32(h + 8), count = bi_ld_le32(h + 24);
    uint64_t seq = vhdx_ld64(h + 16);
    if (memcmp(h, "loge", 4) || len == 0 || len % LS || len / LS > l->nsect ||
        seq == 0 || memcmp(h + 32, l->guid, 16) ||
        (uint64_t)desc_sectors(count) > len / LS)
        return false;
    e->start = start;
    e->sectors = len / LS;
    e->seq = seq;
    return entry_crc_ok(l, start, e->sectors) &&
           descs_ok(l, start, count, e->sectors, seq);
}

/* Finds the active sequence: scanning from sector 0, each valid entry
 * starts a chain followed while the next entry is valid with the next
 * sequence number; the chain whose last number is highest wins (QEMU's
 * search). Sets *first and *count (0: none). */
static void search(const struct log_view *l, uint32_t *first, uint32_t *count)
{
    uint64_t best = 0;
    *count = 0;
    uint64_t pos = 0;
    while (pos < l->nsect) {
        struct log_entry e;
        if (!entry_at(l, (uint32_t)pos, &e)) {
            pos++;
            continue;
        }
        uint32_t n = 1, start = e.start;
        uint64_t last = e.seq, next = pos + e.sectors;
        struct log_entry f;
        while (n < l->nsect && entry_at(l, (uint32_t)(next % l->nsect), &f) &&
               f.seq == last + 1) {
            n++;
            last = f.seq;
            next += f.sectors;
        }
        if (last > best) {
            best = last;
            *first = start;
            *count = n;
        }
        pos = next;
    }
}

/* Refuses writes into the header section or the log, or past both the
 * file's end and the entry's last file offset. */
static int target_ok(const vhdx_state *s, uint64_t off, uint64_t len,
                     uint64_t limit)
{
    uint64_t lo = s->log_offset, le = lo + s->log_length;
    if (off < VHDX_HEADER_SECTION_END || len > limit || off > limit - len ||
        (off < le && lo < off + len))
        return -EINVAL;
    return 0;
}

/* Writes the descriptors of the entry at start to their places. */
static int replay_entry(bi_node *n, const struct log_view *l, uint32_t start,
                        uint8_t *buf)
{
    vhdx_state *s = n->opaque;
    const uint8_t *h = sect(l, start);
    uint32_t count = bi_ld_le32(h + 24);
    uint64_t flen = (uint64_t)bi_getlength(n->file);
    uint64_t ffo = vhdx_ld64(h + 48), lfo = vhdx_ld64(h + 56);
    if (ffo > flen || lfo > VHDX_MAX_SIZE * 2)
        return -EINVAL; /* QEMU: the file was truncated */
    uint64_t limit = BI_MAX(flen, bi_align_up(lfo, VHDX_MIB));
    uint32_t data = desc_sectors(count);
    for (uint32_t k = 0; k < count; k++) {
        const uint8_t *d = desc_at(l, start, k);
        uint64_t off = vhdx_ld64(d + 16);
        bool zero = !memcmp(d, "zero", 4);
        uint64_t len = zero ? vhdx_ld64(d + 8) : LS;
        int ret = target_ok(s, off, len, limit);
        if (ret < 0)
            return ret;
        if (zero) {
            ret = len ? bi_co_pwrite_zeroes(n->file, off, len, 0) : 0;
        } else {
            const uint8_t *ds = sect(l, start + data++);
            memcpy(buf, d + 8, 8);
            memcpy(buf + 8, ds + 8, LS - 12);
            memcpy(buf + LS - 4, d + 4, 4);
            ret = bi_co_pwrite(n->file, off, buf, LS, 0);
        }
        if (ret < 0)
            return ret;
    }
    if (bi_getlength(n->file) < (int64_t)lfo && n->file->drv->co_truncate) {
        bi_error e;
        bi_error_init(&e);
        return n->file->drv->co_truncate(n->file, bi_align_up(lfo, VHDX_MIB),
                                         false, BI_PREALLOC_OFF, &e);
    }
    return 0;
}

/* Replays count entries from sector first, flushes, empties the log. */
static int replay(bi_node *n, const struct log_view *l, uint32_t first,
                  uint32_t count)
{
    vhdx_state *s = n->opaque;
    uint8_t *buf = bi_blockalign(n->file, LS);
    if (!buf)
        return -ENOMEM;
    int ret = 0;
    uint64_t pos = first;
    for (uint32_t i = 0; i < count && ret == 0; i++) {
        ret = replay_entry(n, l, (uint32_t)(pos % l->nsect), buf);
        pos += bi_ld_le32(sect(l, pos) + 8) / LS;
    }
    bi_free_aligned(buf);
    if (ret == 0)
        ret = bi_co_flush(n->file);
    if (ret == 0) {
        static const vhdx_guid zero;
        bi_co_mutex_lock(&s->lock);
        ret = vhdx_co_update_headers(n, true, &zero);
        bi_co_mutex_unlock(&s->lock);
        s->data_guid_changed = ret == 0;
    }
    return ret;
}

int vhdx_co_replay_log(bi_node *n, bool *replayed, bi_error *err)
{
    vhdx_state *s = n->opaque;
    const uint8_t *h = s->hdr[s->cur];
    *replayed = false;
    if (vhdx_guid_is_zero(h + VHH_LOG_GUID) || s->log_length == 0)
        return 0;
    uint8_t *buf = bi_blockalign(n->file, s->log_length);
    if (!buf)
        return -ENOMEM;
    int ret = bi_co_pread(n->file, s->log_offset, buf, s->log_length);
    struct log_view l = {buf, s->log_length / LS, h + VHH_LOG_GUID};
    uint32_t first = 0, count = 0;
    if (ret == 0)
        search(&l, &first, &count);
    if (ret == 0 && count && n->read_only) {
        /* QEMU's message and the hint qemu-img prints after it */
        ret = bi_error_setc(err, -EPERM,
                            "VHDX image file '%s' opened read-only, but "
                            "contains a log that needs to be replayed\nTo "
                            "replay the log, run:\nqemu-img check -r all '%s'",
                            n->file->filename, n->file->filename);
    } else if (ret == 0 && count) {
        ret = replay(n, &l, first, count);
        *replayed = ret == 0;
    }
    bi_free_aligned(buf);
    if (ret < 0 && err && !err->msg[0]) {
        bi_error_setc(err, ret, "Could not open '%s': %s",
                      n->filename ? n->filename : "", strerror(-ret));
    }
    return ret;
}
