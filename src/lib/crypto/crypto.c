/* SPDX-License-Identifier: MIT */
/*
 * Names, hashes, PBKDF2, random bytes and ciphers over libgcrypt.
 */
#include "crypto/crypto.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <gcrypt.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- libgcrypt */

static void gcrypt_init_once(void)
{
    /* A library must not take over an application's libgcrypt set-up:
     * initialise only when nobody did. */
    if (!gcry_control(GCRYCTL_INITIALIZATION_FINISHED_P)) {
        gcry_check_version(NULL);
        gcry_control(GCRYCTL_DISABLE_SECMEM, 0);
        gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    }
}

static void gcrypt_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, gcrypt_init_once);
}

static int gcry_errno(gcry_error_t e)
{
    int code = gcry_err_code_to_errno(gcry_err_code(e));
    return code > 0 ? -code : -EINVAL;
}

void bi_crypto_wipe_free(void *p, size_t len)
{
    if (p) {
        explicit_bzero(p, len);
        free(p);
    }
}

/* ----------------------------------------------------------------- names */

static const struct {
    const char *name;
    int gcry;
    size_t key, block;
} ciphers[BI_CIPHER__MAX] = {
    [BI_CIPHER_AES_128] = {"aes-128", GCRY_CIPHER_AES128, 16, 16},
    [BI_CIPHER_AES_192] = {"aes-192", GCRY_CIPHER_AES192, 24, 16},
    [BI_CIPHER_AES_256] = {"aes-256", GCRY_CIPHER_AES256, 32, 16},
    [BI_CIPHER_CAST5_128] = {"cast5-128", GCRY_CIPHER_CAST5, 16, 8},
    [BI_CIPHER_SERPENT_128] = {"serpent-128", GCRY_CIPHER_SERPENT128, 16, 16},
    [BI_CIPHER_SERPENT_192] = {"serpent-192", GCRY_CIPHER_SERPENT192, 24, 16},
    [BI_CIPHER_SERPENT_256] = {"serpent-256", GCRY_CIPHER_SERPENT256, 32, 16},
    [BI_CIPHER_TWOFISH_128] = {"twofish-128", GCRY_CIPHER_TWOFISH128, 16, 16},
    /* libgcrypt has no 192-bit Twofish key schedule (bi_cipher_new says) */
    [BI_CIPHER_TWOFISH_192] = {"twofish-192", 0, 24, 16},
    [BI_CIPHER_TWOFISH_256] = {"twofish-256", GCRY_CIPHER_TWOFISH, 32, 16},
};

static const char *const mode_names[BI_MODE__MAX] = {"ecb", "cbc", "xts",
                                                     "ctr"};
static const int gcry_modes[BI_MODE__MAX] = {
    GCRY_CIPHER_MODE_ECB, GCRY_CIPHER_MODE_CBC, GCRY_CIPHER_MODE_XTS,
    GCRY_CIPHER_MODE_CTR};
static const char *const ivgen_names[BI_IVGEN__MAX] = {"plain", "plain64",
                                                       "essiv"};
static const struct {
    const char *name;
    int gcry;
} hashes[BI_HASH__MAX] = {
    [BI_HASH_MD5] = {"md5", GCRY_MD_MD5},
    [BI_HASH_SHA1] = {"sha1", GCRY_MD_SHA1},
    [BI_HASH_SHA224] = {"sha224", GCRY_MD_SHA224},
    [BI_HASH_SHA256] = {"sha256", GCRY_MD_SHA256},
    [BI_HASH_SHA384] = {"sha384", GCRY_MD_SHA384},
    [BI_HASH_SHA512] = {"sha512", GCRY_MD_SHA512},
    [BI_HASH_RIPEMD160] = {"ripemd160", GCRY_MD_RMD160},
};

const char *bi_cipher_alg_name(enum bi_cipher_alg a)
{
    return (unsigned)a < BI_CIPHER__MAX ? ciphers[a].name : NULL;
}

int bi_cipher_alg_lookup(const char *name)
{
    for (int i = 0; i < BI_CIPHER__MAX; i++)
        if (!strcmp(ciphers[i].name, name))
            return i;
    return -1;
}

const char *bi_cipher_mode_name(enum bi_cipher_mode m)
{
    return (unsigned)m < BI_MODE__MAX ? mode_names[m] : NULL;
}

int bi_cipher_mode_lookup(const char *name)
{
    for (int i = 0; i < BI_MODE__MAX; i++)
        if (!strcmp(mode_names[i], name))
            return i;
    return -1;
}

