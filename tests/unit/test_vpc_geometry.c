/* SPDX-License-Identifier: MIT */
/*
 * vpc size arithmetic against qemu-img 7.2: the CHS geometry and sector
 * count of a new image (each row read from the footer of `qemu-img create
 * -f vpc x SIZE`), force_size, the 2040 GiB limit and the footer checksum.
 */
#include "format/vpc/vpc.h"
#include "tap.h"

#include <errno.h>
#include <string.h>

struct geo_case {
    uint64_t size;
    uint16_t cyls;
    uint8_t heads, spt;
    uint64_t sectors;
};

static const struct geo_case cases[] = {
    {0ULL, 0, 0, 0, 0ULL},
    {512ULL, 1, 4, 17, 68ULL},
    {1048576ULL, 31, 4, 17, 2108ULL},
    {10485760ULL, 302, 4, 17, 20536ULL},
    {104857600ULL, 1004, 12, 17, 204816ULL},
    {1073741824ULL, 2081, 16, 63, 2097648ULL},
    {33285996544ULL, 64496, 16, 63, 65011968ULL},
    {136365211648ULL, 65279, 16, 255, 266338320ULL},
    {137438953472ULL, 65535, 16, 255, 268435456ULL},
    {214748364800ULL, 65535, 16, 255, 419430400ULL},
    {2190433320960ULL, 65535, 16, 255, 4278190080ULL},
};

static void test_rounding(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct geo_case *c = &cases[i];
        uint16_t cyls;
        uint8_t heads, spt;
        uint64_t sectors;
        int ret =
            vpc_rounded_size(c->size, false, &cyls, &heads, &spt, &sectors);
        is_int(ret, 0, "size %llu accepted", (unsigned long long)c->size);
        ok(cyls == c->cyls && heads == c->heads && spt == c->spt,
           "size %llu: CHS %u/%u/%u", (unsigned long long)c->size, cyls, heads,
           spt);
        is_uint(sectors, c->sectors, "size %llu: sectors",
                (unsigned long long)c->size);
    }
}

static void test_force_size_and_limit(void)
{
    uint16_t cyls;
    uint8_t heads, spt;
    uint64_t sectors;
    is_int(vpc_rounded_size(10000384, true, &cyls, &heads, &spt, &sectors), 0,
           "force_size");
    is_uint(sectors, 19532, "force_size keeps the size");
    ok(cyls == 65535 && heads == 16 && spt == 255, "maximum geometry");
    is_int(vpc_rounded_size(2041ULL << 30, true, &cyls, &heads, &spt, &sectors),
           -EFBIG, "beyond 2040 GiB (force_size)");
    is_int(
        vpc_rounded_size(3000ULL << 30, false, &cyls, &heads, &spt, &sectors),
        -EFBIG, "beyond 2040 GiB");
}

static void test_checksum(void)
{
    uint8_t f[VHD_FOOTER_SIZE];
    memset(f, 0, sizeof(f));
    memcpy(f, "conectix", 8);
    f[VF_CHECKSUM] = 0xff; /* not counted */
    uint32_t sum = 0;
    for (int i = 0; i < 8; i++)
        sum += (uint8_t) "conectix"[i];
    is_uint(vpc_checksum(f, sizeof(f), VF_CHECKSUM), ~sum, "checksum");
}

int main(void)
{
    test_rounding();
    test_force_size_and_limit();
    test_checksum();
    return tap_done();
}
