/* testutil.h - a tiny harness: CHECK records a failure and goes on; main
 * returns test_summary(), which prints "N passed, N failed, N skipped" and
 * exits 77 (ctest's skip) when a missing asset left part of the test out. */
#ifndef DFL_TESTUTIL_H
#define DFL_TESTUTIL_H

#include <stdio.h>

extern int test_passed, test_failed, test_skipped;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            test_passed++;                                                 \
        } else {                                                           \
            test_failed++;                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

int test_summary(void);
/* Path of a third-party asset under ../shared/assets (DFLASH_SHARED). Returns
 * NULL when missing; under CI=true a missing asset counts as a failure. */
const char *test_asset(const char *rel);
/* A fresh temporary directory (removed by the caller with test_rmdir). */
const char *test_tmpdir(void);
void test_rmdir(const char *dir);
/* A random target (tools/make_checkpoint.py target_flags) in dir/target and a
 * 2-layer block-16 DFlash drafter for it in dir/drafter; model and draft
 * (512 bytes each) get the paths. Returns 0, or -1 after counting a failure. */
int test_make_pair(const char *dir, const char *target_flags, char *model, char *draft);

#endif
