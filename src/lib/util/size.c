/* SPDX-License-Identifier: MIT */
/*
 * Sizes as qemu-img reads and prints them.
 *
 * Parsing follows qemu 7.2's qemu_strtosz() rules (observed with qemu-img
 * create): a decimal integer (or 0x hex) with optional leading blanks and
 * '+', an optional decimal fraction (decimal numbers only, no exponent), an
 * optional suffix B, K, M, G, T, P, E (either case, powers of 1024). A
 * fraction needs a suffix other than B. The value is computed exactly in
 * 64.64 fixed point and rounded half up. Any '-' is rejected. Overflow of
 * 64 bits is -ERANGE, anything else malformed is -EINVAL, and trailing
 * characters turn even an overflow into -EINVAL.
 */
#include "blkimg/blkimg.h"
#include "util/util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t suffix_mul(unsigned char c)
{
    switch (c) {
    case 'B':
    case 'b':
        return 1;
    case 'K':
    case 'k':
        return 1ULL << 10;
    case 'M':
    case 'm':
        return 1ULL << 20;
    case 'G':
    case 'g':
        return 1ULL << 30;
    case 'T':
    case 't':
        return 1ULL << 40;
    case 'P':
    case 'p':
        return 1ULL << 50;
    case 'E':
    case 'e':
        return 1ULL << 60;
    }
    return 0;
}

/* A fraction in [0, 1] as a 64-bit binary fixed-point value. A fraction
 * that rounds to 1.0 as a double contributes nothing, as in qemu 7.2 on
 * x86-64 (where 2^64 converts to 0): "1.99999999999999999k" is 1024. */
static uint64_t fraction_to_fixed(double f)
{
    double scaled = f * 0x1p64;

    if (scaled >= 0x1p64) {
        return 0;
    }
    return (uint64_t)scaled;
}

int bi_parse_size_full(const char *s, uint64_t *out, bool *hex_suffix)
{
    const char *end;
    char *ep;
    unsigned long long val;
    uint64_t valf = 0, mul, result = 0;
    bool hex = false;
    int ret;

    if (hex_suffix) {
        *hex_suffix = false;
    }
    if (!s) {
        return -EINVAL;
    }

    errno = 0;
    val = strtoull(s, &ep, 10);
    end = ep;
    if (end == s) {
        ret = -EINVAL; /* no digits at all */
        goto out;
    }
    if (errno == ERANGE) {
        ret = -ERANGE;
        goto out;
    }
    if (memchr(s, '-', end - s)) {
        return -EINVAL; /* negative numbers are not sizes */
    }
    if (val == 0 && (*end == 'x' || *end == 'X')) {
        /* Looks like hex: parse again as such; no fraction allowed. */
        errno = 0;
        val = strtoull(s, &ep, 16);
        end = ep;
        if (errno == ERANGE) {
            ret = -ERANGE;
            goto out;
        }
        if (*end == '.') {
            return -EINVAL;
        }
        hex = true;
    } else if (*end == '.') {
        const char *f = end;
        double fraction;

        errno = 0;
        fraction = strtod(f, &ep);
        if (ep == f || errno != 0 || !isfinite(fraction)) {
            /* No fraction digits ("1.k"), or a fraction too small to be
             * represented: skip one character after what was parsed. */
            end = (ep == f || !isfinite(fraction)) ? f : ep;
            if (*end == '\0') {
                return -EINVAL;
            }
            end++;
        } else if (memchr(f, 'e', ep - f) || memchr(f, 'E', ep - f)) {
            return -EINVAL; /* no exponents */
        } else {
            end = ep;
            valf = fraction_to_fixed(fraction);
        }
    }

    mul = suffix_mul((unsigned char)*end);
    if (mul) {
        if (hex && hex_suffix) {
            *hex_suffix = true;
        }
        end++;
    } else {
        mul = 1;
    }
    if (mul == 1) {
        if (valf != 0) {
            return -EINVAL; /* a fraction needs a multiplier */
        }
        result = val;
    } else {
        /* Exact 64.64 x 64.0 product, rounded half up. */
        unsigned __int128 whole = (unsigned __int128)val * mul;
        unsigned __int128 frac = (unsigned __int128)valf * mul;
        unsigned __int128 sum = whole + (frac >> 64) + ((uint64_t)frac >> 63);

        if (sum >> 64) {
            ret = -ERANGE;
            goto out;
        }
        result = (uint64_t)sum;
    }
    ret = 0;

out:
    if (*end != '\0') {
        ret = -EINVAL;
    }
    if (ret == 0) {
        *out = result;
    }
    return ret;
}

int bi_parse_size(const char *s, uint64_t *out)
{
    return bi_parse_size_full(s, out, NULL);
}

void bi_format_size(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
    int e;

    /* Pick the unit so that the printed number stays below 1000: the
     * binary exponent of v * 1024 / 1000, in steps of 10 bits. */
    frexp((double)v / (1000.0 / 1024.0), &e);
    e = (e - 1) / 10;
    if (e < 0) {
        e = 0;
    }
    snprintf(buf, len, "%0.3g %sB", (double)v / (double)(1ULL << (e * 10)),
             units[e]);
}
