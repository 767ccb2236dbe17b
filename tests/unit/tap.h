/* SPDX-License-Identifier: MIT */
/*
 * A tiny TAP producer for unit tests: each check prints "ok N - what" or
 * "not ok N - what" (with a diagnostic line naming file:line), and
 * tap_done() prints the plan "1..N" and returns the exit status (non-zero
 * if any check failed), so `return tap_done();` ends main().
 */
#ifndef BI_TAP_H
#define BI_TAP_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_count;
static int tap_failed;

__attribute__((format(printf, 4, 5), unused)) static bool
tap_check(bool cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    tap_count++;
    printf("%s %d - ", cond ? "ok" : "not ok", tap_count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond) {
        tap_failed++;
        printf("#   failed at %s:%d\n", file, line);
    }
    fflush(stdout);
    return cond;
}

#define ok(cond, ...) tap_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* Integer equality with both values in the diagnostics. */
#define is_int(got, want, ...)                                                 \
    do {                                                                       \
        int64_t tap_g_ = (int64_t)(got), tap_w_ = (int64_t)(want);             \
        if (!ok(tap_g_ == tap_w_, __VA_ARGS__)) {                              \
            printf("#   got %" PRId64 ", want %" PRId64 "\n", tap_g_, tap_w_); \
        }                                                                      \
    } while (0)

#define is_uint(got, want, ...)                                                \
    do {                                                                       \
        uint64_t tap_g_ = (uint64_t)(got), tap_w_ = (uint64_t)(want);          \
        if (!ok(tap_g_ == tap_w_, __VA_ARGS__)) {                              \
            printf("#   got %" PRIu64 ", want %" PRIu64 "\n", tap_g_, tap_w_); \
        }                                                                      \
    } while (0)

#define is_str(got, want, ...)                                                 \
    do {                                                                       \
        const char *tap_g_ = (got), *tap_w_ = (want);                          \
        bool tap_eq_ =                                                         \
            tap_g_ && tap_w_ ? strcmp(tap_g_, tap_w_) == 0 : tap_g_ == tap_w_; \
        if (!ok(tap_eq_, __VA_ARGS__)) {                                       \
            printf("#   got  [%s]\n#   want [%s]\n",                           \
                   tap_g_ ? tap_g_ : "(null)", tap_w_ ? tap_w_ : "(null)");    \
        }                                                                      \
    } while (0)

/* Stops the test program: for setup failures that make the rest moot. */
#define tap_bail(...)                                                          \
    do {                                                                       \
        printf("Bail out! ");                                                  \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        exit(1);                                                               \
    } while (0)

__attribute__((unused)) static int tap_done(void)
{
    printf("1..%d\n", tap_count);
    if (tap_failed) {
        printf("# %d of %d checks failed\n", tap_failed, tap_count);
    }
    return tap_failed ? 1 : 0;
}

#endif
