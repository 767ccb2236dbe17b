/* SPDX-License-Identifier: MIT */
/*
 * The LUKS1 header and its key slots (luks_header.h).
 */
#include "format/luks/luks_header.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t luks_magic[6] = {'L', 'U', 'K', 'S', 0xba, 0xbe};

/* Header field offsets (all integers big-endian). */
enum {
    H_VERSION = 6,
    H_CIPHER_NAME = 8,
    H_CIPHER_MODE = 40,
    H_HASH_SPEC = 72,
    H_PAYLOAD = 104,
    H_KEY_BYTES = 108,
    H_MK_DIGEST = 112,
    H_MK_SALT = 132,
    H_MK_ITERS = 164,
    H_UUID = 168,
    H_SLOTS = 208,
    SLOT_SIZE = 48,
};

uint32_t luks_splitkey_sectors(uint32_t key_bytes, uint32_t stripes)
{
    uint64_t sectors =
        bi_align_up((uint64_t)key_bytes * stripes, LUKS_SECTOR) / LUKS_SECTOR;
    sectors = bi_align_up(sectors, LUKS_KEY_SLOT_OFFSET / LUKS_SECTOR);
    return sectors > UINT32_MAX ? UINT32_MAX : (uint32_t)sectors;
}

/* The LUKS cipher name and master key size to QEMU's algorithm (xts
 * keys are two keys). */
static int cipher_lookup(const char *name, enum bi_cipher_mode mode,
                         uint32_t key_bytes, bi_error *err)
{
    static const struct {
        const char *name;
        enum bi_cipher_alg first;
        int count;
    } families[] = {
        {"aes", BI_CIPHER_AES_128, 3},
        {"cast5", BI_CIPHER_CAST5_128, 1},
        {"serpent", BI_CIPHER_SERPENT_128, 3},
        {"twofish", BI_CIPHER_TWOFISH_128, 3},
    };
    uint32_t kb = mode == BI_MODE_XTS ? key_bytes / 2 : key_bytes;
    for (size_t i = 0; i < BI_ARRAY_SIZE(families); i++) {
        if (strcmp(families[i].name, name))
            continue;
        for (int k = 0; k < families[i].count; k++)
            if (bi_cipher_key_len(families[i].first + k) == kb)
                return families[i].first + k;
    }
    bi_error_setc(err, -EINVAL,
                  "Algorithm '%s' with key size %d bytes not supported", name,
                  (int)kb);
    return -1;
}

/* A fixed-size field that must hold a NUL. */
static int get_string(char *dst, const uint8_t *src, size_t n, const char *what,
                      bi_error *err)
{
    if (!memchr(src, 0, n))
        return bi_error_setc(err, -EINVAL,
                             "LUKS header %s is not NUL terminated", what);
    memcpy(dst, src, n);
    dst[n] = 0;
    return 0;
}

/* QEMU's check_header: the numbers, before any name is looked at. */
static int check_layout(const struct luks_header *h, bi_error *err)
{
    const uint32_t header_sectors = LUKS_KEY_SLOT_OFFSET / LUKS_SECTOR;

    if (h->payload_offset < header_sectors)
        return bi_error_setc(err, -EINVAL,
                             "LUKS payload is overlapping with the header");
    if (h->mk_iters == 0)
        return bi_error_setc(err, -EINVAL, "LUKS key iteration count is zero");
    for (int i = 0; i < LUKS_SLOTS; i++) {
        const struct luks_slot *s = &h->slots[i];
        uint64_t start = s->key_offset;
        uint64_t len = luks_splitkey_sectors(h->key_bytes, s->stripes);
        if (s->stripes != LUKS_STRIPES)
            return bi_error_setc(err, -EINVAL,
                                 "Keyslot %d is corrupted (stripes %d != %d)",
                                 i, (int)s->stripes, (int)LUKS_STRIPES);
        if (s->active != LUKS_SLOT_ACTIVE && s->active != LUKS_SLOT_INACTIVE)
            return bi_error_setc(
                err, -EINVAL, "Keyslot %d state (active/disable) is corrupted",
                i);
        if (s->active == LUKS_SLOT_ACTIVE && s->iters == 0)
            return bi_error_setc(err, -EINVAL,
                                 "Keyslot %d iteration count is zero", i);
        if (start < header_sectors)
            return bi_error_setc(
                err, -EINVAL, "Keyslot %d is overlapping with the LUKS header",
                i);
        if (start + len > h->payload_offset)
            return bi_error_setc(
                err, -EINVAL,
                "Keyslot %d is overlapping with the encrypted payload", i);
        for (int j = i + 1; j < LUKS_SLOTS; j++) {
            uint64_t s2 = h->slots[j].key_offset;
            uint64_t l2 =
                luks_splitkey_sectors(h->key_bytes, h->slots[j].stripes);
            if (start < s2 + l2 && s2 < start + len)
                return bi_error_setc(
                    err, -EINVAL,
                    "Keyslots %d and %d are overlapping in the header", i, j);
        }
    }
    return 0;
}

