/* SPDX-License-Identifier: MIT */
/* Debug events (block.h): their names and how one reaches the filter
 * that acts on it. */
#include "block/block.h"

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
