/* SPDX-License-Identifier: MIT */
/* Debug events (block.h): their names and how one reaches the filter
 * that acts on it. */
#include "blkimg/blkimg.h"
#include "block/block.h"
#include "io/aio.h"

#include <errno.h>
#include <string.h>

static const char *const event_names[BI_DBG__MAX] = {
#define BI_DEBUG_EVENT(id, name) [BI_DBG_##id] = name,
#include "block/debug_events.def"
#undef BI_DEBUG_EVENT
};

const char *bi_debug_event_name(enum bi_debug_event ev)
{
    return (unsigned)ev < BI_DBG__MAX ? event_names[ev] : NULL;
}

int bi_debug_event_lookup(const char *name)
{
    for (int i = 0; i < BI_DBG__MAX; i++)
        if (!strcmp(event_names[i], name))
            return i;
    return -1;
}

void bi_debug_event(bi_node *n, enum bi_debug_event ev)
{
    while (n && !n->drv->debug_event)
        n = n->file != n ? n->file : NULL;
    if (n)
        n->drv->debug_event(n, ev);
}

void bi_debug_event_at(bi_node *n, enum bi_debug_event ev)
{
    if (n && n->drv->debug_event)
        n->drv->debug_event(n, ev);
}

/* The first node of n, n->file... whose driver has breakpoints (QEMU's
 * bdrv_debug_* walk down to the filter the same way). */
static bi_node *breakpoint_node(bi_node *n)
{
    while (n && !n->drv->debug_breakpoint)
        n = n->file != n ? n->file : NULL;
    return n;
}

int bi_debug_breakpoint(bi_node *n, const char *event, const char *tag)
{
    n = breakpoint_node(n);
    if (!n)
        return -ENOTSUP;
    int ev = bi_debug_event_lookup(event);
    if (ev < 0)
        return -ENOENT;
    return n->drv->debug_breakpoint(n, (enum bi_debug_event)ev, tag);
}

int bi_debug_remove_breakpoint(bi_node *n, const char *tag)
{
    n = breakpoint_node(n);
    return n ? n->drv->debug_remove_breakpoint(n, tag) : -ENOTSUP;
}

int bi_debug_resume(bi_node *n, const char *tag)
{
    n = breakpoint_node(n);
    return n ? n->drv->debug_resume(n, tag) : -ENOTSUP;
}

bool bi_debug_is_suspended(bi_node *n, const char *tag)
{
    n = breakpoint_node(n);
    return n && n->drv->debug_is_suspended(n, tag);
}

int bi_debug_wait(bi_node *n, const char *tag)
{
    n = breakpoint_node(n);
    if (!n)
        return -ENOTSUP;
    while (!n->drv->debug_is_suspended(n, tag))
        if (bi_loop_idle(bi_loop_run_once(true)))
            return -EDEADLK; /* qemu-io would wait forever */
    return 0;
}