const char *bi_ivgen_alg_name(enum bi_ivgen_alg a)
{
    return (unsigned)a < BI_IVGEN__MAX ? ivgen_names[a] : NULL;
}

int bi_ivgen_alg_lookup(const char *name)
{
    for (int i = 0; i < BI_IVGEN__MAX; i++)
        if (!strcmp(ivgen_names[i], name))
            return i;
    return -1;
}

const char *bi_hash_alg_name(enum bi_hash_alg a)
{
    return (unsigned)a < BI_HASH__MAX ? hashes[a].name : NULL;
}

int bi_hash_alg_lookup(const char *name)
{
    for (int i = 0; i < BI_HASH__MAX; i++)
        if (!strcmp(hashes[i].name, name))
            return i;
    return -1;
}

size_t bi_cipher_key_len(enum bi_cipher_alg a)
{
    return ciphers[a].key;
}

size_t bi_cipher_block_len(enum bi_cipher_alg a)
{
    return ciphers[a].block;
}

size_t bi_cipher_iv_len(enum bi_cipher_alg a, enum bi_cipher_mode m)
{
    return m == BI_MODE_ECB ? 0 : ciphers[a].block;
}

bool bi_cipher_mode_ok(enum bi_cipher_alg a, enum bi_cipher_mode m)
{
    return m != BI_MODE_XTS || ciphers[a].block == 16;
}

size_t bi_hash_len(enum bi_hash_alg h)
{
    gcrypt_init();
    return gcry_md_get_algo_dlen(hashes[h].gcry);
}

/* ------------------------------------------------------ hashes and KDFs */

int bi_hash(enum bi_hash_alg h, const void *data, size_t len, uint8_t *out)
{
    gcrypt_init();
    gcry_md_hash_buffer(hashes[h].gcry, out, data, len);
    return 0;
}

int bi_pbkdf2(enum bi_hash_alg h, const void *pass, size_t passlen,
              const uint8_t *salt, size_t saltlen, uint64_t iters, uint8_t *out,
              size_t outlen)
{
    gcrypt_init();
    if (iters == 0 || iters > ULONG_MAX)
        return -EINVAL;
    /* libgcrypt refuses an empty passphrase; PBKDF2 takes it (HMAC with
     * an empty key), so give it the same key as one NUL byte would be:
     * HMAC pads keys with zeroes. */
    static const uint8_t nul = 0;
    if (passlen == 0) {
        pass = &nul;
        passlen = 1;
    }
    gcry_error_t e =
        gcry_kdf_derive(pass, passlen, GCRY_KDF_PBKDF2, hashes[h].gcry, salt,
                        saltlen, (unsigned long)iters, outlen, out);
    return e ? gcry_errno(e) : 0;
}

static uint64_t thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* PBKDF2 rounds of each hash per second of CPU for one block of output
 * (one hash length), once measured in this process (0: not yet). A
 * round costs one HMAC per output block whatever the passphrase, so a
 * create that derives a key slot and the master key digest with one hash
 * measures once. */
static _Atomic uint64_t rounds_per_sec[BI_HASH__MAX];

/* Grow the round count until one derivation takes a tenth of a second of
 * this thread's CPU, then scale to a second. QEMU measures over half a
 * second, twice per create; a tenth measured to the microsecond is as
 * exact. 0 or -errno. */
static int measure_rounds(enum bi_hash_alg h, const void *pass, size_t passlen,
                          const uint8_t *salt, size_t saltlen, size_t keylen,
                          uint64_t *per_sec)
{
    uint8_t *out = bi_xmalloc(keylen);
    uint64_t n = 1 << 12, us = 0;
    int ret = 0;

    for (;;) {
        uint64_t t0 = thread_cpu_us();
        ret = bi_pbkdf2(h, pass, passlen, salt, saltlen, n, out, keylen);
        if (ret < 0)
            break;
        us = thread_cpu_us() - t0;
        if (us > 100000)
            break;
        if (n > UINT64_MAX / 2 / 1000000) {
            ret = -ERANGE;
            break;
        }
        n = us < 10000 ? n * 10 : n * 150000 / (us ? us : 1);
    }
    bi_crypto_wipe_free(out, keylen);
    if (ret == 0)
        *per_sec = n * 1000000 / us;
    return ret;
}

