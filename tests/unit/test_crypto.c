/* SPDX-License-Identifier: MIT */
/* The crypto layer against published known-answer vectors: SHA-256
 * (FIPS 180-2), PBKDF2-HMAC-SHA1 (RFC 6070), XTS-AES (IEEE 1619-2007
 * vectors 1, 2 and 4), AES-128-CBC (NIST SP 800-38A F.2.1), the IV
 * generators, the anti-forensic splitter and base64 as QEMU takes it. */
#include "crypto/crypto.h"
#include "crypto/secret.h"
#include "tap.h"
#include "util/util.h"

#include <errno.h>

/* Hex string to bytes; returns the byte count. */
static size_t unhex(const char *s, uint8_t *out)
{
    size_t n = 0;
    for (; s[0] && s[1]; s += 2)
        sscanf(s, "%2hhx", &out[n++]);
    return n;
}

static bool same_hex(const uint8_t *got, size_t len, const char *want)
{
    uint8_t w[1024];
    return unhex(want, w) == len && !memcmp(got, w, len);
}

static void test_hash_kdf(void)
{
    uint8_t out[64];

    bi_hash(BI_HASH_SHA256, "abc", 3, out);
    ok(same_hex(out, 32,
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb4"
                "10ff61f20015ad"),
       "SHA-256 of abc");
    is_uint(bi_hash_len(BI_HASH_RIPEMD160), 20, "ripemd160 digest length");
    is_uint(bi_hash_len(BI_HASH_SHA384), 48, "sha384 digest length");

    static const struct {
        uint64_t c;
        const char *dk;
    } v[] = {
        {1, "0c60c80f961f0e71f3a9b524af6012062fe037a6"},
        {2, "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957"},
        {4096, "4b007901b765489abead49d926f721d065a429c1"},
    };
    for (size_t i = 0; i < BI_ARRAY_SIZE(v); i++) {
        int r = bi_pbkdf2(BI_HASH_SHA1, "password", 8, (const uint8_t *)"salt",
                          4, v[i].c, out, 20);
        ok(r == 0 && same_hex(out, 20, v[i].dk), "RFC 6070 c=%llu",
           (unsigned long long)v[i].c);
    }
    int r = bi_pbkdf2(BI_HASH_SHA1, "passwordPASSWORDpassword", 24,
                      (const uint8_t *)"saltSALTsaltSALTsaltSALTsaltSALTsalt",
                      36, 4096, out, 25);
    ok(r == 0 && same_hex(out, 25,
                          "3d2eec4fe41c849b80c8d83662c0e44a8b291a96"
                          "4cf2f07038"),
       "RFC 6070 long password and salt, 25 bytes");
    uint8_t a[20], b[20];
    ok(bi_pbkdf2(BI_HASH_SHA256, "", 0, (const uint8_t *)"s", 1, 2, a, 20) ==
               0 &&
           bi_pbkdf2(BI_HASH_SHA256, "\0", 1, (const uint8_t *)"s", 1, 2, b,
                     20) == 0 &&
           !memcmp(a, b, 20),
       "an empty passphrase derives as HMAC's zero-padded key");
}

/* IEEE 1619 vectors through the sector path: xts with plain64 IVs is
 * the data-unit sequence number as the tweak. */
static void test_xts(void)
{
    struct bi_crypt_params p = {BI_CIPHER_AES_128, BI_MODE_XTS,
                                BI_IVGEN_PLAIN64, 0, 32};
    uint8_t key[64], buf[512];
    bi_crypt *c;

    memset(key, 0, 32);
    memset(buf, 0, 32);
    ok(bi_crypt_new(&p, key, 32, &c, NULL) == 0, "xts-aes-128 context");
    ok(bi_crypt_sectors(c, true, 0, buf, 32) == 0 &&
           same_hex(buf, 32,
                    "917cf69ebd68b2ec9b9fe9a3eadda692cd43d2f59598ed"
                    "858c02c2652fbf922e"),
       "IEEE 1619 vector 1");
    bi_crypt_free(c);

    memset(key, 0x11, 16);
    memset(key + 16, 0x22, 16);
    memset(buf, 0x44, 32);
    ok(bi_crypt_new(&p, key, 32, &c, NULL) == 0 &&
           bi_crypt_sectors(c, true, 0x3333333333ULL, buf, 32) == 0 &&
           same_hex(buf, 32,
                    "c454185e6a16936e39334038acef838bfb186fff7480ad"
                    "c4289382ecd6d394f0"),
       "IEEE 1619 vector 2");
    ok(bi_crypt_sectors(c, false, 0x3333333333ULL, buf, 32) == 0 &&
           buf[0] == 0x44 && buf[31] == 0x44,
       "vector 2 decrypts back");
    bi_crypt_free(c);

    /* vector 4: 512 bytes 00..ff twice, keys from pi and e, unit 0 */
    unhex("2718281828459045235360287471352631415926535897932384626433832795",
          key);
    for (int i = 0; i < 512; i++)
        buf[i] = (uint8_t)i;
    p.sector_size = 512;
    ok(bi_crypt_new(&p, key, 32, &c, NULL) == 0 &&
           bi_crypt_sectors(c, true, 0, buf, 512) == 0 &&
           same_hex(buf, 32,
                    "27a7479befa1d476489f308cd4cfa6e2a96e4bbe3208ff"
                    "25287dd3819616e89c"),
       "IEEE 1619 vector 4 (a 512-byte sector)");
    /* the same vector from one buffer into another, input untouched */
    uint8_t in[512], out[512];
    for (int i = 0; i < 512; i++)
        in[i] = (uint8_t)i;
    ok(bi_crypt_encrypt_to(c, 0, out, in, 512) == 0 && !memcmp(out, buf, 512) &&
           in[0] == 0 && in[511] == 0xff,
       "vector 4 encrypted from one buffer into another");
    ok(bi_crypt_encrypt_to(c, 0, out, in, 500) == -EINVAL,
       "a partial sector is refused");
    bi_crypt_free(c);
}

