/* SPDX-License-Identifier: MIT */
/*
 * What the registered drivers offer, read from their tables: the merged
 * creation option list in qemu-img's order (its "Formatting" line), option
 * lookups, capabilities, runtime options. The orders are those qemu-img
 * 7.2 prints.
 */
#include "blkimg/blkimg.h"
#include "tap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The merged list of format (with the protocol's) as "a b c". */
/* Whether the option list v (n entries) has name. */
static bool has_opt(const struct bi_opt_desc **v, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        if (!strcmp(v[i]->name, name))
            return true;
    }
    return false;
}

static char *names(const char *format)
{
    const struct bi_opt_desc **v;
    int n;
    static char buf[1024];
    buf[0] = 0;
    if (bi_create_opt_list(format, true, &v, &n) < 0)
        return NULL;
    for (int i = 0; i < n; i++) {
        strcat(buf, i ? " " : "");
        strcat(buf, v[i]->name);
    }
    free(v);
    return buf;
}

int main(void)
{
    is_str(names("raw"), "size nocow preallocation extent_size_hint",
           "raw: its size, then the file protocol's options");
    is_str(names("qcow2"),
           "encryption encrypt.format encrypt.key-secret encrypt.cipher-alg "
           "encrypt.cipher-mode encrypt.ivgen-alg encrypt.ivgen-hash-alg "
           "encrypt.hash-alg encrypt.iter-time cluster_size extended_l2 "
           "preallocation compression_type size compat backing_file "
           "backing_fmt data_file data_file_raw lazy_refcounts refcount_bits "
           "nocow extent_size_hint",
           "qcow2: QEMU's order, the protocol's new names appended");
    ok(names("nosuch") == NULL, "unknown format: -ENOENT");

    const struct bi_opt_desc **v;
    int n;
    ok(bi_create_opt_list("raw", false, &v, &n) == 0 && n == 1, "raw alone");
    free(v);

    const struct bi_opt_desc *d = bi_create_opt_find("qcow2", "cluster_size");
    ok(d && d->type == BI_OPT_SIZE && d->def && !strcmp(d->def, "65536"),
       "qcow2 cluster_size: a size, default 65536");
    d = bi_create_opt_find("qcow2", "preallocation");
    ok(d && strstr(d->help, "metadata"),
       "the format's preallocation wins over the protocol's");
    ok(bi_create_opt_find("raw", "extent_size_hint") != NULL,
       "protocol options count for the format");
    ok(bi_create_opt_find("raw", "cluster_size") == NULL, "unknown key");
    is_str(bi_opt_type_name(BI_OPT_BOOL), "bool (on/off)", "bool type name");
    is_str(bi_opt_type_name(BI_OPT_NUMBER), "num", "number type name");

    int q = bi_format_caps("qcow2"), r = bi_format_caps("raw");
    ok((q & (BI_FORMAT_BACKING | BI_FORMAT_COMPRESS | BI_FORMAT_SNAPSHOTS |
             BI_FORMAT_BITMAPS | BI_FORMAT_AMEND | BI_FORMAT_MEASURE)) ==
           (BI_FORMAT_BACKING | BI_FORMAT_COMPRESS | BI_FORMAT_SNAPSHOTS |
            BI_FORMAT_BITMAPS | BI_FORMAT_AMEND | BI_FORMAT_MEASURE),
       "qcow2 capabilities");
    ok((r & (BI_FORMAT_CREATE | BI_FORMAT_MEASURE)) ==
               (BI_FORMAT_CREATE | BI_FORMAT_MEASURE) &&
           !(r & (BI_FORMAT_BACKING | BI_FORMAT_COMPRESS | BI_FORMAT_AMEND |
                  BI_FORMAT_PROTOCOL)),
       "raw capabilities");
    ok(bi_format_caps("file") & BI_FORMAT_PROTOCOL, "file is a protocol");
    ok(bi_format_caps("nosuch") == -ENOENT, "unknown: -ENOENT");
    ok(bi_format_caps("cloop") == 0, "recognised only: no capabilities");
    {
        const struct bi_opt_desc **al;
        int an = 0;
        ok(bi_amend_opt_list("qcow2", &al, &an) == 0 && an > 0 &&
               has_opt(al, an, "compat"),
           "qcow2 amend options listed (%d)", an);
        free(al);
        ok(bi_amend_opt_list("raw", &al, &an) == -ENOTSUP && !al && !an,
           "raw cannot amend");
    }

    d = bi_runtime_opt_find("qcow2", "encrypt.key-secret");
    ok(d && d->type == BI_OPT_STRING && (d->flags & BI_OPT_STRONG) &&
           !(d->flags & BI_OPT_REFUSED),
       "qcow2 encrypt.key-secret: a strong option");
    d = bi_runtime_opt_find("qcow2", "backing.encrypt.key-secret");
    ok(d && !(d->flags & BI_OPT_REFUSED), "qcow2 backing's key secret");
    d = bi_runtime_opt_find("qcow2", "l2-cache-size");
    ok(d && d->type == BI_OPT_SIZE && !(d->flags & BI_OPT_REFUSED),
       "qcow2 l2-cache-size: a size");
    ok(bi_runtime_opt_find("qcow2", "bogus") == NULL, "unknown runtime key");
    d = bi_runtime_opt_find("raw", "offset");
    ok(d && d->type == BI_OPT_SIZE && !(d->flags & BI_OPT_REFUSED),
       "raw offset: a size, taken");

    int formats = 0, protocols = 0; /* that open images */
    for (int i = 0; bi_driver_name(i); i++) {
        int caps = bi_format_caps(bi_driver_name(i));
        if (caps & BI_FORMAT_PROTOCOL)
            protocols++;
        else if (caps & BI_FORMAT_OPEN)
            formats++;
    }
    ok(formats >= 2 && protocols >= 1 && bi_driver_name(-1) == NULL,
       "the registry lists formats and protocols");
    return tap_done();
}