/* QEMU's parse_header: "<mode>-<ivgen>[:<hash>]", the names. */
static int parse_names(struct luks_header *h, bi_error *err)
{
    char mode[33], *ivgen, *ivhash;
    int v;

    memcpy(mode, h->cipher_mode, sizeof(mode));
    ivgen = strchr(mode, '-');
    if (!ivgen)
        return bi_error_setc(err, -EINVAL,
                             "Unexpected cipher mode string format '%s'",
                             h->cipher_mode);
    *ivgen++ = 0;
    ivhash = strchr(ivgen, ':');
    h->has_ivgen_hash = ivhash != NULL;
    h->p.ivgen_hash = 0;
    if (ivhash) {
        *ivhash++ = 0;
        v = bi_hash_alg_lookup(ivhash);
        if (v < 0)
            return bi_error_setc(err, -EINVAL,
                                 "Hash algorithm '%s' not supported", ivhash);
        h->p.ivgen_hash = v;
    }
    v = bi_cipher_mode_lookup(mode);
    if (v < 0)
        return bi_error_setc(err, -EINVAL, "Cipher mode '%s' not supported",
                             mode);
    h->p.mode = v;
    v = cipher_lookup(h->cipher_name, h->p.mode, h->key_bytes, err);
    if (v < 0)
        return -EINVAL;
    h->p.cipher = v;
    v = bi_hash_alg_lookup(h->hash_spec);
    if (v < 0)
        return bi_error_setc(err, -EINVAL, "Hash algorithm '%s' not supported",
                             h->hash_spec);
    h->hash = v;
    v = bi_ivgen_alg_lookup(ivgen);
    if (v < 0)
        return bi_error_setc(err, -EINVAL, "IV generator '%s' not supported",
                             ivgen);
    h->p.ivgen = v;
    if (h->p.ivgen == BI_IVGEN_ESSIV) {
        if (!ivhash)
            return bi_error_setc(err, -EINVAL,
                                 "Missing IV generator hash specification");
        if (bi_crypt_essiv_cipher(h->p.cipher, h->p.ivgen_hash, err) < 0)
            return -EINVAL;
    }
    h->p.sector_size = LUKS_SECTOR;
    return 0;
}

int luks_header_parse(const uint8_t *buf, struct luks_header *h, bi_error *err)
{
    memset(h, 0, sizeof(*h));
    if (memcmp(buf, luks_magic, sizeof(luks_magic)))
        return bi_error_setc(err, -EINVAL, "Volume is not in LUKS format");
    uint16_t version = bi_ld_be16(buf + H_VERSION);
    if (version != 1)
        return bi_error_setc(err, -EINVAL, "LUKS version %u is not supported",
                             version);
    int ret =
        get_string(h->cipher_name, buf + H_CIPHER_NAME, 32, "cipher name", err);
    if (ret == 0)
        ret = get_string(h->cipher_mode, buf + H_CIPHER_MODE, 32, "cipher mode",
                         err);
    if (ret == 0)
        ret = get_string(h->hash_spec, buf + H_HASH_SPEC, 32, "hash spec", err);
    if (ret < 0)
        return ret;
    h->payload_offset = bi_ld_be32(buf + H_PAYLOAD);
    h->key_bytes = bi_ld_be32(buf + H_KEY_BYTES);
    memcpy(h->mk_digest, buf + H_MK_DIGEST, LUKS_DIGEST_LEN);
    memcpy(h->mk_salt, buf + H_MK_SALT, LUKS_SALT_LEN);
    h->mk_iters = bi_ld_be32(buf + H_MK_ITERS);
    memcpy(h->uuid, buf + H_UUID, LUKS_UUID_LEN);
    h->uuid[LUKS_UUID_LEN] = 0;
    for (int i = 0; i < LUKS_SLOTS; i++) {
        const uint8_t *s = buf + H_SLOTS + SLOT_SIZE * i;
        h->slots[i].active = bi_ld_be32(s);
        h->slots[i].iters = bi_ld_be32(s + 4);
        memcpy(h->slots[i].salt, s + 8, LUKS_SALT_LEN);
        h->slots[i].key_offset = bi_ld_be32(s + 40);
        h->slots[i].stripes = bi_ld_be32(s + 44);
    }
    ret = check_layout(h, err);
    return ret < 0 ? ret : parse_names(h, err);
}

