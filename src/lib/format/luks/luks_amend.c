/* SPDX-License-Identifier: MIT */
/*
 * qemu-img amend of a luks image's key slots, as QEMU 7.2 does it:
 * state=active adds new-secret's passphrase to a free (or the given)
 * slot, unlocking the master key with the image's key-secret;
 * state=inactive erases the given slot, or every slot old-secret opens,
 * refusing to erase the last active one unless forced.
 */
#include "crypto/secret.h"
#include "format/luks/luks.h"
#include "util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* QEMU 7.2's luks amend options. */
const struct bi_opt_desc luks_amend_opts[] = {
    {"state", BI_OPT_STRING,
     "Select new state of affected keyslots (active/inactive)", NULL, 0},
    {"keyslot", BI_OPT_NUMBER, "Select a single keyslot to modify explicitly",
     NULL, 0},
    {"old-secret", BI_OPT_STRING,
     "Select all keyslots that match this password", NULL, 0},
    {"new-secret", BI_OPT_STRING,
     "New secret to set in the matching keyslots. Empty string to erase", NULL,
     0},
    {"iter-time", BI_OPT_NUMBER, "Time to spend in PBKDF in milliseconds", NULL,
     0},
    {NULL, 0, NULL, NULL, 0},
};

struct amend_req {
    bool active;
    bool has_keyslot;
    int keyslot;
    const char *old_secret, *new_secret;
    bool has_iter_time;
    uint64_t iter_time;
};

static int parse(const char *const *opts, struct amend_req *r, bi_error *err)
{
    memset(r, 0, sizeof(*r));
    const char *state = luks_opt(opts, "state");
    if (!state)
        return luks_error(err, -EINVAL, "Parameter 'state' is missing");
    if (strcmp(state, "active") && strcmp(state, "inactive"))
        return luks_error(err, -EINVAL,
                          "Parameter 'state' does not accept value '%s'",
                          state);
    r->active = !strcmp(state, "active");
    const char *v = luks_opt(opts, "keyslot");
    if (v) {
        char *end;
        long k = strtol(v, &end, 0);
        if (!*v || *end)
            return luks_error(err, -EINVAL,
                              "Parameter 'keyslot' expects a number");
        r->has_keyslot = true;
        r->keyslot = k < INT32_MIN   ? INT32_MIN
                     : k > INT32_MAX ? INT32_MAX
                                     : (int)k;
    }
    r->old_secret = luks_opt(opts, "old-secret");
    r->new_secret = luks_opt(opts, "new-secret");
    if ((v = luks_opt(opts, "iter-time"))) {
        char *end;
        unsigned long long t = strtoull(v, &end, 0);
        if (!*v || *end || v[0] == '-')
            return luks_error(err, -EINVAL,
                              "Parameter 'iter-time' expects a number");
        r->has_iter_time = true;
        r->iter_time = t;
    }
    return 0;
}

static int count_active(const struct luks_header *h)
{
    int n = 0;
    for (int i = 0; i < LUKS_SLOTS; i++)
        n += h->slots[i].active == LUKS_SLOT_ACTIVE;
    return n;
}

/* The key slots of h, whose header lies at base in file; secret_id is
 * the passphrase the image was opened with. */
struct amend_target {
    struct luks_header *h;
    bi_node *file;
    uint64_t base;
    const char *secret_id;
};

static int add_keyslot(const struct amend_target *t, const struct amend_req *r,
                       bool force, bi_error *err)
{
    struct luks_header *h = t->h;
    int slot = -1;
    if (!r->new_secret)
        return luks_error(err, -EINVAL,
                          "'new-secret' is required to activate a keyslot");
    if (r->old_secret)
        return luks_error(
            err, -EINVAL,
            "'old-secret' must not be given when activating keyslots");
    if (r->has_keyslot) {
        slot = r->keyslot;
        if (slot < 0 || slot >= LUKS_SLOTS)
            return luks_error(
                err, -EINVAL,
                "Invalid keyslot %u specified, must be between 0 and %u",
                (unsigned)slot, LUKS_SLOTS - 1);
    } else {
        for (int i = 0; i < LUKS_SLOTS && slot < 0; i++)
            if (h->slots[i].active != LUKS_SLOT_ACTIVE)
                slot = i;
        if (slot < 0)
            return luks_error(err, -ENOSPC,
                              "Can't add a keyslot - all keyslots are in use");
    }
    if (!force && h->slots[slot].active == LUKS_SLOT_ACTIVE)
        return luks_error(err, -EINVAL,
                          "Refusing to overwrite active keyslot %i - please "
                          "erase it first",
                          slot);
    char *old = NULL, *pw = NULL;
    uint8_t *mk = bi_xmalloc(h->key_bytes);
    int ret = bi_secret_lookup_utf8(t->secret_id, &old, err);
    if (ret == 0)
        ret = luks_find_key(h, old, t->file, t->base, mk, err);
    if (ret == 0)
        ret = bi_secret_lookup_utf8(r->new_secret, &pw, err);
    if (ret == 0)
        ret = luks_store_key(h, slot, pw, mk,
                             r->has_iter_time ? r->iter_time
                                              : LUKS_DEFAULT_ITER_TIME,
                             t->file, t->base, err);
    bi_crypto_wipe_free(mk, h->key_bytes);
    bi_secret_free(old);
    bi_secret_free(pw);
    return ret;
}

