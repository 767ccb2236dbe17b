/* SPDX-License-Identifier: MIT */
/*
 * The LUKS1 header (the LUKS1 on-disk format specification, version
 * 1.2.x), as QEMU 7.2 checks, reads and writes it: shared by the luks
 * format driver and qcow2's LUKS encryption (whose header sits at an
 * offset inside the qcow2 file; base below).
 *
 * Key slots: each holds the master key, anti-forensically split into
 * 4000 stripes and encrypted with a key PBKDF2 derives from a
 * passphrase; the master key's PBKDF2 digest in the header tells a right
 * passphrase from a wrong one.
 */
#ifndef BI_LUKS_HEADER_H
#define BI_LUKS_HEADER_H

#include "blkimg/blkimg.h"
#include "blkimg/value.h"
#include "crypto/crypto.h"
#include <stdbool.h>
#include <stdint.h>

#define LUKS_HDR_SIZE 592
#define LUKS_SLOTS 8
#define LUKS_SECTOR 512u
#define LUKS_STRIPES 4000u
#define LUKS_KEY_SLOT_OFFSET 4096u /* the first key material, in bytes */
#define LUKS_SLOT_ACTIVE 0x00AC71F3u
#define LUKS_SLOT_INACTIVE 0x0000DEADu
#define LUKS_DIGEST_LEN 20
#define LUKS_SALT_LEN 32
#define LUKS_UUID_LEN 40
#define LUKS_MIN_SLOT_ITERS 1000
#define LUKS_MIN_MASTER_ITERS 1000
#define LUKS_DEFAULT_ITER_TIME 2000 /* ms */

struct luks_slot {
    uint32_t active;
    uint32_t iters;
    uint8_t salt[LUKS_SALT_LEN];
    uint32_t key_offset; /* sectors */
    uint32_t stripes;
};

struct luks_header {
    char cipher_name[33]; /* the header's fields, NUL-terminated */
    char cipher_mode[33];
    char hash_spec[33];
    uint32_t payload_offset; /* sectors */
    uint32_t key_bytes;
    uint8_t mk_digest[LUKS_DIGEST_LEN];
    uint8_t mk_salt[LUKS_SALT_LEN];
    uint32_t mk_iters;
    char uuid[LUKS_UUID_LEN + 1];
    struct luks_slot slots[LUKS_SLOTS];
    /* what the strings name */
    struct bi_crypt_params p; /* sector_size LUKS_SECTOR */
    bool has_ivgen_hash;
    enum bi_hash_alg hash;
};

/* Parses and checks the LUKS_HDR_SIZE bytes at buf with QEMU 7.2's
 * checks, order and words. 0 or -errno with err set. */
int luks_header_parse(const uint8_t *buf, struct luks_header *h, bi_error *err);
/* The on-disk form of h (LUKS_HDR_SIZE bytes). */
void luks_header_build(const struct luks_header *h, uint8_t *buf);
/* qemu-img info's description of the header (QCryptoBlockInfoLUKS):
 * cipher-alg, cipher-mode, ivgen-alg, [ivgen-hash-alg], hash-alg,
 * payload-offset, master-key-iters, uuid, slots. */
bi_value *luks_header_value(const struct luks_header *h);
/* Key material sectors of one slot (rounded up to the 4 KiB alignment
 * of slots, as cryptsetup and QEMU lay them out). */
uint32_t luks_splitkey_sectors(uint32_t key_bytes, uint32_t stripes);

/* Key slots, reading and writing file at base + the header's offsets,
 * through the synchronous calls (from a coroutine or not). */
/* 1: slot holds password and mk (key_bytes) is the master key; 0: not
 * (inactive, or another password); -errno with err set. */
int luks_load_key(const struct luks_header *h, int slot, const char *password,
                  bi_node *file, uint64_t base, uint8_t *mk, bi_error *err);
/* The master key from any active slot: 0, or -EPERM with QEMU's
 * "Invalid password, cannot unlock any keyslot", or another error. */
int luks_find_key(const struct luks_header *h, const char *password,
                  bi_node *file, uint64_t base, uint8_t *mk, bi_error *err);
/* Stores mk in slot under password (PBKDF2 rounds for iter_time ms),
 * marks it active and writes the header. */
int luks_store_key(struct luks_header *h, int slot, const char *password,
                   const uint8_t *mk, uint64_t iter_time, bi_node *file,
                   uint64_t base, bi_error *err);
/* Marks slot inactive, writes the header, overwrites its key material
 * with random bytes. */
int luks_erase_key(struct luks_header *h, int slot, bi_node *file,
                   uint64_t base, bi_error *err);
/* Writes the header at base. */
int luks_write_header(const struct luks_header *h, bi_node *file, uint64_t base,
                      bi_error *err);

#endif