void luks_header_build(const struct luks_header *h, uint8_t *buf)
{
    memset(buf, 0, LUKS_HDR_SIZE);
    memcpy(buf, luks_magic, sizeof(luks_magic));
    bi_st_be16(buf + H_VERSION, 1);
    memcpy(buf + H_CIPHER_NAME, h->cipher_name, strnlen(h->cipher_name, 31));
    memcpy(buf + H_CIPHER_MODE, h->cipher_mode, strnlen(h->cipher_mode, 31));
    memcpy(buf + H_HASH_SPEC, h->hash_spec, strnlen(h->hash_spec, 31));
    bi_st_be32(buf + H_PAYLOAD, h->payload_offset);
    bi_st_be32(buf + H_KEY_BYTES, h->key_bytes);
    memcpy(buf + H_MK_DIGEST, h->mk_digest, LUKS_DIGEST_LEN);
    memcpy(buf + H_MK_SALT, h->mk_salt, LUKS_SALT_LEN);
    bi_st_be32(buf + H_MK_ITERS, h->mk_iters);
    memcpy(buf + H_UUID, h->uuid, strnlen(h->uuid, LUKS_UUID_LEN));
    for (int i = 0; i < LUKS_SLOTS; i++) {
        uint8_t *s = buf + H_SLOTS + SLOT_SIZE * i;
        bi_st_be32(s, h->slots[i].active);
        bi_st_be32(s + 4, h->slots[i].iters);
        memcpy(s + 8, h->slots[i].salt, LUKS_SALT_LEN);
        bi_st_be32(s + 40, h->slots[i].key_offset);
        bi_st_be32(s + 44, h->slots[i].stripes);
    }
}

bi_value *luks_header_value(const struct luks_header *h)
{
    bi_value *slots = bi_value_array();
    for (int i = 0; i < LUKS_SLOTS; i++) {
        const struct luks_slot *s = &h->slots[i];
        bool active = s->active == LUKS_SLOT_ACTIVE;
        bi_value *slot = bi_value_object();
        bi_value_set_bool(slot, "active", active);
        if (active)
            bi_value_set_int(slot, "iters", s->iters);
        bi_value_set_uint(slot, "key-offset",
                          (uint64_t)s->key_offset * LUKS_SECTOR);
        if (active)
            bi_value_set_int(slot, "stripes", s->stripes);
        bi_value_append(slots, slot);
    }
    bi_value *v = bi_value_object();
    bi_value_set_string(v, "cipher-alg", bi_cipher_alg_name(h->p.cipher));
    bi_value_set_string(v, "cipher-mode", bi_cipher_mode_name(h->p.mode));
    bi_value_set_string(v, "ivgen-alg", bi_ivgen_alg_name(h->p.ivgen));
    /* QEMU names the IV hash for essiv only (dm-crypt ignores it with
     * the other generators, and so does QEMU) */
    if (h->p.ivgen == BI_IVGEN_ESSIV)
        bi_value_set_string(v, "ivgen-hash-alg",
                            bi_hash_alg_name(h->p.ivgen_hash));
    bi_value_set_string(v, "hash-alg", bi_hash_alg_name(h->hash));
    bi_value_set_uint(v, "payload-offset",
                      (uint64_t)h->payload_offset * LUKS_SECTOR);
    bi_value_set_int(v, "master-key-iters", h->mk_iters);
    bi_value_set_string(v, "uuid", h->uuid);
    bi_value_set(v, "slots", slots);
    return v;
}

