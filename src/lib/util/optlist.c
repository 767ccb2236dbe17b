/* SPDX-License-Identifier: MIT */
/*
 * "-o" option lists as qemu parses them: "key=value" items separated by
 * ',', where ",," inside a value stands for one ','. A key ends at the first
 * '=' or ','; an item without '=' is a bare key (qemu reads "key" as
 * key=on and "nokey" as key=off; that interpretation is left to callers).
 */
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* qemu-img's own check on each -o argument: not empty, not starting with
 * ',', and not ending in an odd number of commas (a dangling separator). */
static bool valid_list(const char *s)
{
    size_t len = strlen(s), i;

    if (s[0] == '\0' || s[0] == ',') {
        return false;
    }
    for (i = len; i > 0 && s[i - 1] == ','; i--) {
    }
    return (len - i) % 2 == 0;
}

static void push(struct bi_optlist *l, char *key, char *value)
{
    struct bi_opt *v = realloc(l->v, (size_t)(l->n + 1) * sizeof(*v));

    if (!v)
        bi_out_of_memory((size_t)(l->n + 1) * sizeof(*v));
    l->v = v;
    l->v[l->n].key = key;
    l->v[l->n].value = value;
    l->n++;
}

int bi_optlist_add(struct bi_optlist *l, const char *item)
{
    size_t klen = strcspn(item, "=");

    if (klen == 0) {
        return -EINVAL;
    }
    char *key = bi_xmalloc(klen + 1);
    memcpy(key, item, klen);
    key[klen] = '\0';
    push(l, key, item[klen] ? bi_xstrdup(item + klen + 1) : NULL);
    return 0;
}

int bi_optlist_parse(struct bi_optlist *l, const char *s)
{
    const char *p = s;

    if (!s || !valid_list(s)) {
        return -EINVAL;
    }
    while (*p) {
        size_t klen = strcspn(p, "=,");
        char *key = bi_xmalloc(klen + 1);
        char *value = NULL;

        memcpy(key, p, klen);
        key[klen] = '\0';
        p += klen;
        if (*p == '=') {
            /* Value: up to a single ',', with ",," unescaped to ','. */
            size_t n = 0;

            p++;
            value = bi_xmalloc(strlen(p) + 1);
            while (*p) {
                if (*p == ',') {
                    if (p[1] != ',') {
                        break;
                    }
                    p++;
                }
                value[n++] = *p++;
            }
            value[n] = '\0';
        }
        push(l, key, value);
        if (*p == ',') {
            p++;
        }
    }
    return 0;
}

const char *bi_optlist_get(const struct bi_optlist *l, const char *key)
{
    /* The last occurrence wins, as with repeated qemu options; bare keys
     * read as qemu reads them: "key" is "on", "nokey" is "off". */
    for (int i = l->n - 1; i >= 0; i--) {
        const struct bi_opt *o = &l->v[i];

        if (o->value) {
            if (strcmp(o->key, key) == 0) {
                return o->value;
            }
        } else if (strcmp(o->key, key) == 0) {
            return "on";
        } else if (strncmp(o->key, "no", 2) == 0 &&
                   strcmp(o->key + 2, key) == 0) {
            return "off";
        }
    }
    return NULL;
}

void bi_optlist_free(struct bi_optlist *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].key);
        free(l->v[i].value);
    }
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

const char *bi_opts_value(const char *const *opts, const char *key)
{
    size_t kl = strlen(key);
    const char *v = NULL;
    for (const char *const *p = opts; p && *p; p++) {
        if (!strncmp(*p, key, kl) && (*p)[kl] == '=') {
            v = *p + kl + 1;
        }
    }
    return v;
}
