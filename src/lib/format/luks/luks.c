/* SPDX-License-Identifier: MIT */
/*
 * The luks format (raw LUKS1 volumes), as QEMU 7.2's block/crypto.c
 * serves them: the header and key slots come first, the guest data
 * follows at the payload offset, encrypted sector by sector. Open takes
 * the passphrase from the secret that key-secret names and unlocks any
 * active key slot; the map hands the generic layer extents that carry
 * the sector encryption (bi_extent.crypt), so no data moves here.
 */
#include "format/luks/luks.h"
#include "blkimg/convert.h"
#include "crypto/secret.h"
#include "util/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *luks_opt(const char *const *opts, const char *key)
{
    return bi_opts_value(opts, key);
}

int luks_error(bi_error *err, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return bi_error_setc(err, code, "%s", msg);
}

/* "LUKS\xba\xbe" and version 1 (big-endian 16 bits at offset 6); LUKS2
 * headers are not probed by QEMU 7.2 (they are raw to it). */
static int luks_probe(const uint8_t *buf, size_t len, const char *filename)
{
    (void)filename;
    return len >= 8 && !memcmp(buf, "LUKS\xba\xbe", 6) &&
                   bi_ld_be16(buf + 6) == 1
               ? 100
               : 0;
}

/* Unlocks the master key with the passphrase of secret id and sets up
 * the payload's sector encryption. */
static int unlock(bi_node *n, struct luks_state *s, const char *id,
                  bi_error *err)
{
    char *pw = NULL;
    uint8_t *mk = NULL;
    int ret = bi_secret_lookup_utf8(id, &pw, err);
    if (ret < 0)
        return ret;
    mk = bi_xmalloc(s->h.key_bytes);
    ret = luks_find_key(&s->h, pw, n->file, 0, mk, err);
    if (ret == 0)
        ret = bi_crypt_new(&s->h.p, mk, s->h.key_bytes, &s->crypt, err);
    bi_crypto_wipe_free(mk, s->h.key_bytes);
    bi_secret_free(pw);
    return ret;
}

static int luks_co_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct luks_state *s = n->opaque;
    const char *id = luks_opt(o->driver_opts, "key-secret");
    uint8_t buf[LUKS_HDR_SIZE];

    if (!id && !o->metadata_only)
        return luks_error(err, -EINVAL,
                          "Parameter 'key-secret' is required for cipher");
    int ret = bi_co_pread(n->file, 0, buf, sizeof(buf));
    if (ret < 0)
        return luks_error(err, ret, "Unable to read LUKS header: %s",
                          strerror(-ret));
    ret = luks_header_parse(buf, &s->h, err);
    if (ret < 0)
        return ret;
    s->payload = (uint64_t)s->h.payload_offset * LUKS_SECTOR;
    s->secret_id = id ? bi_xstrdup(id) : NULL;
    if (id && (!o->metadata_only || o->read_write)) {
        ret = unlock(n, s, id, err);
        if (ret < 0)
            return ret;
    }
    /* QEMU's getlength fails (EIO) when the payload starts past the end
     * of the file, and its open with it, in these words */
    if (s->payload > n->file->size)
        return luks_error(err, -EIO, "Could not refresh total sector count: %s",
                          strerror(EIO));
    n->size = n->file->size - s->payload;
    return 0;
}

static void luks_close(bi_node *n)
{
    struct luks_state *s = n->opaque;
    if (!s)
        return;
    bi_crypt_free(s->crypt);
    s->crypt = NULL;
    free(s->secret_id);
    s->secret_id = NULL;
    explicit_bzero(&s->h, sizeof(s->h));
}

static int luks_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    return bi_run_co_open(luks_co_open, luks_close, n, o, err);
}

static void luks_refresh_limits(bi_node *n)
{
    n->limits = n->file->limits;
    /* whole encryption sectors, as QEMU's crypto driver asks */
    if (n->limits.request_alignment < LUKS_SECTOR)
        n->limits.request_alignment = LUKS_SECTOR;
}

static int luks_co_map(bi_node *n, uint64_t off, uint64_t len, unsigned flags,
                       struct bi_extent *ext)
{
    struct luks_state *s = n->opaque;
    (void)flags;
    if (!s->crypt)
        return -EIO; /* opened for metadata only: no key */
    ext->kind = BI_EXT_DATA;
    ext->len = len;
    ext->host = n->file;
    ext->host_offset = s->payload + off;
    ext->crypt = s->crypt;
    ext->crypt_offset = off;
    return 0;
}

/* QEMU's generic answer: data, no offset (ciphertext means nothing to a
 * reader of the file, and its holes do not read as zeroes). */
static int luks_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                                struct bi_status *st)
{
    (void)n;
    (void)off;
    st->len = len;
    st->flags = BI_BS_DATA;
    return 0;
}

static int luks_co_truncate(bi_node *n, uint64_t size, bool exact,
                            enum bi_prealloc prealloc, bi_error *err)
{
    struct luks_state *s = n->opaque;
    if (size > UINT64_MAX - s->payload)
        return luks_error(err, -EFBIG, "Image size too large");
    int ret = n->file->drv->co_truncate(n->file, s->payload + size, exact,
                                        prealloc, err);
    if (ret == 0)
        n->size = size;
    return ret;
}

static int64_t luks_allocated_size(bi_node *n)
{
    return n->file->drv->get_allocated_file_size
               ? n->file->drv->get_allocated_file_size(n->file)
               : -ENOTSUP;
}

static int luks_get_info(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    struct luks_state *s = n->opaque;
    (void)err;
    info->encrypted = true;
    info->specific = luks_header_value(&s->h);
    return 0;
}

/* QEMU 7.2's luks runtime options. */
static const struct bi_opt_desc luks_runtime_opts[] = {
    {"key-secret", BI_OPT_STRING,
     "ID of the secret that provides the keyslot passphrase", NULL,
     BI_OPT_STRONG},
    {NULL, 0, NULL, NULL, 0},
};

const struct bi_driver bi_drv_luks = {
    .name = "luks",
    .no_zero_init = true,
    .state_size = sizeof(struct luks_state),
    .probe = luks_probe,
    .open = luks_open,
    .close = luks_close,
    .create = luks_create,
    .create_opts = luks_create_opts,
    .measure = luks_measure,
    .amend = luks_amend,
    .amend_opts = luks_amend_opts,
    .runtime_opts = luks_runtime_opts,
    .refresh_limits = luks_refresh_limits,
    .co_map = luks_co_map,
    .co_truncate = luks_co_truncate,
    .co_block_status = luks_co_block_status,
    .get_allocated_file_size = luks_allocated_size,
    .get_info = luks_get_info,
};