/* ------------------------------------------------------------- key slots */

/* Bytes of a slot's key material as stored: whole sectors. */
static size_t splitkey_len(const struct luks_header *h, int slot)
{
    return bi_align_up((uint64_t)h->key_bytes * h->slots[slot].stripes,
                       LUKS_SECTOR);
}

/* Encrypts or decrypts key material with key (the key slot's PBKDF2
 * output) as the payload is, sector numbers from 0. */
static int crypt_splitkey(const struct luks_header *h, const uint8_t *key,
                          bool enc, uint8_t *buf, size_t len, bi_error *err)
{
    bi_crypt *c;
    int ret = bi_crypt_new(&h->p, key, h->key_bytes, &c, err);
    if (ret < 0)
        return ret;
    ret = bi_crypt_sectors(c, enc, 0, buf, len);
    bi_crypt_free(c);
    if (ret < 0)
        bi_error_setc(err, ret, "Cannot %s key material",
                      enc ? "encrypt" : "decrypt");
    return ret;
}

int luks_load_key(const struct luks_header *h, int slot, const char *password,
                  bi_node *file, uint64_t base, uint8_t *mk, bi_error *err)
{
    const struct luks_slot *s = &h->slots[slot];
    if (s->active != LUKS_SLOT_ACTIVE)
        return 0;
    size_t len = splitkey_len(h, slot);
    uint8_t *split = bi_alloc_aligned(4096, len);
    uint8_t *key = bi_xmalloc(h->key_bytes);
    uint8_t digest[LUKS_DIGEST_LEN];
    int ret = split ? 0 : -ENOMEM;

    if (ret == 0)
        ret = bi_pbkdf2(h->hash, password, strlen(password), s->salt,
                        LUKS_SALT_LEN, s->iters, key, h->key_bytes);
    if (ret < 0) {
        bi_error_setc(err, ret, "Cannot derive key slot %d's key", slot);
        goto out;
    }
    ret = bi_pread(file, base + (uint64_t)s->key_offset * LUKS_SECTOR, split,
                   len);
    if (ret < 0) {
        bi_error_setc(err, ret, "Cannot read key slot %d: %s", slot,
                      strerror(-ret));
        goto out;
    }
    ret = crypt_splitkey(h, key, false, split, len, err);
    if (ret == 0)
        ret = bi_afsplit_decode(h->hash, h->key_bytes, s->stripes, split, mk);
    if (ret == 0)
        ret = bi_pbkdf2(h->hash, mk, h->key_bytes, h->mk_salt, LUKS_SALT_LEN,
                        h->mk_iters, digest, LUKS_DIGEST_LEN);
    if (ret < 0) {
        bi_error_setc(err, ret, "Cannot recover the master key");
        goto out;
    }
    ret = !memcmp(digest, h->mk_digest, LUKS_DIGEST_LEN);
out:
    explicit_bzero(digest, sizeof(digest));
    bi_crypto_wipe_free(key, h->key_bytes);
    if (split) {
        explicit_bzero(split, len);
        bi_free_aligned(split);
    }
    return ret;
}

int luks_find_key(const struct luks_header *h, const char *password,
                  bi_node *file, uint64_t base, uint8_t *mk, bi_error *err)
{
    for (int i = 0; i < LUKS_SLOTS; i++) {
        int r = luks_load_key(h, i, password, file, base, mk, err);
        if (r < 0)
            return r;
        if (r == 1)
            return 0;
    }
    return bi_error_setc(err, -EPERM,
                         "Invalid password, cannot unlock any keyslot");
}

int luks_write_header(const struct luks_header *h, bi_node *file, uint64_t base,
                      bi_error *err)
{
    uint8_t buf[LUKS_HDR_SIZE];
    luks_header_build(h, buf);
    int ret = bi_pwrite(file, base, buf, sizeof(buf), 0);
    if (ret < 0)
        return bi_error_setc(err, ret, "Cannot write LUKS header: %s",
                             strerror(-ret));
    return 0;
}