static void test_cbc_ivgen(void)
{
    uint8_t key[32], iv[16], buf[64];
    bi_cipher *c;

    unhex("2b7e151628aed2a6abf7158809cf4f3c", key);
    unhex("000102030405060708090a0b0c0d0e0f", iv);
    unhex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51",
          buf);
    ok(bi_cipher_new(BI_CIPHER_AES_128, BI_MODE_CBC, key, 16, &c, NULL) == 0 &&
           bi_cipher_setiv(c, iv, 16) == 0 &&
           bi_cipher_encrypt(c, buf, 32, NULL) == 0 &&
           same_hex(buf, 32,
                    "7649abac8119b246cee98e9b12e9197d5086cb9b507219"
                    "ee95db113a917678b2"),
       "SP 800-38A CBC-AES128 encrypt");
    bi_error e;
    bi_error_init(&e);
    ok(bi_cipher_encrypt(c, buf, 3, &e) == -EINVAL &&
           !strcmp(e.msg, "Length 3 must be a multiple of block size 16"),
       "partial block refused in QEMU's words");
    bi_cipher_free(c);

    /* plain truncates the sector number to 32 bits, plain64 does not */
    struct bi_crypt_params p = {BI_CIPHER_AES_128, BI_MODE_CBC, BI_IVGEN_PLAIN,
                                0, 16};
    bi_crypt *a, *b;
    uint8_t x[16] = {0}, y[16] = {0};
    bi_crypt_new(&p, key, 16, &a, NULL);
    p.ivgen = BI_IVGEN_PLAIN64;
    bi_crypt_new(&p, key, 16, &b, NULL);
    bi_crypt_sectors(a, true, 0x100000005ULL, x, 16);
    bi_crypt_sectors(b, true, 5, y, 16);
    ok(!memcmp(x, y, 16), "plain: sector 2^32+5 is sector 5");
    memset(x, 0, 16);
    bi_crypt_sectors(b, true, 0x100000005ULL, x, 16);
    ok(memcmp(x, y, 16), "plain64: sector 2^32+5 is not");
    bi_crypt_free(a);
    bi_crypt_free(b);

    /* essiv: AES-128 with sha256 takes AES-256 for the IVs (dm-crypt) */
    is_int(bi_crypt_essiv_cipher(BI_CIPHER_AES_128, BI_HASH_SHA256, NULL),
           BI_CIPHER_AES_256, "essiv cipher for aes-128 and sha256");
    bi_error_init(&e);
    is_int(bi_crypt_essiv_cipher(BI_CIPHER_AES_128, BI_HASH_SHA1, &e), -1,
           "no AES with a 20-byte key");
    is_str(e.msg, "No AES cipher with key size 20 available", "its words");
    bi_error_init(&e);
    is_int(bi_crypt_essiv_cipher(BI_CIPHER_CAST5_128, BI_HASH_MD5, &e),
           BI_CIPHER_CAST5_128, "cast5 with md5: same key length");
    is_int(bi_crypt_essiv_cipher(BI_CIPHER_CAST5_128, BI_HASH_SHA256, &e), -1,
           "cast5 with sha256 refused");
    is_str(e.msg, "Cipher cast5-128 not supported with essiv", "its words");

    /* essiv IV of sector s is E_{sha256(key)}(le64 s) */
    uint8_t salt[32], ivb[16] = {9}, ref[16] = {0}, data[16] = {0};
    p = (struct bi_crypt_params){BI_CIPHER_AES_128, BI_MODE_CBC, BI_IVGEN_ESSIV,
                                 BI_HASH_SHA256, 16};
    bi_hash(BI_HASH_SHA256, key, 16, salt);
    bi_cipher_new(BI_CIPHER_AES_256, BI_MODE_ECB, salt, 32, &c, NULL);
    ivb[0] = 9;
    memset(ivb + 1, 0, 15);
    bi_cipher_encrypt(c, ivb, 16, NULL);
    bi_cipher_free(c);
    bi_cipher_new(BI_CIPHER_AES_128, BI_MODE_CBC, key, 16, &c, NULL);
    bi_cipher_setiv(c, ivb, 16);
    bi_cipher_encrypt(c, ref, 16, NULL);
    bi_cipher_free(c);
    bi_crypt_new(&p, key, 16, &a, NULL);
    bi_crypt_sectors(a, true, 9, data, 16);
    ok(!memcmp(data, ref, 16), "essiv:sha256 IV of sector 9");
    bi_crypt_free(a);
}

