/* SPDX-License-Identifier: MIT */
/*
 * qcow2 metadata cache: L2 tables and refcount blocks, one cluster each,
 * write-back, LRU replacement, hashed by host offset. Every call runs with
 * s->lock held, so entries never change under a caller; a caller pins an
 * entry (get) until it puts it back.
 */
#include "qcow2.h"
#include "util/util.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static unsigned cache_hash(const struct qcow2_cache *c, uint64_t offset)
{
    uint64_t h = (offset >> 9) * 0x9e3779b97f4a7c15ULL;
    return (unsigned)(h >> 32) & (unsigned)(c->nbuckets - 1);
}

static unsigned ptr_hash(const struct qcow2_cache *c, const void *p)
{
    uint64_t h = ((uintptr_t)p >> 9) * 0x9e3779b97f4a7c15ULL;
    return (unsigned)(h >> 32) & (unsigned)(c->nbuckets - 1);
}

int qc_cache_init(struct qcow2_cache *c, const char *name, int entries)
{
    memset(c, 0, sizeof(*c));
    c->name = name;
    if (entries < 4)
        entries = 4;
    c->n = entries;
    c->e = calloc((size_t)entries, sizeof(*c->e));
    c->nbuckets = 16;
    while (c->nbuckets < entries * 2)
        c->nbuckets <<= 1;
    c->buckets = malloc(sizeof(int) * (size_t)c->nbuckets);
    c->pbuckets = malloc(sizeof(int) * (size_t)c->nbuckets);
    if (!c->e || !c->buckets || !c->pbuckets) {
        free(c->e);
        free(c->buckets);
        free(c->pbuckets);
        c->pbuckets = NULL;
        c->e = NULL;
        c->buckets = NULL;
        return -ENOMEM;
    }
    for (int i = 0; i < c->nbuckets; i++)
        c->buckets[i] = c->pbuckets[i] = -1;
    for (int i = 0; i < entries; i++)
        c->e[i].hnext = c->e[i].pnext = -1;
    bi_co_queue_init(&c->waiters);
    return 0;
}

void qc_cache_destroy(struct qcow2_cache *c)
{
    if (!c->e)
        return;
    for (int i = 0; i < c->n; i++)
        bi_free_aligned(c->e[i].table);
    free(c->e);
    free(c->buckets);
    free(c->pbuckets);
    c->e = NULL;
    c->buckets = NULL;
    c->pbuckets = NULL;
}

static int cache_find(const struct qcow2_cache *c, uint64_t offset)
{
    for (int i = c->buckets[cache_hash(c, offset)]; i >= 0; i = c->e[i].hnext)
        if (c->e[i].offset == offset)
            return i;
    return -1;
}

static void cache_unhash(struct qcow2_cache *c, int idx)
{
    int *p = &c->buckets[cache_hash(c, c->e[idx].offset)];
    while (*p >= 0) {
        if (*p == idx) {
            *p = c->e[idx].hnext;
            break;
        }
        p = &c->e[*p].hnext;
    }
    c->e[idx].hnext = -1;
    c->e[idx].offset = 0;
}

static void cache_hash_insert(struct qcow2_cache *c, int idx, uint64_t off)
{
    unsigned h = cache_hash(c, off);
    c->e[idx].offset = off;
    c->e[idx].hnext = c->buckets[h];
    c->buckets[h] = idx;
}

/* Before L2 tables go to disk, the refcounts of every cluster they point
 * to must be on disk. */
static int l2_dependency(bi_node *n)
{
    qcow2_state *s = n->opaque;
    if ((s->compat & QCOW2_COMPAT_LAZY_REFCOUNTS) && !s->check_mode) {
        /* lazy refcounts: the dirty bit stands in for the ordering; an
         * unclean shutdown makes the next writer rebuild the counts */
        if (!(s->incompat & QCOW2_INCOMPAT_DIRTY)) {
            int r = qc_update_incompat(n, s->incompat | QCOW2_INCOMPAT_DIRTY);
            if (r < 0)
                return r;
            s->marked_dirty = true;
        }
        return 0;
    }
    int ret = qc_cache_writeback(n, &s->rb_cache);
    if (ret < 0)
        return ret;
    if (s->rb_written_unflushed) {
        ret = bi_co_flush(n->file);
        if (ret < 0)
            return ret;
        s->rb_written_unflushed = false;
    }
    return 0;
}

static int cache_write_entry(bi_node *n, struct qcow2_cache *c, int idx)
{
    qcow2_state *s = n->opaque;
    struct qcow2_cache_entry *e = &c->e[idx];
    int ret;
    bool is_l2 = c == &s->l2_cache;

    if (!e->dirty)
        return 0;
    if (is_l2) {
        ret = l2_dependency(n);
        if (ret < 0)
            return ret;
    }
    ret = qc_check_overlap(n, is_l2 ? QC_OL_L2 : QC_OL_REFBLOCK, e->offset,
                           s->cluster_size);
    if (ret < 0)
        return ret;
    bi_debug_event(n->file,
                   is_l2 ? BI_DBG_L2_UPDATE : BI_DBG_REFBLOCK_UPDATE_PART);
    ret = bi_co_pwrite(n->file, e->offset, e->table, s->cluster_size, 0);
    if (ret < 0)
        return ret;
    e->dirty = false;
    if (!is_l2)
        s->rb_written_unflushed = true;
    return 0;
}