int bi_pbkdf2_count_iters(enum bi_hash_alg h, const void *pass, size_t passlen,
                          const uint8_t *salt, size_t saltlen, size_t keylen,
                          uint64_t *iters, bi_error *err)
{
    assert((unsigned)h < BI_HASH__MAX && keylen > 0);
    uint64_t hlen = bi_hash_len(h), blocks = (keylen + hlen - 1) / hlen;
    uint64_t rate = rounds_per_sec[h];
    if (rate == 0) {
        int ret =
            measure_rounds(h, pass, passlen, salt, saltlen, keylen, &rate);
        if (ret < 0)
            return bi_error_setc(err, ret, "Unable to get accurate CPU usage");
        rate *= blocks;
        rounds_per_sec[h] = rate;
    }
    *iters = rate / blocks;
    return 0;
}

int bi_random_bytes(void *buf, size_t len)
{
    gcrypt_init();
    gcry_randomize(buf, len, GCRY_STRONG_RANDOM);
    return 0;
}

/* ---------------------------------------------------------------- ciphers */

struct bi_cipher {
    gcry_cipher_hd_t hd;
    enum bi_cipher_alg alg;
    enum bi_cipher_mode mode;
};

int bi_cipher_new(enum bi_cipher_alg a, enum bi_cipher_mode m,
                  const uint8_t *key, size_t keylen, bi_cipher **out,
                  bi_error *err)
{
    gcrypt_init();
    *out = NULL;
    if ((unsigned)a >= BI_CIPHER__MAX || (unsigned)m >= BI_MODE__MAX)
        return bi_error_setc(err, -EINVAL, "Unsupported cipher");
    if (!ciphers[a].gcry)
        return bi_error_setc(err, -ENOTSUP,
                             "Cipher algorithm %s not supported by libgcrypt",
                             ciphers[a].name);
    if (!bi_cipher_mode_ok(a, m))
        return bi_error_setc(err, -ENOTSUP, "Unsupported cipher mode %s",
                             mode_names[m]);
    size_t want = ciphers[a].key * (m == BI_MODE_XTS ? 2 : 1);
    if (keylen != want)
        return bi_error_setc(
            err, -EINVAL, "Cipher key length %zu should be %zu", keylen, want);
    bi_cipher *c = bi_xmalloc(sizeof(*c));
    c->alg = a;
    c->mode = m;
    gcry_error_t e =
        gcry_cipher_open(&c->hd, ciphers[a].gcry, gcry_modes[m], 0);
    if (!e)
        e = gcry_cipher_setkey(c->hd, key, keylen);
    if (e) {
        if (c->hd)
            gcry_cipher_close(c->hd);
        free(c);
        return bi_error_setc(err, gcry_errno(e), "Cannot initialize cipher: %s",
                             gcry_strerror(e));
    }
    *out = c;
    return 0;
}

void bi_cipher_free(bi_cipher *c)
{
    if (c) {
        gcry_cipher_close(c->hd); /* libgcrypt wipes the key schedule */
        free(c);
    }
}

int bi_cipher_setiv(bi_cipher *c, const uint8_t *iv, size_t len)
{
    gcry_error_t e = c->mode == BI_MODE_CTR ? gcry_cipher_setctr(c->hd, iv, len)
                                            : gcry_cipher_setiv(c->hd, iv, len);
    return e ? gcry_errno(e) : 0;
}

/* len bytes of in (NULL: of out, in place) through the cipher into out. */
static int cipher_run(bi_cipher *c, bool enc, uint8_t *out, const uint8_t *in,
                      size_t len, bi_error *err)
{
    size_t bl = ciphers[c->alg].block;
    if (c->mode != BI_MODE_CTR && len % bl)
        return bi_error_setc(err, -EINVAL,
                             "Length %zu must be a multiple of block size %zu",
                             len, bl);
    size_t inlen = in ? len : 0;
    gcry_error_t e = enc ? gcry_cipher_encrypt(c->hd, out, len, in, inlen)
                         : gcry_cipher_decrypt(c->hd, out, len, in, inlen);
    if (e)
        return bi_error_setc(err, gcry_errno(e), "Cannot %s data: %s",
                             enc ? "encrypt" : "decrypt", gcry_strerror(e));
    return 0;
}

int bi_cipher_encrypt(bi_cipher *c, uint8_t *buf, size_t len, bi_error *err)
{
    return cipher_run(c, true, buf, NULL, len, err);
}

int bi_cipher_decrypt(bi_cipher *c, uint8_t *buf, size_t len, bi_error *err)
{
    return cipher_run(c, false, buf, NULL, len, err);
}

int bi_cipher_encrypt_to(bi_cipher *c, uint8_t *out, const uint8_t *in,
                         size_t len, bi_error *err)
{
    return cipher_run(c, true, out, in, len, err);
}
