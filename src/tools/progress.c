/* SPDX-License-Identifier: MIT */
/*
 * Progress reporting for long-running copies.
 *
 * BI_PROGRESS_QEMU reproduces qemu-img's -p output exactly: a float
 * percentage, printed as "    (%3.2f/100%)\r" whenever it advanced more
 * than min_skip since the last print, or is 0 or 100; "\n" at the end.
 * The bar and JSON modes are extensions for humans and pipelines.
 */
#include "progress.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int bi_progress_parse(const char *s, enum bi_progress_mode *out)
{
    if (!strcmp(s, "qemu") || !strcmp(s, "percent")) {
        *out = BI_PROGRESS_QEMU;
    } else if (!strcmp(s, "bar")) {
        *out = BI_PROGRESS_BAR;
    } else if (!strcmp(s, "json")) {
        *out = BI_PROGRESS_JSON;
    } else if (!strcmp(s, "none")) {
        *out = BI_PROGRESS_NONE;
    } else {
        return -EINVAL;
    }
    return 0;
}

void bi_progress_init(struct bi_progress *p, enum bi_progress_mode mode,
                      float min_skip, const char *op)
{
    memset(p, 0, sizeof(*p));
    p->mode = mode;
    p->out = stdout;
    p->min_skip = min_skip;
    p->start_ns = now_ns();
    p->op = op ? op : "copy";
}

static void fmt_rate(double bps, char *buf, size_t len)
{
    char s[32];
    bi_format_size((uint64_t)bps, s, sizeof(s));
    snprintf(buf, len, "%s/s", s);
}

static void print_bar(struct bi_progress *p, bool final)
{
    uint64_t t = now_ns();
    if (!final && p->current != 0 && t - p->last_ns < 100000000ULL) {
        return;
    }
    p->last_ns = t;
    double el = (double)(t - p->start_ns) / 1e9;
    double rate = el > 0 ? (double)p->done / el : 0;
    char r[48], eta[32];
    fmt_rate(rate, r, sizeof(r));
    if (final) {
        snprintf(eta, sizeof(eta), "%.1fs", el);
    } else if (rate > 0 && p->total > p->done) {
        double left = (double)(p->total - p->done) / rate;
        snprintf(eta, sizeof(eta), "%02d:%02d:%02d left", (int)(left / 3600),
                 (int)(left / 60) % 60, (int)left % 60);
    } else {
        snprintf(eta, sizeof(eta), "--:--:-- left");
    }
    int width = 40;
    int fill = (int)(p->current / 100.0f * (float)width);
    char bar[64];
    for (int i = 0; i < width; i++) {
        bar[i] = i < fill ? '#' : '-';
    }
    bar[width] = 0;
    fprintf(p->out, "\r[%s] %6.2f%% %12s %s   ", bar, (double)p->current, r,
            eta);
    fflush(p->out);
}

static void print_json(struct bi_progress *p, bool final)
{
    uint64_t t = now_ns();
    double el = (double)(t - p->start_ns) / 1e9;
    double rate = el > 0 ? (double)p->done / el : 0;
    fprintf(p->out,
            "{\"operation\": \"%s\", \"percent\": %.2f, \"done\": %" PRIu64
            ", \"total\": %" PRIu64
            ", \"elapsed\": %.3f, \"rate\": %.0f, \"status\": \"%s\"}\n",
            p->op, (double)p->current, p->done, p->total, el, rate,
            final ? "done" : "running");
    fflush(p->out);
}

static void do_print(struct bi_progress *p)
{
    switch (p->mode) {
    case BI_PROGRESS_NONE:
        break;
    case BI_PROGRESS_QEMU:
        fprintf(p->out, "    (%3.2f/100%%)\r", (double)p->current);
        fflush(p->out);
        break;
    case BI_PROGRESS_BAR:
        print_bar(p, false);
        break;
    case BI_PROGRESS_JSON:
        print_json(p, false);
        break;
    }
}

void bi_progress_print(struct bi_progress *p, float delta, int max)
{
    float current;

    if (max == 0) {
        current = delta;
    } else {
        current = p->current + delta / 100 * (float)max;
    }
    if (current > 100) {
        current = 100;
    }
    p->current = current;
    /* as QEMU: a move back by more than the step prints too */
    if (current > p->last_print + p->min_skip ||
        current < p->last_print - p->min_skip || current == 100 ||
        current == 0) {
        p->last_print = p->current;
        do_print(p);
    }
}

void bi_progress_bytes(struct bi_progress *p, uint64_t done, uint64_t total)
{
    p->done = done;
    p->total = total;
    if (total) {
        bi_progress_print(p, (float)(100.0 * (double)done / (double)total), 0);
    }
}

void bi_progress_end(struct bi_progress *p)
{
    switch (p->mode) {
    case BI_PROGRESS_NONE:
        break;
    case BI_PROGRESS_QEMU:
        fprintf(p->out, "\n");
        break;
    case BI_PROGRESS_BAR:
        print_bar(p, true);
        fprintf(p->out, "\n");
        break;
    case BI_PROGRESS_JSON:
        print_json(p, true);
        break;
    }
    fflush(p->out);
}

void bi_progress_convert_cb(void *opaque, uint64_t done, uint64_t total)
{
    bi_progress_bytes(opaque, done, total);
}
