/* SPDX-License-Identifier: MIT */
/*
 * blkdebug's rules: read from QEMU's INI-style config file and from the
 * "inject-error.N.KEY" / "set-state.N.KEY" options, checked as QEMU 7.2
 * checks them (its messages), then built into struct bd_rule.
 *
 * The file syntax is QEMU's qemu_config_parse, quirks included: a line
 * is "[group]" (or '[group "id"]'), or a key: its first word, whose value
 * is what stands between double quotes after "=" (a line without that
 * quoted value sets the key to ""; "key=\"v\"" without blanks is one
 * word, an unknown key). Empty lines and lines starting with '#' are
 * skipped.
 */
#include "filter/blkdebug.h"
#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum bd_type { T_STR, T_NUM, T_BOOL };
struct bd_key {
    const char *name;
    enum bd_type type;
    bool inject, set_state; /* groups that take the key */
};
static const struct bd_key bd_keys[] = {
    {"event", T_STR, true, true},         {"state", T_NUM, true, true},
    {"iotype", T_STR, true, false},       {"errno", T_NUM, true, false},
    {"sector", T_NUM, true, false},       {"once", T_BOOL, true, false},
    {"immediately", T_BOOL, true, false}, {"new_state", T_NUM, false, true},
};
static const char *const iotype_names[BD_IO__MAX] = {
    "read", "write", "write-zeroes", "discard", "flush", "block-status"};

/* QEMU's number options: strtou64 rules, any base, negatives wrap. */
static bool parse_num(const char *v, uint64_t *out)
{
    char *end;
    while (isspace((unsigned char)*v))
        v++;
    if (!*v)
        return false;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end)
        return false;
    *out = x;
    return true;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *const on[] = {"on", "yes", "true", "y"};
    static const char *const off[] = {"off", "no", "false", "n"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(v, on[i]) || !strcmp(v, off[i])) {
            *out = !strcmp(v, on[i]);
            return true;
        }
    }
    return false;
}

/* Adds key=value to group grp, refusing what qemu_opt_set refuses. */
static int group_set(struct bd_group *grp, const char *key, const char *value,
                     bi_error *err)
{
    const struct bd_key *k = NULL;
    for (size_t i = 0; i < sizeof(bd_keys) / sizeof(bd_keys[0]); i++)
        if (!strcmp(bd_keys[i].name, key) &&
            (grp->inject ? bd_keys[i].inject : bd_keys[i].set_state))
            k = &bd_keys[i];
    uint64_t num;
    bool b;
    if (!k) {
        bi_error_set(err, 0, "Invalid parameter '%s'", key);
        return -EINVAL;
    }
    if (k->type == T_NUM && !parse_num(value, &num)) {
        bi_error_set(err, 0, "Parameter '%s' expects a number", key);
        return -EINVAL;
    }
    if (k->type == T_BOOL && !parse_bool(value, &b)) {
        bi_error_set(err, 0, "Parameter '%s' expects 'on' or 'off'", key);
        return -EINVAL;
    }
    grp->kv = realloc(grp->kv, sizeof(char *) * (grp->n + 1));
    if (!grp->kv)
        bi_out_of_memory(sizeof(char *) * (grp->n + 1));
    grp->kv[grp->n++] = bi_xasprintf("%s=%s", key, value);
    return 0;
}

static struct bd_group *group_add(struct bd_groups *g, bool inject)
{
    g->v = realloc(g->v, sizeof(*g->v) * (g->n + 1));
    if (!g->v)
        bi_out_of_memory(sizeof(*g->v) * (g->n + 1));
    g->v[g->n] = (struct bd_group){.inject = inject};
    return &g->v[g->n++];
}

