/* SPDX-License-Identifier: MIT */
/* The error object that carries one human-readable line up to the tool. */
#include "blkimg/blkimg.h"
#include "util/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void bi_error_init(bi_error *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

static bool error_is_set(const bi_error *err)
{
    return err->code != 0 || err->msg[0] != '\0';
}

void bi_error_set(bi_error *err, int errnum, const char *fmt, ...)
{
    va_list ap;
    size_t used;

    if (!err || error_is_set(err)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    if (errnum != 0) {
        int e = errnum < 0 ? -errnum : errnum;
        char buf[256];
        /* GNU strerror_r returns the message pointer (maybe not buf). */
        const char *s = strerror_r(e, buf, sizeof(buf));

        used = strlen(err->msg);
        snprintf(err->msg + used, sizeof(err->msg) - used, ": %s", s);
    }
    /* A message without an errno still marks the error as set; its code
     * is then the generic -EINVAL. */
    err->code = errnum > 0 ? -errnum : errnum < 0 ? errnum : -EINVAL;
}

int bi_error_setc(bi_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (!err || error_is_set(err)) {
        return code;
    }
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    err->code = code < 0 ? code : -EINVAL;
    return code;
}

void bi_error_prefix(bi_error *err, const char *fmt, ...)
{
    char old[sizeof(err->msg)];
    size_t n, room = sizeof(err->msg);
    va_list ap;

    if (!err) {
        return;
    }
    memcpy(old, err->msg, sizeof(old));
    va_start(ap, fmt);
    vsnprintf(err->msg, room, fmt, ap);
    va_end(ap);
    n = strlen(err->msg);
    if (n + 2 < room) {
        memcpy(err->msg + n, ": ", 3);
        n += 2;
        /* The tail is cut if the whole line would not fit. */
        size_t k = strnlen(old, room - 1 - n);
        memcpy(err->msg + n, old, k);
        err->msg[n + k] = '\0';
    }
}