static int erase_keyslots(const struct amend_target *t,
                          const struct amend_req *r, bool force, bi_error *err)
{
    struct luks_header *h = t->h;
    char *old = NULL;
    uint8_t *tmp = NULL;
    int ret = 0;

    if (r->new_secret)
        return luks_error(
            err, -EINVAL,
            "'new-secret' must not be given when erasing keyslots");
    if (r->has_iter_time)
        return luks_error(
            err, -EINVAL,
            "'iter-time' must not be given when erasing keyslots");
    if (r->old_secret) {
        ret = bi_secret_lookup_utf8(r->old_secret, &old, err);
        if (ret < 0)
            return ret;
        tmp = bi_xmalloc(h->key_bytes);
    }
    if (r->has_keyslot) {
        int slot = r->keyslot;
        if (slot < 0 || slot >= LUKS_SLOTS) {
            ret = luks_error(
                err, -EINVAL,
                "Invalid keyslot %i specified, must be between 0 and %i", slot,
                LUKS_SLOTS - 1);
            goto out;
        }
        if (old) {
            ret = luks_load_key(h, slot, old, t->file, t->base, tmp, err);
            if (ret == 0)
                ret = luks_error(err, -EINVAL,
                                 "Given keyslot %i doesn't contain the given "
                                 "old password for erase operation",
                                 slot);
            if (ret < 0)
                goto out;
        }
        if (!force && h->slots[slot].active != LUKS_SLOT_ACTIVE) {
            ret = luks_error(err, -EINVAL,
                             "Given keyslot %i is already erased (inactive) ",
                             slot);
            goto out;
        }
        if (!force && count_active(h) == 1) {
            ret = luks_error(err, -EINVAL,
                             "Attempt to erase the only active keyslot %i "
                             "which will erase all the data in the image "
                             "irreversibly - refusing operation",
                             slot);
            goto out;
        }
        ret = luks_erase_key(h, slot, t->file, t->base, err);
    } else if (old) {
        unsigned mask = 0;
        int count = 0;
        for (int i = 0; i < LUKS_SLOTS; i++) {
            int rv = luks_load_key(h, i, old, t->file, t->base, tmp, err);
            if (rv < 0) {
                ret = rv;
                goto out;
            }
            if (rv == 1) {
                mask |= 1u << i;
                count++;
            }
        }
        if (count == 0) {
            ret = luks_error(err, -EINVAL,
                             "No keyslots match given (old) password for "
                             "erase operation");
            goto out;
        }
        if (!force && count == count_active(h)) {
            ret = luks_error(
                err, -EINVAL,
                "All the active keyslots match the (old) password that was "
                "given and erasing them will erase all the data in the image "
                "irreversibly - refusing operation");
            goto out;
        }
        for (int i = 0; i < LUKS_SLOTS && ret == 0; i++)
            if (mask & (1u << i))
                ret = luks_erase_key(h, i, t->file, t->base, err);
    } else {
        ret = luks_error(err, -EINVAL,
                         "To erase keyslot(s), either explicit keyslot index "
                         "or the password currently contained in them must "
                         "be given");
    }
out:
    if (tmp)
        bi_crypto_wipe_free(tmp, h->key_bytes);
    bi_secret_free(old);
    return ret;
}

int luks_amend_keyslots(struct luks_header *h, bi_node *file, uint64_t base,
                        const char *secret_id, const char *const *options,
                        bool force, bi_error *err)
{
    struct amend_target t = {h, file, base, secret_id};
    struct amend_req r;
    int ret = parse(options, &r, err);
    if (ret < 0)
        return ret;
    ret = r.active ? add_keyslot(&t, &r, force, err)
                   : erase_keyslots(&t, &r, force, err);
    if (ret == 0) {
        ret = bi_flush(file);
        if (ret < 0)
            luks_error(err, ret, "Could not flush: %s", strerror(-ret));
    }
    return ret;
}

int luks_amend(bi_node *n, const char *const *options, bool force,
               bi_amend_status_cb *cb, void *opaque, bi_error *err)
{
    struct luks_state *s = n->opaque;
    (void)cb;
    (void)opaque;
    return luks_amend_keyslots(&s->h, n->file, 0, s->secret_id, options, force,
                               err);
}