/* A "[...]" line: the group's name, else NULL (not a group line). */
static char *group_name(const char *line)
{
    if (line[0] != '[')
        return NULL;
    size_t l = strcspn(line + 1, "] \t\n\"");
    if (l == 0 || l > 63)
        return NULL;
    const char *e = line + 1 + l;
    if (*e == ' ' && strchr(e, '"') && strchr(e, ']'))
        return bi_xasprintf("%.*s", (int)l, line + 1);
    if (*e != ']')
        l = strcspn(line + 1, "]"); /* QEMU's %[^]]: blanks included */
    if (line[1 + l] != ']')
        return NULL;
    return bi_xasprintf("%.*s", (int)l, line + 1);
}

/* A key line: its first word into key, the quoted value (or "") into
 * value. false for a blank line. */
static bool key_line(const char *line, char *key, char *value)
{
    const char *p = line;
    while (isspace((unsigned char)*p))
        p++;
    size_t l = 0;
    while (p[l] && !isspace((unsigned char)p[l]) && l < 63)
        l++;
    if (!l)
        return false;
    memcpy(key, p, l);
    key[l] = 0;
    value[0] = 0;
    p += l;
    while (isspace((unsigned char)*p))
        p++;
    if (*p++ != '=')
        return true;
    while (isspace((unsigned char)*p))
        p++;
    if (*p++ != '"')
        return true;
    size_t vl = strcspn(p, "\"");
    if (vl && vl <= 1023 && p[vl] == '"') {
        memcpy(value, p, vl);
        value[vl] = 0;
    }
    return true;
}

/* One line of the file into g (cur: the group being filled). */
static int config_line(const char *line, struct bd_groups *g,
                       struct bd_group **cur, bi_error *err)
{
    char key[64], value[1024];
    if (line[0] == '\n' || line[0] == '#' || !line[0])
        return 0;
    char *grp = group_name(line);
    if (grp) {
        bool inject = !strcmp(grp, "inject-error");
        if (!inject && strcmp(grp, "set-state")) {
            bi_error_set(err, 0, "There is no option group '%s'", grp);
            free(grp);
            return -EINVAL;
        }
        free(grp);
        *cur = group_add(g, inject);
        return 0;
    }
    if (!key_line(line, key, value)) {
        bi_error_set(err, 0, "parse error");
        return -EINVAL;
    }
    if (!*cur) {
        bi_error_set(err, 0, "no group defined");
        return -EINVAL;
    }
    return group_set(*cur, key, value, err);
}

int bd_read_config(const char *path, struct bd_groups *g, bi_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        bi_error_set(err, e, "Could not read blkdebug config file");
        return -e;
    }
    char line[1024];
    struct bd_group *cur = NULL;
    int ret = 0;
    while (ret == 0 && fgets(line, sizeof(line), f)) {
        ret = config_line(line, g, &cur, err);
        if (cur) /* group_add may move the array */
            cur = &g->v[g->n - 1];
    }
    fclose(f);
    return ret;
}

/* "inject-error.N.KEY=V": the group kind, N and KEY=V; false for other
 * options. */
static bool opt_rule_key(const char *opt, bool *inject, unsigned long *idx,
                         const char **kv)
{
    const char *p;
    if (!strncmp(opt, "inject-error.", 13))
        p = opt + 13, *inject = true;
    else if (!strncmp(opt, "set-state.", 10))
        p = opt + 10, *inject = false;
    else
        return false;
    char *end;
    *idx = strtoul(p, &end, 10);
    if (end == p || *end != '.')
        return false;
    *kv = end + 1;
    return true;
}

int bd_groups_from_opts(const char *const *opts, struct bd_groups *g,
                        bi_error *err)
{
    for (int pass = 0; pass < 2; pass++) {
        /* groups in index order: indices are small */
        for (unsigned long want = 0;; want++) {
            bool any_left = false, found = false;
            struct bd_group *grp = NULL;
            for (const char *const *o = opts; o && *o; o++) {
                bool inject;
                unsigned long idx;
                const char *kv;
                if (!opt_rule_key(*o, &inject, &idx, &kv) ||
                    inject != (pass == 0) || idx < want)
                    continue;
                any_left = true;
                if (idx != want)
                    continue;
                if (!found)
                    grp = group_add(g, inject);
                found = true;
                char *key = bi_xstrdup(kv);
                char *eq = strchr(key, '=');
                if (eq)
                    *eq = 0;
                int ret = group_set(grp, key, eq ? eq + 1 : "on", err);
                free(key);
                if (ret < 0)
                    return ret;
            }
            if (!any_left)
                break;
        }
    }
    return 0;
}

