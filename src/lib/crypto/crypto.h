/* SPDX-License-Identifier: MIT */
/*
 * The crypto layer: QEMU 7.2's block-encryption algorithms over libgcrypt.
 *
 * Names are QEMU's (QCryptoCipherAlgorithm, QCryptoCipherMode,
 * QCryptoIVGenAlgorithm, QCryptoHashAlgorithm). A bi_crypt is what an
 * encrypted image needs: a cipher keyed with the master key plus an IV
 * generator, applied sector by sector (bi_crypt_sectors). Beside util at
 * the bottom of the library: depends on util only; nothing here does I/O.
 *
 * Keys and derived material are wiped (explicit_bzero) before they are
 * freed; every function is safe to call from the loop thread and from
 * worker threads on distinct objects.
 */
#ifndef BI_CRYPTO_H
#define BI_CRYPTO_H

#include "blkimg/blkimg.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum bi_cipher_alg {
    BI_CIPHER_AES_128,
    BI_CIPHER_AES_192,
    BI_CIPHER_AES_256,
    BI_CIPHER_CAST5_128,
    BI_CIPHER_SERPENT_128,
    BI_CIPHER_SERPENT_192,
    BI_CIPHER_SERPENT_256,
    BI_CIPHER_TWOFISH_128,
    BI_CIPHER_TWOFISH_192,
    BI_CIPHER_TWOFISH_256,
    BI_CIPHER__MAX
};

enum bi_cipher_mode {
    BI_MODE_ECB,
    BI_MODE_CBC,
    BI_MODE_XTS,
    BI_MODE_CTR,
    BI_MODE__MAX
};

enum bi_ivgen_alg {
    BI_IVGEN_PLAIN,
    BI_IVGEN_PLAIN64,
    BI_IVGEN_ESSIV,
    BI_IVGEN__MAX
};

enum bi_hash_alg {
    BI_HASH_MD5,
    BI_HASH_SHA1,
    BI_HASH_SHA224,
    BI_HASH_SHA256,
    BI_HASH_SHA384,
    BI_HASH_SHA512,
    BI_HASH_RIPEMD160,
    BI_HASH__MAX
};

/* QEMU's names ("aes-256", "xts", "plain64", "sha256") and back; the
 * lookups return -1 for a name QEMU does not know. */
const char *bi_cipher_alg_name(enum bi_cipher_alg a);
int bi_cipher_alg_lookup(const char *name);
const char *bi_cipher_mode_name(enum bi_cipher_mode m);
int bi_cipher_mode_lookup(const char *name);
const char *bi_ivgen_alg_name(enum bi_ivgen_alg a);
int bi_ivgen_alg_lookup(const char *name);
const char *bi_hash_alg_name(enum bi_hash_alg a);
int bi_hash_alg_lookup(const char *name);

/* Key bytes of the algorithm (one key: xts takes two) and its block. */
size_t bi_cipher_key_len(enum bi_cipher_alg a);
size_t bi_cipher_block_len(enum bi_cipher_alg a);
/* Bytes of IV a mode takes for the algorithm (ecb: none). */
size_t bi_cipher_iv_len(enum bi_cipher_alg a, enum bi_cipher_mode m);
/* Whether the mode works with the algorithm's block (xts: 16 bytes). */
bool bi_cipher_mode_ok(enum bi_cipher_alg a, enum bi_cipher_mode m);
size_t bi_hash_len(enum bi_hash_alg h);

/* Digest of data into out (bi_hash_len bytes). 0 or -errno. */
int bi_hash(enum bi_hash_alg h, const void *data, size_t len, uint8_t *out);
/* PBKDF2-HMAC (RFC 2898) of pass and salt, iters rounds, outlen bytes. */
int bi_pbkdf2(enum bi_hash_alg h, const void *pass, size_t passlen,
              const uint8_t *salt, size_t saltlen, uint64_t iters, uint8_t *out,
              size_t outlen);
