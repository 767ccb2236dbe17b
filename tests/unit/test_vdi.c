/* SPDX-License-Identifier: MIT */
/*
 * vdi header parsing (src/lib/format/vdi/vdi.c): a header as qemu-img 7.2
 * creates it parses; each field QEMU checks is refused in its words and in
 * its order; what QEMU accepts (odd disk sizes, unknown image types) is
 * accepted. The messages were taken from qemu-img on the same headers
 * (tests/interop/test_vdi.py compares them again on real files).
 */
#include "format/vdi/vdi.h"
#include "tap.h"

#include <errno.h>
#include <string.h>

static uint8_t hdr[VDI_HEADER_SIZE];

static void put32(size_t off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        hdr[off + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void put64(size_t off, uint64_t v)
{
    put32(off, (uint32_t)v);
    put32(off + 4, (uint32_t)(v >> 32));
}

/* qemu-img create -f vdi x 8M */
static void good(void)
{
    memset(hdr, 0, sizeof(hdr));
    put32(VH_SIGNATURE, VDI_SIGNATURE);
    put32(VH_VERSION, VDI_VERSION_1_1);
    put32(VH_HEADER_SIZE, 0x180);
    put32(VH_IMAGE_TYPE, VDI_TYPE_DYNAMIC);
    put32(VH_OFFSET_BMAP, 0x200);
    put32(VH_OFFSET_DATA, 0x400);
    put32(VH_SECTOR_SIZE, 512);
    put64(VH_DISK_SIZE, 8u << 20);
    put32(VH_BLOCK_SIZE, 1u << 20);
    put32(VH_BLOCKS, 8);
}

/* Parses hdr; checks the result and the message. */
static void expect(int want, const char *msg, const char *what)
{
    struct vdi_header h;
    bi_error err;
    bi_error_init(&err);
    int ret = vdi_parse_header(hdr, &h, &err);
    is_int(ret, want, "%s: return", what);
    is_str(err.msg, msg, "%s: message", what);
    if (want < 0)
        is_int(err.code, want, "%s: code", what);
}

static void test_refused(void)
{
    static const struct {
        size_t off;
        int width;
        uint64_t v;
        int ret;
        const char *msg;
    } cases[] = {
        {VH_SIGNATURE, 4, 0x12345678, -EINVAL,
         "Image not in VDI format (bad signature 12345678)"},
        {VH_VERSION, 4, 0x00010002, -ENOTSUP,
         "unsupported VDI image (version 1.2)"},
        {VH_OFFSET_BMAP, 4, 0x201, -ENOTSUP,
         "unsupported VDI image (unaligned block map offset 0x201)"},
        {VH_OFFSET_DATA, 4, 0x201, -ENOTSUP,
         "unsupported VDI image (unaligned data offset 0x201)"},
        {VH_SECTOR_SIZE, 4, 4096, -ENOTSUP,
         "unsupported VDI image (sector size 4096 is not 512)"},
        {VH_BLOCK_SIZE, 4, 4096, -ENOTSUP,
         "unsupported VDI image (block size 4096 is not 1048576)"},
        {VH_BLOCKS, 4, 7, -ENOTSUP,
         "unsupported VDI image (disk size 8388608, image bitmap has room "
         "for 7340032)"},
        {VH_DISK_SIZE, 8, 0xfffffffffffff000ull, -ENOTSUP,
         "Unsupported VDI image size (size is 0xfffffffffffff000, max "
         "supported is 0x1fffff8000000)"},
        {VH_UUID_LINK, 4, 1, -ENOTSUP,
         "unsupported VDI image (non-NULL link UUID)"},
        {VH_UUID_PARENT + 12, 4, 1, -ENOTSUP,
         "unsupported VDI image (non-NULL parent UUID)"},
        {VH_BLOCKS, 4, 0x40000000, -ENOTSUP,
         "unsupported VDI image (too many blocks 1073741824, max is "
         "536870784)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        good();
        if (cases[i].width == 8)
            put64(cases[i].off, cases[i].v);
        else
            put32(cases[i].off, (uint32_t)cases[i].v);
        expect(cases[i].ret, cases[i].msg, cases[i].msg);
    }
    /* QEMU's order: the size first, the signature before the rest */
    good();
    put64(VH_DISK_SIZE, 1ull << 60);
    put32(VH_SIGNATURE, 0);
    expect(-ENOTSUP,
           "Unsupported VDI image size (size is 0x1000000000000000, max "
           "supported is 0x1fffff8000000)",
           "size before signature");
    good();
    put32(VH_SIGNATURE, 0);
    put32(VH_VERSION, 0);
    expect(-EINVAL, "Image not in VDI format (bad signature 00000000)",
           "signature before version");
}

static void test_accepted(void)
{
    struct vdi_header h;
    good();
    expect(0, "", "qemu-img's header");
    good();
    put64(VH_DISK_SIZE, (8u << 20) - 100);
    put32(VH_IMAGE_TYPE, 3);
    put32(VH_HEADER_SIZE, 0);
    expect(0, "", "odd size, unknown type");
    vdi_parse_header(hdr, &h, NULL);
    is_uint(vdi_guest_size(&h), 8u << 20, "odd size rounded up to a sector");
    good();
    put32(VH_BLOCKS, VDI_BLOCKS_MAX);
    put64(VH_DISK_SIZE, VDI_DISK_SIZE_MAX);
    expect(0, "", "the largest image");
}

int main(void)
{
    test_refused();
    test_accepted();
    return tap_done();
}
