/* SPDX-License-Identifier: MIT */
/*
 * Image locking compatible with QEMU 7.2's file-posix driver.
 *
 * The facts of the protocol (not QEMU's code): open file description (OFD)
 * byte-range locks, all of them shared (F_RDLCK). For each permission bit i
 * an opener holds it locks byte 100 + i; for each bit it does NOT share with
 * others it locks byte 200 + i. An opener may take a permission only if
 * nobody locks 200 + i, and may refuse to share it only if nobody locks
 * 100 + i; both are tested with F_OFD_GETLK for a write lock. Bits:
 * consistent read 0, write 1, write unchanged 2, resize 3.
 */
#include "protocol/file.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define LOCK_PERM_BASE 100
#define LOCK_SHARED_BASE 200
#define PERM_BITS 4

const char *bi_file_perm_name(unsigned bit)
{
    switch (bit) {
    case BI_PERM_CONSISTENT_READ:
        return "consistent read";
    case BI_PERM_WRITE:
        return "write";
    case BI_PERM_WRITE_UNCHANGED:
        return "write unchanged";
    case BI_PERM_RESIZE:
        return "resize";
    default:
        return "unknown";
    }
}

static int lock_byte(int fd, int byte, short type)
{
    struct flock fl = {
        .l_type = type,
        .l_whence = SEEK_SET,
        .l_start = byte,
        .l_len = 1,
    };
    if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
        return -errno;
    }
    return 0;
}

/* 0 if nobody else holds a lock on byte, -EAGAIN if someone does. */
static int test_byte(int fd, int byte)
{
    struct flock fl = {
        .l_type = F_WRLCK,
        .l_whence = SEEK_SET,
        .l_start = byte,
        .l_len = 1,
    };
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0) {
        return -errno;
    }
    return fl.l_type == F_UNLCK ? 0 : -EAGAIN;
}

static void set_lock_error(bi_error *err, int ret, const char *what,
                           const char *name)
{
    /* EAGAIN/EACCES just mean "someone holds it": no errno text. */
    if (ret == -EAGAIN || ret == -EACCES) {
        bi_error_setc(err, ret, "%s\nIs another process using the image [%s]?",
                      what, name);
    } else {
        bi_error_setc(err, ret,
                      "%s: %s\nIs another process using the image [%s]?", what,
                      strerror(-ret), name);
    }
}

/* Locks the bytes of perm_bits / unshared_bits not yet held; with unlock,
 * also drops held bytes not in them. Updates lk's locked_* masks. */
static int apply_bytes(int fd, struct bi_file_lock *lk, unsigned perm_bits,
                       unsigned unshared_bits, bool unlock, int *failed_byte)
{
    for (int i = 0; i < PERM_BITS; i++) {
        unsigned bit = 1u << i;
        int ret;
        if ((perm_bits & bit) && !(lk->locked_perm & bit)) {
            ret = lock_byte(fd, LOCK_PERM_BASE + i, F_RDLCK);
            if (ret) {
                *failed_byte = LOCK_PERM_BASE + i;
                return ret;
            }
            lk->locked_perm |= bit;
        } else if (unlock && (lk->locked_perm & bit) && !(perm_bits & bit)) {
            if (lock_byte(fd, LOCK_PERM_BASE + i, F_UNLCK) == 0) {
                lk->locked_perm &= ~bit;
            }
        }
    }
    for (int i = 0; i < PERM_BITS; i++) {
        unsigned bit = 1u << i;
        int ret;
        if ((unshared_bits & bit) && !(lk->locked_unshared & bit)) {
            ret = lock_byte(fd, LOCK_SHARED_BASE + i, F_RDLCK);
            if (ret) {
                *failed_byte = LOCK_SHARED_BASE + i;
                return ret;
            }
            lk->locked_unshared |= bit;
        } else if (unlock && (lk->locked_unshared & bit) &&
                   !(unshared_bits & bit)) {
            if (lock_byte(fd, LOCK_SHARED_BASE + i, F_UNLCK) == 0) {
                lk->locked_unshared &= ~bit;
            }
        }
    }
    return 0;
}

/* Checks that perm can be taken and ~shared refused against other openers.
 * Sets *what to the message on conflict. */
static int check_bytes(int fd, unsigned perm, unsigned shared, char *what,
                       size_t whatlen)
{
    for (int i = 0; i < PERM_BITS; i++) {
        unsigned bit = 1u << i;
        if (perm & bit) {
            int ret = test_byte(fd, LOCK_SHARED_BASE + i);
            if (ret) {
                snprintf(what, whatlen, "Failed to get \"%s\" lock",
                         bi_file_perm_name(bit));
                return ret;
            }
        }
    }
    for (int i = 0; i < PERM_BITS; i++) {
        unsigned bit = 1u << i;
        if (!(shared & bit)) {
            int ret = test_byte(fd, LOCK_PERM_BASE + i);
            if (ret) {
                snprintf(what, whatlen, "Failed to get shared \"%s\" lock",
                         bi_file_perm_name(bit));
                return ret;
            }
        }
    }
    return 0;
}

int bi_file_lock_set(int fd, struct bi_file_lock *lk, unsigned perm,
                     unsigned shared, const char *name, bi_error *err)
{
    char what[128];
    int failed_byte = 0;
    int ret;

    perm &= BI_PERM_ALL;
    shared &= BI_PERM_ALL;

    /* Prepare: hold the union of old and new, then check the new set. */
    ret =
        apply_bytes(fd, lk, lk->perm | perm,
                    (~lk->shared | ~shared) & BI_PERM_ALL, false, &failed_byte);
    if (ret == 0) {
        ret = check_bytes(fd, perm, shared, what, sizeof(what));
    } else {
        snprintf(what, sizeof(what), "Failed to lock byte %d", failed_byte);
    }
    if (ret) {
        set_lock_error(err, ret, what, name);
        /* Abort: back to exactly the old set. */
        apply_bytes(fd, lk, lk->perm, ~lk->shared & BI_PERM_ALL, true,
                    &failed_byte);
        return ret;
    }
    /* Commit: drop what the new set does not need. */
    apply_bytes(fd, lk, perm, ~shared & BI_PERM_ALL, true, &failed_byte);
    lk->perm = perm;
    lk->shared = shared;
    return 0;
}

void bi_file_lock_release(int fd, struct bi_file_lock *lk)
{
    int failed_byte;

    apply_bytes(fd, lk, 0, 0, true, &failed_byte);
    lk->perm = 0;
    lk->shared = BI_PERM_ALL;
}