/* How many PBKDF2 rounds of h take a second of this thread's CPU time
 * (for keys of keylen bytes), measured once per hash in a process over a
 * tenth of a second (QEMU measures half a second on every call). 0 or -errno
 * with err set in QEMU's words. */
int bi_pbkdf2_count_iters(enum bi_hash_alg h, const void *pass, size_t passlen,
                          const uint8_t *salt, size_t saltlen, size_t keylen,
                          uint64_t *iters, bi_error *err);
/* Random bytes for keys and salts. 0 or -errno. */
int bi_random_bytes(void *buf, size_t len);

/* LUKS1 anti-forensic split: in (blocklen bytes) to out (blocklen *
 * stripes bytes), and merge back. 0 or -errno. */
int bi_afsplit_encode(enum bi_hash_alg h, size_t blocklen, uint32_t stripes,
                      const uint8_t *in, uint8_t *out);
int bi_afsplit_decode(enum bi_hash_alg h, size_t blocklen, uint32_t stripes,
                      const uint8_t *in, uint8_t *out);

/* One cipher in one mode with its key (xts: both keys, 2 * key length). */
typedef struct bi_cipher bi_cipher;
int bi_cipher_new(enum bi_cipher_alg a, enum bi_cipher_mode m,
                  const uint8_t *key, size_t keylen, bi_cipher **out,
                  bi_error *err);
void bi_cipher_free(bi_cipher *c);
/* Sets the IV (ctr: the counter) for the next call. */
int bi_cipher_setiv(bi_cipher *c, const uint8_t *iv, size_t len);
/* In place; len a multiple of the block length (ctr: any). 0 or -errno
 * with err set (QEMU's "Length N must be a multiple of block size M"). */
int bi_cipher_encrypt(bi_cipher *c, uint8_t *buf, size_t len, bi_error *err);
int bi_cipher_decrypt(bi_cipher *c, uint8_t *buf, size_t len, bi_error *err);
/* The same, from in to out (len bytes each, not overlapping): encrypting
 * a caller's data without copying it first. */
int bi_cipher_encrypt_to(bi_cipher *c, uint8_t *out, const uint8_t *in,
                         size_t len, bi_error *err);

/* Sector encryption of an image: the cipher keyed with the master key,
 * a fresh IV per sector from the sector number (plain: its low 32 bits,
 * little-endian; plain64: 64 bits; essiv: encrypted with the hash of the
 * key as key, QEMU's choice of essiv cipher). */
typedef struct bi_crypt bi_crypt;
struct bi_crypt_params {
    enum bi_cipher_alg cipher;
    enum bi_cipher_mode mode;
    enum bi_ivgen_alg ivgen;
    enum bi_hash_alg ivgen_hash; /* essiv only */
    uint32_t sector_size;        /* 512 for LUKS */
};
/* The essiv cipher QEMU pairs with cipher for a digest of hash (the
 * family's member whose key is the digest's length), or -1 with err set
 * in QEMU's words. */
int bi_crypt_essiv_cipher(enum bi_cipher_alg cipher, enum bi_hash_alg hash,
                          bi_error *err);
int bi_crypt_new(const struct bi_crypt_params *p, const uint8_t *key,
                 size_t keylen, bi_crypt **out, bi_error *err);
void bi_crypt_free(bi_crypt *c);
uint32_t bi_crypt_sector_size(const bi_crypt *c);
/* Encrypts (or decrypts) buf in place: len bytes, a multiple of the
 * sector size, the first being sector number sector. 0 or -errno. */
int bi_crypt_sectors(bi_crypt *c, bool encrypt, uint64_t sector, uint8_t *buf,
                     size_t len);
/* Encrypts len bytes of plaintext in (not overlapping out) into out, the
 * first being sector number sector. 0 or -errno. */
int bi_crypt_encrypt_to(bi_crypt *c, uint64_t sector, uint8_t *out,
                        const uint8_t *in, size_t len);

/* explicit_bzero then free. */
void bi_crypto_wipe_free(void *p, size_t len);

#endif