int qc_cache_writeback(bi_node *n, struct qcow2_cache *c)
{
    qcow2_state *s = n->opaque;
    int result = 0;
    if (!c->e)
        return 0;
    if (c == &s->l2_cache && qc_cache_has_dirty(c)) {
        int ret = l2_dependency(n);
        if (ret < 0)
            return ret;
    }
    for (int i = 0; i < c->n; i++) {
        if (c->e[i].offset && c->e[i].dirty) {
            int ret = cache_write_entry(n, c, i);
            if (ret < 0 && result == 0)
                result = ret;
        }
    }
    return result;
}

bool qc_cache_has_dirty(const struct qcow2_cache *c)
{
    if (!c->e)
        return false;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].offset && c->e[i].dirty)
            return true;
    return false;
}

int qc_cache_get(bi_node *n, struct qcow2_cache *c, uint64_t offset, bool fresh,
                 void **table)
{
    qcow2_state *s = n->opaque;
    int idx = cache_find(c, offset);
    int ret;

    if (idx >= 0) {
        struct qcow2_cache_entry *e = &c->e[idx];
        if (fresh)
            memset(e->table, 0, s->cluster_size);
        e->ref++;
        e->lru = ++c->clock;
        *table = e->table;
        return 0;
    }

    for (;;) {
        /* free slot, else least recently used unpinned one */
        int victim = -1;
        for (int i = 0; i < c->n; i++) {
            if (c->e[i].ref)
                continue;
            if (!c->e[i].offset) {
                victim = i;
                break;
            }
            if (victim < 0 || c->e[i].lru < c->e[victim].lru)
                victim = i;
        }
        if (victim < 0)
            return -ENOMEM; /* every entry pinned: a driver bug */
        struct qcow2_cache_entry *e = &c->e[victim];
        if (e->offset && e->dirty) {
            e->ref++; /* pin while writing */
            ret = cache_write_entry(n, c, victim);
            e->ref--;
            if (ret < 0)
                return ret;
            if (e->ref || e->dirty)
                continue;
        }
        if (e->offset)
            cache_unhash(c, victim);
        if (!e->table) {
            e->table = bi_blockalign(n->file, s->cluster_size);
            if (!e->table)
                return -ENOMEM;
            unsigned ph = ptr_hash(c, e->table);
            e->pnext = c->pbuckets[ph];
            c->pbuckets[ph] = victim;
        }
        if (cache_find(c, offset) >= 0)
            return qc_cache_get(n, c, offset, fresh, table);
        cache_hash_insert(c, victim, offset);
        e->ref = 1;
        e->dirty = false;
        e->lru = ++c->clock;
        if (fresh) {
            memset(e->table, 0, s->cluster_size);
        } else {
            if (c == &s->l2_cache)
                bi_debug_event(n->file, BI_DBG_L2_LOAD);
            ret = bi_co_pread(n->file, offset, e->table, s->cluster_size);
            if (ret < 0) {
                e->ref = 0;
                cache_unhash(c, victim);
                return ret;
            }
        }
        *table = e->table;
        return 0;
    }
}

static int cache_index_of(const struct qcow2_cache *c, const void *table)
{
    for (int i = c->pbuckets[ptr_hash(c, table)]; i >= 0; i = c->e[i].pnext)
        if (c->e[i].table == table)
            return c->e[i].offset ? i : -1;
    return -1;
}

void qc_cache_put(struct qcow2_cache *c, void *table)
{
    int i = cache_index_of(c, table);
    if (i >= 0 && c->e[i].ref > 0)
        c->e[i].ref--;
}

void qc_cache_mark_dirty(struct qcow2_cache *c, void *table)
{
    int i = cache_index_of(c, table);
    if (i >= 0)
        c->e[i].dirty = true;
}

void qc_cache_discard(struct qcow2_cache *c, uint64_t offset)
{
    if (!c->e)
        return;
    int i = cache_find(c, offset);
    if (i >= 0 && c->e[i].ref == 0) {
        c->e[i].dirty = false;
        cache_unhash(c, i);
    } else if (i >= 0) {
        c->e[i].dirty = false;
    }
}

void qc_cache_drop_all(struct qcow2_cache *c)
{
    if (!c->e)
        return;
    for (int i = 0; i < c->n; i++) {
        if (c->e[i].offset && !c->e[i].ref) {
            c->e[i].dirty = false;
            cache_unhash(c, i);
        }
    }
}
