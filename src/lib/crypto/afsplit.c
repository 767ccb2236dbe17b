/* SPDX-License-Identifier: MIT */
/*
 * LUKS1's anti-forensic information splitter (the LUKS1 on-disk format
 * specification, "AF-Splitter"): a key of blocklen bytes becomes stripes
 * blocks, all of which are needed to recover it.
 */
#include "crypto/crypto.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The diffusion function H: the block hashed in digest-sized pieces,
 * each prefixed by its big-endian 32-bit index (the last piece cut). */
static int diffuse(enum bi_hash_alg h, uint8_t *block, size_t len)
{
    size_t dlen = bi_hash_len(h);
    uint8_t in[4 + 64], out[64];

    if (dlen == 0 || dlen > sizeof(out))
        return -EINVAL;
    for (size_t i = 0, off = 0; off < len; i++, off += dlen) {
        size_t n = BI_MIN(dlen, len - off);
        bi_st_be32(in, (uint32_t)i);
        memcpy(in + 4, block + off, n);
        /* the piece hashed is the index and this piece's bytes only */
        int ret = bi_hash(h, in, 4 + n, out);
        if (ret < 0)
            return ret;
        memcpy(block + off, out, n);
    }
    explicit_bzero(in, sizeof(in));
    explicit_bzero(out, sizeof(out));
    return 0;
}

static void xor_into(uint8_t *d, const uint8_t *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        d[i] ^= s[i];
}

int bi_afsplit_encode(enum bi_hash_alg h, size_t blocklen, uint32_t stripes,
                      const uint8_t *in, uint8_t *out)
{
    if (stripes == 0)
        return -EINVAL;
    uint8_t *d = calloc(1, blocklen);
    if (!d)
        return -ENOMEM;
    int ret = 0;
    for (uint32_t i = 0; i + 1 < stripes && ret == 0; i++) {
        uint8_t *s = out + (size_t)i * blocklen;
        ret = bi_random_bytes(s, blocklen);
        if (ret == 0) {
            xor_into(d, s, blocklen);
            ret = diffuse(h, d, blocklen);
        }
    }
    if (ret == 0) {
        uint8_t *last = out + (size_t)(stripes - 1) * blocklen;
        memcpy(last, d, blocklen);
        xor_into(last, in, blocklen);
    }
    bi_crypto_wipe_free(d, blocklen);
    return ret;
}

int bi_afsplit_decode(enum bi_hash_alg h, size_t blocklen, uint32_t stripes,
                      const uint8_t *in, uint8_t *out)
{
    if (stripes == 0)
        return -EINVAL;
    uint8_t *d = calloc(1, blocklen);
    if (!d)
        return -ENOMEM;
    int ret = 0;
    for (uint32_t i = 0; i + 1 < stripes && ret == 0; i++) {
        xor_into(d, in + (size_t)i * blocklen, blocklen);
        ret = diffuse(h, d, blocklen);
    }
    if (ret == 0) {
        memcpy(out, d, blocklen);
        xor_into(out, in + (size_t)(stripes - 1) * blocklen, blocklen);
    }
    bi_crypto_wipe_free(d, blocklen);
    return ret;
}
