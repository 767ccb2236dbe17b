/* SPDX-License-Identifier: MIT */
/*
 * Format probing (src/lib/format/probe.c, foreign.c): every format qemu-img
 * 7.2 probes, the text-descriptor heuristic of vmdk, dmg's name rule, the
 * order that breaks ties, and the registry's capabilities. The expected
 * answers were checked against qemu-img 7.2 on the same bytes (see
 * tests/interop/test_probe_formats.py for the cross-checks that run it).
 */
#include "block/block.h"
#include "tap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint8_t buf[BI_PROBE_BYTES];

/* Clears the probe buffer and puts n bytes of s at off. */
static void put(size_t off, const void *s, size_t n)
{
    memset(buf, 0, sizeof(buf));
    memcpy(buf + off, s, n);
}

static void put32le(size_t off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        buf[off + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void put32be(size_t off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        buf[off + (size_t)i] = (uint8_t)(v >> (24 - 8 * i));
}

/* The format probing picks for the current buffer. */
static const char *probe(const char *filename)
{
    return bi_probe_format(buf, sizeof(buf), filename)->name;
}

/* Probes the text t as a whole file (zeroes after it). */
static const char *probe_text(const char *t)
{
    put(0, t, strlen(t));
    return probe(NULL);
}

/* Every probe on a heap buffer of exactly len bytes of s, so that a read
 * past the end is caught by ASan; returns the format picked. */
static const char *probe_short(const void *s, size_t len, const char *name)
{
    uint8_t *p = malloc(len ? len : 1);
    memcpy(p, s, len);
    const char *r = bi_probe_format(p, len, name)->name;
    free(p);
    return r;
}

static void test_magics(void)
{
    put(0, "QFI\xfb\0\0\0\3", 8);
    is_str(probe(NULL), "qcow2", "qcow2 v3");
    put(0, "QFI\xfb\0\0\0\2", 8);
    is_str(probe(NULL), "qcow2", "qcow2 v2");
    put(0, "QFI\xfb\0\0\0\1", 8);
    is_str(probe(NULL), "qcow", "qcow v1");
    put(0, "QFI\xfb\0\0\0\0", 8);
    is_str(probe(NULL), "raw", "qcow magic, version 0: raw");
    put(0, "QED", 4);
    is_str(probe(NULL), "qed", "qed");
    put(0, "KDMV\1\0\0\0", 8);
    is_str(probe(NULL), "vmdk", "vmdk 4 sparse (KDMV)");
    put(0, "COWD", 4);
    is_str(probe(NULL), "vmdk", "vmdk 3 sparse (COWD)");
    put(0, "vhdxfile", 8);
    is_str(probe(NULL), "vhdx", "vhdx");
    put(0, "conectix", 8);
    is_str(probe(NULL), "vpc", "vpc (footer copy at 0)");
    put(0, "<<< QEMU VM Virtual Disk Image >>>\n", 35);
    put32le(64, 0xbeda107f);
    is_str(probe(NULL), "vdi", "vdi");
    put(0, "LUKS\xba\xbe\0\1", 8);
    is_str(probe(NULL), "luks", "luks 1");
    put(0, "LUKS\xba\xbe\0\2", 8);
    is_str(probe(NULL), "raw", "luks 2 is raw to QEMU 7.2");
    put(0, "WithoutFreeSpace\2\0\0\0", 20);
    is_str(probe(NULL), "parallels", "parallels");
    put(0, "WithouFreSpacExt\2\0\0\0", 20);
    is_str(probe(NULL), "parallels", "parallels (ext)");
    put(0, "WithoutFreeSpace\1\0\0\0", 20);
    is_str(probe(NULL), "raw", "parallels version 1: raw");
}

static void test_bochs_cloop(void)
{
    put(0, "Bochs Virtual HD Image", 22);
    memcpy(buf + 32, "Redolog", 7);
    memcpy(buf + 48, "Growing", 7);
    put32le(64, 0x00020000);
    is_str(probe(NULL), "bochs", "bochs v2");
    put32le(64, 0x00010000);
    is_str(probe(NULL), "bochs", "bochs v1");
    put32le(64, 0x00030000);
    is_str(probe(NULL), "raw", "bochs, unknown version");
    put32le(64, 0x00020000);
    buf[22] = 'X'; /* the magic must be a whole C string */
    is_str(probe(NULL), "raw", "bochs magic not terminated");

    static const char cloop[] =
        "#!/bin/sh\n#V2.0 Format\n"
        "modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n";
    put(0, cloop, strlen(cloop));
    is_str(probe(NULL), "cloop", "cloop");
    is_str(probe("x.dmg"), "dmg", "cloop bytes named .dmg: dmg (tie)");
    buf[30] ^= 1;
    is_str(probe(NULL), "raw", "cloop preamble altered");
}

static void test_dmg_name(void)
{
    memset(buf, 0, sizeof(buf));
    is_str(probe("disk.dmg"), "dmg", "a .dmg name is dmg");
    is_str(probe("a.dmg"), "dmg", "shortest .dmg name");
    is_str(probe(".dmg"), "raw", "\".dmg\" alone is not");
    is_str(probe("disk.DMG"), "raw", "the suffix is case-sensitive");
    is_str(probe(NULL), "raw", "no name (json:, --image-opts): raw");
    put(0, "QFI\xfb\0\0\0\3", 8);
    is_str(probe("disk.dmg"), "qcow2", "a magic beats the name");
}

static void test_vmdk_text(void)
{
    is_str(probe_text("version=1\n"), "vmdk", "version=1");
    is_str(probe_text("version=3\r\n"), "vmdk", "CR LF");
    is_str(probe_text("# Disk DescriptorFile\nversion=1\nCID=1\n"), "vmdk",
           "comment first");
    is_str(probe_text("   \n  \r\nversion=2\n"), "vmdk", "blank lines");
    is_str(probe_text("\nversion=1\n"), "raw", "a bare LF is not blank");
    is_str(probe_text("version=4\n"), "raw", "version 4");
    is_str(probe_text("version=1"), "raw", "no line end (zeroes follow)");
    is_str(probe_text("# only a comment\n"), "raw", "comments only");
    is_str(probe_text("   x\nversion=1\n"), "raw", "spaces then text");
    is_str(probe_text("createType=\"monolithicFlat\"\nversion=1\n"), "raw",
           "another line before version");

    /* QEMU looks at 512 bytes: a version line inside them counts, one
     * that crosses or follows them does not */
    char t[600];
    memset(t, 'x', sizeof(t));
    t[0] = '#';
    t[501] = '\n';
    memcpy(t + 502, "version=1\n", 10);
    put(0, t, 512);
    is_str(probe(NULL), "vmdk", "version line ends at byte 512");
    t[501] = 'x';
    t[502] = '\n';
    memcpy(t + 503, "version=1\n", 10);
    put(0, t, 512);
    is_str(probe(NULL), "raw", "version line crosses byte 512");
    memset(t, '#', 511);
    t[511] = '\n';
    put(0, t, 512);
    is_str(probe(NULL), "raw", "comment up to byte 512");
    memset(t, ' ', 512);
    put(0, t, 512);
    is_str(probe(NULL), "raw", "spaces up to byte 512");
}

/* QEMU lists qed and parallels before vdi, and vdi before the others:
 * its signature at offset 64 can sit in their headers. */
static void test_ties(void)
{
    static const struct {
        const char *head;
        size_t n;
        const char *want;
    } cases[] = {
        {"QFI\xfb\0\0\0\3", 8, "vdi"},
        {"QFI\xfb\0\0\0\1", 8, "vdi"},
        {"KDMV", 4, "vdi"},
        {"version=1\n", 10, "vdi"},
        {"vhdxfile", 8, "vdi"},
        {"conectix", 8, "vdi"},
        {"LUKS\xba\xbe\0\1", 8, "vdi"},
        {"QED", 4, "qed"},
        {"WithoutFreeSpace\2", 17, "parallels"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        put(0, cases[i].head, cases[i].n);
        put32le(64, 0xbeda107f);
        is_str(probe(NULL), cases[i].want, "tie %zu: %s", i, cases[i].want);
    }
    put(0, "", 0);
    put32be(64, 0xbeda107f);
    is_str(probe(NULL), "raw", "vdi signature byte-swapped");
}

static void test_short_buffers(void)
{
    is_str(probe_short("K", 1, "x.dmg"), "dmg", "1 byte, .dmg name");
    is_str(probe_short("KDMV", 4, NULL), "vmdk", "4 bytes KDMV");
    is_str(probe_short("conecti", 7, NULL), "raw", "7 bytes of conectix");
    is_str(probe_short("version=1\n", 10, NULL), "vmdk", "10-byte text");
    is_str(probe_short("version=1\r", 10, NULL), "raw", "CR at the end");
    is_str(probe_short("# c", 3, NULL), "raw", "unterminated comment");
    is_str(probe_short("   ", 3, NULL), "raw", "spaces to the end");
    is_str(probe_short("#!/bin/sh\n", 10, NULL), "cloop",
           "cloop compares what there is");
    is_str(probe_short("QFI\xfb\0\0\0\1", 8, NULL), "raw",
           "qcow needs its 48-byte header");
    is_str(probe_short("Bochs Virtual HD Image", 23, NULL), "raw",
           "bochs needs 512 bytes");
}

static void test_registry(void)
{
    int open_create = BI_FORMAT_OPEN | BI_FORMAT_CREATE;
    is_int(bi_format_caps("qcow2") & open_create, open_create,
           "qcow2 opens and creates");
    is_int(bi_format_caps("raw") & open_create, open_create,
           "raw opens and creates");
    is_int(bi_format_caps("vmdk") & BI_FORMAT_OPEN, BI_FORMAT_OPEN,
           "vmdk opens");
    is_int(bi_format_caps("cloop"), 0, "cloop is only recognised");
    is_int(bi_format_caps("nosuch"), -ENOENT, "unknown name");
    is_int(bi_format_exists("cloop"), 0, "cloop exists");
    ok(bi_format_exists("file") < 0, "file is a protocol, not a format");
    const char *names[32];
    size_t n = bi_format_names(BI_FORMAT_OPEN, names, 32);
    ok(n >= 4 && n <= 32, "the drivers that open (%zu)", n);
    bool sorted = true, file = false, nbd = false, qcow2 = false, raw = false;
    for (size_t i = 0; i < n && i < 32; i++) {
        if (i && strcmp(names[i - 1], names[i]) >= 0)
            sorted = false;
        file |= !strcmp(names[i], "file");
        nbd |= !strcmp(names[i], "nbd");
        qcow2 |= !strcmp(names[i], "qcow2");
        raw |= !strcmp(names[i], "raw");
    }
    ok(sorted, "sorted by name");
    ok(file && nbd && qcow2 && raw, "file, nbd, qcow2 and raw among them");
    n = bi_format_names(0, names, 2);
    ok(n >= 14, "all drivers counted even past max (%zu)", n);
}

int main(void)
{
    test_magics();
    test_bochs_cloop();
    test_dmg_name();
    test_vmdk_text();
    test_ties();
    test_short_buffers();
    test_registry();
    return tap_done();
}
