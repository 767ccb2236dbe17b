/* SPDX-License-Identifier: MIT */
/* bi_error: one line, strerror text appended, first error wins, prefixes. */
#include "blkimg/blkimg.h"
#include "format/qcow2/qcow2.h"
#include "format/vdi/vdi.h"
#include "tap.h"
#include "util/util.h"

#include <errno.h>

int main(void)
{
    bi_error e;

    bi_error_init(&e);
    is_int(e.code, 0, "init: no code");
    is_str(e.msg, "", "init: empty message");

    bi_error_set(&e, ENOENT, "Could not open '%s'", "x.img");
    is_str(e.msg, "Could not open 'x.img': No such file or directory",
           "errno text appended");
    is_int(e.code, -ENOENT, "positive errnum stored negative");

    bi_error_set(&e, EIO, "second");
    is_str(e.msg, "Could not open 'x.img': No such file or directory",
           "a set error is not overwritten");

    bi_error_prefix(&e, "%s", "base.qcow2");
    is_str(e.msg,
           "base.qcow2: Could not open 'x.img': No such file or directory",
           "prefix");
    is_int(e.code, -ENOENT, "prefix keeps the code");

    bi_error_init(&e);
    bi_error_set(&e, -EACCES, "Could not open '%s'", "y");
    is_str(e.msg, "Could not open 'y': Permission denied",
           "negative errnum accepted");
    is_int(e.code, -EACCES, "negative errnum stored as is");

    bi_error_init(&e);
    bi_error_set(&e, 0, "Image size must be a multiple of %d bytes", 512);
    is_str(e.msg, "Image size must be a multiple of 512 bytes",
           "no errno: message only");
    ok(e.code < 0, "no errno: still marked as failed (%d)", e.code);

    /* NULL error objects are allowed everywhere. */
    bi_error_init(NULL);
    bi_error_set(NULL, EIO, "x");
    bi_error_prefix(NULL, "y");
    ok(1, "NULL error object ignored");

    /* Long messages are cut to the buffer, never overflow. */
    char big[2000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    bi_error_init(&e);
    bi_error_set(&e, EIO, "%s", big);
    is_int(strlen(e.msg), sizeof(e.msg) - 1, "long message truncated");
    bi_error_prefix(&e, "%s", "p");
    ok(strncmp(e.msg, "p: aaa", 6) == 0 && strlen(e.msg) == sizeof(e.msg) - 1,
       "prefix of a full message truncates the tail");
    bi_error_init(&e);
    bi_error_set(&e, 0, "short");
    bi_error_prefix(&e, "%s", big);
    is_int(strlen(e.msg), sizeof(e.msg) - 1, "over-long prefix truncated");

    bi_error_init(&e);
    is_int(bi_error_setc(&e, -EFBIG, "L1 size too big"), -EFBIG,
           "setc returns its code");
    ok(!strcmp(e.msg, "L1 size too big") && e.code == -EFBIG,
       "setc: the message as given, no strerror, the code kept");
    bi_error_setc(&e, -EIO, "second");
    ok(!strcmp(e.msg, "L1 size too big") && e.code == -EFBIG,
       "setc keeps the first error");
    bi_error_init(&e);
    bi_error_setc(&e, 0, "no errno");
    is_int(e.code, -EINVAL, "setc without a code: -EINVAL");

    /* The drivers' error helpers keep the code they are given: the one
     * rule is that the call setting the message sets the code. */
    bi_error_init(&e);
    is_int(qc_error(&e, -EACCES, "qcow2: Image is %s", "corrupt"), -EACCES,
           "qc_error returns its code");
    ok(e.code == -EACCES && !strcmp(e.msg, "qcow2: Image is corrupt"),
       "qc_error: code kept (%d), message as given", e.code);
    is_int(qc_error(&e, -EIO, "later"), -EIO, "qc_error on a set error");
    is_int(e.code, -EACCES, "qc_error: the first error wins");
    bi_error_init(&e);
    vdi_error(&e, -ENOTSUP, "unsupported VDI image (version %u.%u)", 2, 0);
    is_int(e.code, -ENOTSUP, "vdi_error: code kept");
    return tap_done();
}