static const char *group_get(const struct bd_group *grp, const char *key)
{
    size_t kl = strlen(key);
    const char *v = NULL;
    for (size_t i = 0; i < grp->n; i++)
        if (!strncmp(grp->kv[i], key, kl) && grp->kv[i][kl] == '=')
            v = grp->kv[i] + kl + 1;
    return v;
}

static uint64_t group_num(const struct bd_group *grp, const char *key,
                          uint64_t def)
{
    const char *v = group_get(grp, key);
    uint64_t x = def;
    if (v)
        parse_num(v, &x);
    return x;
}

static bool group_bool(const struct bd_group *grp, const char *key)
{
    const char *v = group_get(grp, key);
    bool b = false;
    if (v)
        parse_bool(v, &b);
    return b;
}

/* The inject-error part of a rule: errno (EIO), sector, once,
 * immediately, iotype (default: all but block-status, as QEMU). */
static int build_inject(const struct bd_group *grp, struct bd_rule *r,
                        bi_error *err)
{
    r->error = (int)group_num(grp, "errno", EIO);
    uint64_t sector = group_num(grp, "sector", UINT64_MAX);
    r->offset = sector == UINT64_MAX ? UINT64_MAX : sector * 512;
    r->once = group_bool(grp, "once");
    r->immediately = group_bool(grp, "immediately");
    const char *io = group_get(grp, "iotype");
    if (!io) {
        r->iotype_mask = (1u << BD_IO_BLOCK_STATUS) - 1;
        return 0;
    }
    for (int i = 0; i < BD_IO__MAX; i++)
        if (!strcmp(io, iotype_names[i]))
            r->iotype_mask = 1u << i;
    if (!r->iotype_mask) {
        bi_error_set(err, 0, "invalid parameter value: %s", io);
        return -EINVAL;
    }
    return 0;
}

static int build_rule(const struct bd_group *grp, struct bd_rule *r,
                      bi_error *err)
{
    const char *ev = group_get(grp, "event");
    memset(r, 0, sizeof(*r));
    if (!ev) {
        bi_error_set(err, 0, "Missing event name for rule");
        return -EINVAL;
    }
    r->event = bi_debug_event_lookup(ev);
    if (r->event < 0) {
        bi_error_set(err, 0, "invalid parameter value: %s", ev);
        return -EINVAL;
    }
    r->inject = grp->inject;
    r->state = (int64_t)group_num(grp, "state", 0);
    if (!r->inject) {
        r->new_state = (int64_t)group_num(grp, "new_state", 0);
        return 0;
    }
    return build_inject(grp, r, err);
}

int bd_rules_build(const struct bd_groups *g, struct bd_rules *r, bi_error *err)
{
    r->v = bi_xzalloc(sizeof(*r->v) * (g->n + 1));
    r->n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < g->n; i++) {
            if (g->v[i].inject != (pass == 0))
                continue;
            int ret = build_rule(&g->v[i], &r->v[r->n], err);
            if (ret < 0)
                return ret;
            r->n++;
        }
    }
    return 0;
}

void bd_groups_free(struct bd_groups *g)
{
    for (size_t i = 0; i < g->n; i++) {
        for (size_t k = 0; k < g->v[i].n; k++)
            free(g->v[i].kv[k]);
        free(g->v[i].kv);
    }
    free(g->v);
    g->v = NULL;
    g->n = 0;
}