static void test_every_cipher(void)
{
    for (int a = 0; a < BI_CIPHER__MAX; a++) {
        for (int m = 0; m < BI_MODE__MAX; m++) {
            if (!bi_cipher_mode_ok(a, m))
                continue;
            size_t kl = bi_cipher_key_len(a) * (m == BI_MODE_XTS ? 2 : 1);
            uint8_t key[64], buf[1024], orig[1024];
            for (size_t i = 0; i < kl; i++)
                key[i] = (uint8_t)(i * 13 + 1);
            for (size_t i = 0; i < sizeof(buf); i++)
                orig[i] = buf[i] = (uint8_t)(i * 7);
            struct bi_crypt_params p = {a, m, BI_IVGEN_PLAIN64, 0, 512};
            bi_crypt *c;
            int r = bi_crypt_new(&p, key, kl, &c, NULL);
            if (a == BI_CIPHER_TWOFISH_192) {
                is_int(r, -ENOTSUP, "twofish-192 %s: libgcrypt lacks it",
                       bi_cipher_mode_name(m));
                continue;
            }
            ok(r == 0 && bi_crypt_sectors(c, true, 7, buf, 1024) == 0 &&
                   memcmp(buf, orig, 512) && memcmp(buf + 512, orig + 512, 512),
               "%s-%s encrypts", bi_cipher_alg_name(a), bi_cipher_mode_name(m));
            ok(bi_crypt_sectors(c, false, 7, buf, 1024) == 0 &&
                   !memcmp(buf, orig, 1024),
               "%s-%s decrypts", bi_cipher_alg_name(a), bi_cipher_mode_name(m));
            bi_crypt_free(c);
        }
    }
}

static void test_afsplit(void)
{
    uint8_t key[64], back[64], *split = malloc(64 * 4000);
    for (int i = 0; i < 64; i++)
        key[i] = (uint8_t)(i ^ 0x5a);
    ok(bi_afsplit_encode(BI_HASH_SHA256, 64, 4000, key, split) == 0,
       "afsplit 64 bytes into 4000 stripes");
    ok(bi_afsplit_decode(BI_HASH_SHA256, 64, 4000, split, back) == 0 &&
           !memcmp(key, back, 64),
       "merge gives the key back");
    split[1000] ^= 1;
    bi_afsplit_decode(BI_HASH_SHA256, 64, 4000, split, back);
    ok(memcmp(key, back, 64), "one flipped bit loses it");
    /* a 20-byte digest over a 64-byte key: last piece cut */
    ok(bi_afsplit_encode(BI_HASH_SHA1, 64, 3, key, split) == 0 &&
           bi_afsplit_decode(BI_HASH_SHA1, 64, 3, split, back) == 0 &&
           !memcmp(key, back, 64),
       "sha1 (partial digest pieces) round trip");
    /* stripes of 1: the key as it is */
    ok(bi_afsplit_encode(BI_HASH_SHA1, 16, 1, key, split) == 0 &&
           !memcmp(split, key, 16),
       "one stripe is the key");
    free(split);
}

static void test_base64(void)
{
    uint8_t *out;
    size_t n;
    bi_error e;
    bi_error_init(&e);
    ok(bi_base64_decode("aGVsbG8=", 8, &out, &n, &e) == 0 && n == 5 &&
           !memcmp(out, "hello", 5),
       "base64 hello");
    free(out);
    ok(bi_base64_decode("aGk\n", 4, &out, &n, &e) == -EINVAL &&
           !strcmp(e.msg, "Base64 data contains invalid characters"),
       "a newline is an invalid character, as in QEMU");
}

int main(void)
{
    test_hash_kdf();
    test_xts();
    test_cbc_ivgen();
    test_every_cipher();
    test_afsplit();
    test_base64();
    return tap_done();
}
