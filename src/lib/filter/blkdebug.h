/* SPDX-License-Identifier: MIT */
/* The blkdebug filter's rules (blkdebug.c runs them, blkdebug_rules.c
 * reads them from a config file and from options). */
#ifndef BI_BLKDEBUG_H
#define BI_BLKDEBUG_H

#include "block/block.h"
#include <stdbool.h>
#include <stdint.h>

/* QEMU 7.2's BlkdebugIOType, as bits of a rule's iotype mask. */
enum bd_iotype {
    BD_IO_READ,
    BD_IO_WRITE,
    BD_IO_WRITE_ZEROES,
    BD_IO_DISCARD,
    BD_IO_FLUSH,
    BD_IO_BLOCK_STATUS,
    BD_IO__MAX
};

struct bd_rule {
    int event;     /* enum bi_debug_event */
    bool inject;   /* inject-error; else set-state */
    int64_t state; /* fires only in this state; 0: any */
    /* inject-error */
    int error;       /* errno; 0: the request goes through */
    uint64_t offset; /* byte the request must cover; UINT64_MAX: any */
    bool once, immediately;
    unsigned iotype_mask;
    /* set-state */
    int64_t new_state;
    bool removed; /* a once rule that fired */
};

struct bd_rules {
    struct bd_rule *v; /* in the order they were given */
    size_t n;
};

/* One "[group]" of key/value pairs, the unit the rules are built from. */
struct bd_group {
    bool inject;
    char **kv; /* "key=value" */
    size_t n;
};
struct bd_groups {
    struct bd_group *v;
    size_t n;
};

/* Reads QEMU's INI-style config file path into g (appended). 0 or -errno
 * with err set in qemu-img's words. */
int bd_read_config(const char *path, struct bd_groups *g, bi_error *err);
/* Appends the groups the options "inject-error.N.KEY=V" and
 * "set-state.N.KEY=V" give (in N order); other keys are ignored. */
int bd_groups_from_opts(const char *const *opts, struct bd_groups *g,
                        bi_error *err);
/* Builds the rules of the groups: every inject-error group, then every
 * set-state group, as QEMU adds them. */
int bd_rules_build(const struct bd_groups *g, struct bd_rules *r,
                   bi_error *err);
void bd_groups_free(struct bd_groups *g);

#endif
