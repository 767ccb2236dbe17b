/* SPDX-License-Identifier: MIT */
/* What every filter (a protocol node passing requests on to its own file
 * child, docs/architecture.md "Filters") does the same way. */
#ifndef BI_FILTER_H
#define BI_FILTER_H

#include "block/block.h"

/* The value of the last "key=value" among o->protocol_opts, or NULL. */
const char *bi_filter_opt(const struct bi_open_opts *o, const char *key);
/* s with every ',' doubled, for an option list (malloc'd). */
char *bi_filter_escape(const char *s);
/* Pass-throughs to n->file for the driver table. */
int bi_filter_set_perm(bi_node *n, unsigned perm, unsigned shared,
                       bi_error *err);
int64_t bi_filter_allocated_size(bi_node *n);
/* Resizes n->file (-ENOTSUP if it cannot) and takes its new size. */
int bi_filter_truncate(bi_node *n, uint64_t size, bool exact,
                       enum bi_prealloc prealloc, bi_error *err);

#endif
