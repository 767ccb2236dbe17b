/* SPDX-License-Identifier: MIT */
/*
 * The library's messages (warnings, the findings of a check) go to the
 * handler the program installed, never to a stream of the library's own:
 * the library never prints.
 */
#include "blkimg/blkimg.h"
#include "util/util.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bi_message_fn *message_handler;
static void *message_opaque;

void bi_set_message_handler(bi_message_fn *fn, void *opaque)
{
    message_handler = fn;
    message_opaque = opaque;
}

void bi_message(enum bi_message_kind kind, const char *fmt, ...)
{
    if (!message_handler)
        return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    while (len && buf[len - 1] == '\n')
        buf[--len] = '\0';
    message_handler(message_opaque, kind, buf);
}
