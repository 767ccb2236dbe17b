/* SPDX-License-Identifier: MIT */
/*
 * Sector encryption: a cipher keyed with an image's master key and an IV
 * generator, the IV computed afresh for every sector from its number.
 */
#include "crypto/crypto.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct bi_crypt {
    struct bi_crypt_params p;
    bi_cipher *cipher;
    bi_cipher *essiv; /* essiv: keyed with the hash of the master key */
    size_t niv;       /* IV bytes the mode takes (0 for ecb) */
};

int bi_crypt_essiv_cipher(enum bi_cipher_alg cipher, enum bi_hash_alg hash,
                          bi_error *err)
{
    static const struct {
        enum bi_cipher_alg first;
        const char *family;
    } families[] = {
        {BI_CIPHER_AES_128, "AES"},
        {BI_CIPHER_SERPENT_128, "Serpent"},
        {BI_CIPHER_TWOFISH_128, "Twofish"},
    };
    size_t dlen = bi_hash_len(hash);

    if (dlen == bi_cipher_key_len(cipher))
        return cipher;
    for (size_t f = 0; f < BI_ARRAY_SIZE(families); f++) {
        enum bi_cipher_alg a = families[f].first;
        if (cipher < a || cipher > a + 2)
            continue;
        for (int k = 0; k < 3; k++)
            if (bi_cipher_key_len(a + k) == dlen)
                return a + k;
        bi_error_setc(err, -EINVAL, "No %s cipher with key size %zu available",
                      families[f].family, dlen);
        return -1;
    }
    bi_error_setc(err, -EINVAL, "Cipher %s not supported with essiv",
                  bi_cipher_alg_name(cipher));
    return -1;
}

int bi_crypt_new(const struct bi_crypt_params *p, const uint8_t *key,
                 size_t keylen, bi_crypt **out, bi_error *err)
{
    *out = NULL;
    bi_crypt *c = bi_xmalloc(sizeof(*c));
    memset(c, 0, sizeof(*c));
    c->p = *p;
    c->niv = bi_cipher_iv_len(p->cipher, p->mode);
    int ret = bi_cipher_new(p->cipher, p->mode, key, keylen, &c->cipher, err);
    if (ret == 0 && p->ivgen == BI_IVGEN_ESSIV) {
        int ec = bi_crypt_essiv_cipher(p->cipher, p->ivgen_hash, err);
        uint8_t salt[64];
        if (ec < 0) {
            ret = -EINVAL;
        } else {
            bi_hash(p->ivgen_hash, key, keylen, salt);
            ret = bi_cipher_new(ec, BI_MODE_ECB, salt,
                                bi_hash_len(p->ivgen_hash), &c->essiv, err);
            explicit_bzero(salt, sizeof(salt));
        }
    }
    if (ret < 0) {
        bi_crypt_free(c);
        return ret;
    }
    *out = c;
    return 0;
}

void bi_crypt_free(bi_crypt *c)
{
    if (c) {
        bi_cipher_free(c->cipher);
        bi_cipher_free(c->essiv);
        free(c);
    }
}

uint32_t bi_crypt_sector_size(const bi_crypt *c)
{
    return c->p.sector_size;
}

/* The IV of sector number s (niv bytes, at most 32). */
static int make_iv(bi_crypt *c, uint64_t s, uint8_t *iv)
{
    memset(iv, 0, c->niv);
    switch (c->p.ivgen) {
    case BI_IVGEN_PLAIN:
        bi_st_le32(iv, (uint32_t)s);
        return 0;
    case BI_IVGEN_PLAIN64:
        bi_st_le64(iv, s);
        return 0;
    case BI_IVGEN_ESSIV: {
        /* the sector number, little-endian, padded to the essiv cipher's
         * block and encrypted; IVs shorter than that block take its head */
        uint8_t blk[32] = {0};
        size_t bl = 16;
        bi_st_le64(blk, s);
        bl = BI_MAX(bl, c->niv);
        int ret = bi_cipher_encrypt(c->essiv, blk, bl, NULL);
        memcpy(iv, blk, c->niv);
        return ret;
    }
    default:
        return -EINVAL;
    }
}

/* len bytes from in (NULL: out, in place) through the sector cipher into
 * out, sector by sector; only encryption goes from one buffer to another. */
static int crypt_run(bi_crypt *c, bool encrypt, uint64_t sector, uint8_t *out,
                     const uint8_t *in, size_t len)
{
    size_t ss = c->p.sector_size;
    uint8_t iv[32];

    assert(!in || encrypt);
    if (len % ss)
        return -EINVAL;
    for (size_t off = 0; off < len; off += ss, sector++) {
        int ret = 0;
        if (c->niv) {
            ret = make_iv(c, sector, iv);
            if (ret == 0)
                ret = bi_cipher_setiv(c->cipher, iv, c->niv);
        }
        if (ret == 0 && in)
            ret =
                bi_cipher_encrypt_to(c->cipher, out + off, in + off, ss, NULL);
        else if (ret == 0)
            ret = encrypt ? bi_cipher_encrypt(c->cipher, out + off, ss, NULL)
                          : bi_cipher_decrypt(c->cipher, out + off, ss, NULL);
        if (ret < 0)
            return ret;
    }
    return 0;
}

int bi_crypt_sectors(bi_crypt *c, bool encrypt, uint64_t sector, uint8_t *buf,
                     size_t len)
{
    return crypt_run(c, encrypt, sector, buf, NULL, len);
}

int bi_crypt_encrypt_to(bi_crypt *c, uint64_t sector, uint8_t *out,
                        const uint8_t *in, size_t len)
{
    assert(in && (in + len <= out || out + len <= in));
    return crypt_run(c, true, sector, out, in, len);
}