int luks_store_key(struct luks_header *h, int slot, const char *password,
                   const uint8_t *mk, uint64_t iter_time, bi_node *file,
                   uint64_t base, bi_error *err)
{
    struct luks_slot *s = &h->slots[slot];
    size_t len;
    uint8_t *split = NULL, *key = NULL;
    uint64_t iters;
    int ret;

    bi_random_bytes(s->salt, LUKS_SALT_LEN);
    ret = bi_pbkdf2_count_iters(h->hash, password, strlen(password), s->salt,
                                LUKS_SALT_LEN, h->key_bytes, &iters, err);
    if (ret < 0)
        return ret;
    if (iter_time && iters > UINT64_MAX / iter_time)
        return bi_error_setc(
            err, -ERANGE, "PBKDF iterations %" PRIu64 " too large to scale: %s",
            iters, strerror(ERANGE));
    iters = iters * iter_time / 1000;
    if (iters > UINT32_MAX)
        return bi_error_setc(err, -ERANGE,
                             "PBKDF iterations %" PRIu64 " larger than %u: %s",
                             iters, UINT32_MAX, strerror(ERANGE));
    s->iters = (uint32_t)BI_MAX(iters, LUKS_MIN_SLOT_ITERS);
    s->stripes = LUKS_STRIPES;

    len = splitkey_len(h, slot);
    split = bi_alloc_aligned(4096, len);
    key = bi_xmalloc(h->key_bytes);
    ret = split ? 0 : -ENOMEM;
    if (ret == 0) {
        memset(split, 0, len);
        ret = bi_pbkdf2(h->hash, password, strlen(password), s->salt,
                        LUKS_SALT_LEN, s->iters, key, h->key_bytes);
    }
    if (ret == 0)
        ret = bi_afsplit_encode(h->hash, h->key_bytes, s->stripes, mk, split);
    if (ret < 0) {
        bi_error_setc(err, ret, "Cannot split the master key");
        goto out;
    }
    ret = crypt_splitkey(h, key, true, split, len, err);
    if (ret < 0)
        goto out;
    ret = bi_pwrite(file, base + (uint64_t)s->key_offset * LUKS_SECTOR, split,
                    len, 0);
    if (ret < 0) {
        bi_error_setc(err, ret, "Cannot write key slot %d: %s", slot,
                      strerror(-ret));
        goto out;
    }
    s->active = LUKS_SLOT_ACTIVE;
    ret = luks_write_header(h, file, base, err);
out:
    bi_crypto_wipe_free(key, h->key_bytes);
    if (split) {
        explicit_bzero(split, len);
        bi_free_aligned(split);
    }
    return ret;
}

/* QCRYPTO_BLOCK_LUKS_ERASE_ITERATIONS */
#define LUKS_ERASE_PASSES 40

int luks_erase_key(struct luks_header *h, int slot, bi_node *file,
                   uint64_t base, bi_error *err)
{
    struct luks_slot *s = &h->slots[slot];
    size_t len = splitkey_len(h, slot);
    memset(s->salt, 0, LUKS_SALT_LEN);
    s->iters = 0;
    s->active = LUKS_SLOT_INACTIVE;
    int ret = luks_write_header(h, file, base, err);
    uint8_t *garbage = bi_alloc_aligned(4096, len);
    if (!garbage)
        return ret < 0 ? ret : -ENOMEM;
    /* the material overwritten with fresh random bytes
     * LUKS_ERASE_PASSES times, as QEMU does, even if the header failed */
    int r2 = 0;
    for (int pass = 0; pass < LUKS_ERASE_PASSES && r2 == 0; pass++) {
        bi_random_bytes(garbage, len);
        r2 = bi_pwrite(file, base + (uint64_t)s->key_offset * LUKS_SECTOR,
                       garbage, len, 0);
    }
    bi_free_aligned(garbage);
    if (r2 < 0 && ret == 0)
        ret = bi_error_setc(err, r2, "Cannot erase key slot %d: %s", slot,
                            strerror(-r2));
    return ret;
}
