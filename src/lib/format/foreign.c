/* SPDX-License-Identifier: MIT */
/*
 * Image formats that blkimg recognises but cannot open yet.
 *
 * Each table has the format's name and a probe that answers exactly as
 * the format's driver in QEMU 7.2 does (same bytes looked at, same score),
 * so that `blkimg info`, `convert` and friends name the format qemu-img
 * names and refuse it, instead of taking its container for raw data. The
 * tables have no open: the generic layer refuses to open such an image
 * (and `-f NAME` for it) with one line naming the format; they have no
 * create either, so creating one is refused as QEMU refuses a format it
 * cannot create.
 *
 * Every probe gets BI_PROBE_BYTES (512) bytes, zeroes past the end of the
 * file, as QEMU's probes do; the length checks below are QEMU's and hold
 * for any len.
 */
#include "format/foreign.h"
#include "util/util.h"

#include <string.h>

enum { SCORE_SURE = 100 };

/* ------------------------------------------------------------ qcow (v1) */

/* "QFI\xfb" (big-endian magic) and version 1, in a 48-byte header;
 * versions 2 and 3 are qcow2's. */
static int qcow_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    return len >= 48 && bi_ld_be32(buf) == 0x514649fb &&
                   bi_ld_be32(buf + 4) == 1
               ? SCORE_SURE
               : 0;
}

/* ------------------------------------------------------------------ qed */

/* "QED\0" (little-endian magic) in a 64-byte header. */
static int qed_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    return len >= 64 && bi_ld_le32(buf) == 0x00444551 ? SCORE_SURE : 0;
}

/* ------------------------------------------------------------ parallels */

/* "WithoutFreeSpace" or "WithouFreSpacExt" and version 2 (little-endian
 * at offset 16) in a 64-byte header. */
static int parallels_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    if (len < 64 || bi_ld_le32(buf + 16) != 2)
        return 0;
    return !memcmp(buf, "WithoutFreeSpace", 16) ||
                   !memcmp(buf, "WithouFreSpacExt", 16)
               ? SCORE_SURE
               : 0;
}

/* ------------------------------------------------------------------ dmg */

/* QEMU 7.2 decides dmg by the file name alone: a name longer than four
 * characters ending in ".dmg" scores 2 (above raw's 1); the koly trailer
 * is only looked at when the image is opened. No name (json:,
 * --image-opts): 0. */
static int dmg_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)buf;
    (void)len;
    if (!filename)
        return 0;
    size_t n = strlen(filename);
    return n > 4 && !strcmp(filename + n - 4, ".dmg") ? 2 : 0;
}

/* ---------------------------------------------------------------- bochs */

/* True if the NUL-terminated string s is at buf + off, terminator
 * included (QEMU compares the header's fields with strcmp). */
static bool has_cstring(const uint8_t *buf, size_t len, size_t off,
                        const char *s)
{
    size_t n = strlen(s) + 1;
    return off + n <= len && !memcmp(buf + off, s, n);
}

/* A growing redolog: magic, type and subtype strings at offsets 0, 32 and
 * 48, version 1 or 2 (little-endian at 64), in a 512-byte header. */
static int bochs_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    if (len < 512 || !has_cstring(buf, len, 0, "Bochs Virtual HD Image") ||
        !has_cstring(buf, len, 32, "Redolog") ||
        !has_cstring(buf, len, 48, "Growing"))
        return 0;
    uint32_t version = bi_ld_le32(buf + 64);
    return version == 0x00020000 || version == 0x00010000 ? SCORE_SURE : 0;
}

/* ---------------------------------------------------------------- cloop */

/* The V2.0 shell-script preamble at offset 0 scores 2 (QEMU compares at
 * most len bytes of it). */
static int cloop_probe(const uint8_t *buf, size_t len, const char *filename)
{
    static const char magic[] =
        "#!/bin/sh\n"
        "#V2.0 Format\n"
        "modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n";
    (void)filename;
    size_t n = BI_MIN(strlen(magic), len);
    return !memcmp(buf, magic, n) ? 2 : 0;
}

/* ---------------------------------------------------------------- tables */

const struct bi_driver bi_drv_qcow = {.name = "qcow", .probe = qcow_probe};
const struct bi_driver bi_drv_qed = {.name = "qed", .probe = qed_probe};
const struct bi_driver bi_drv_parallels = {.name = "parallels",
                                           .probe = parallels_probe};
const struct bi_driver bi_drv_dmg = {.name = "dmg", .probe = dmg_probe};
const struct bi_driver bi_drv_bochs = {.name = "bochs", .probe = bochs_probe};
const struct bi_driver bi_drv_cloop = {.name = "cloop", .probe = cloop_probe};
