#define _GNU_SOURCE
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int test_passed, test_failed, test_skipped;

/* Line-buffered stdout: a test killed at its timeout still shows, under
 * ctest --output-on-failure, the last section it finished. */
__attribute__((constructor)) static void test_line_buffered(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
}

/* 77 is ctest's SKIP_RETURN_CODE (CMakeLists.txt): a test that left part of
 * itself out is reported as skipped, never as passed. */
int test_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", test_passed, test_failed, test_skipped);
    return test_failed ? 1 : test_skipped ? 77 : 0;
}

const char *test_asset(const char *rel) {
    static char buf[8][4096];
    static int slot;
    const char *root = getenv("DFLASH_SHARED");
    if (!root) root = "../shared";
    char *p = buf[slot++ % 8];
    snprintf(p, 4096, "%s/assets/%s", root, rel);
    if (access(p, R_OK) == 0) return p;
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) {
        test_failed++;
        fprintf(stderr, "FAIL: asset %s missing (required under CI)\n", p);
    } else {
        test_skipped++;
        fprintf(stderr, "skip: asset %s missing\n", p);
    }
    return NULL;
}

const char *test_tmpdir(void) {
    static char buf[8][256];
    static int slot;
    char *p = buf[slot++ % 8];
    snprintf(p, 256, "/tmp/dflash-test-XXXXXX");
    if (!mkdtemp(p)) {
        perror("mkdtemp");
        exit(2);
    }
    return p;
}

void test_rmdir(const char *dir) {
    char cmd[512];
    if (strncmp(dir, "/tmp/dflash-test-", 17) != 0) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

int test_make_pair(const char *dir, const char *target_flags, char *model, char *draft) {
    const char *src = getenv("DFLASH_SRC");
    if (!src) src = "..";
    char cmd[4096], py[512];
    /* the tools need the project venv (gguf, safetensors); ctest passes its python */
    if (getenv("DFLASH_PYTHON")) snprintf(py, sizeof py, "%s", getenv("DFLASH_PYTHON"));
    else snprintf(py, sizeof py, "%s/build/venv/bin/python", src);
    snprintf(model, 512, "%s/target", dir);
    snprintf(draft, 512, "%s/drafter", dir);
    snprintf(cmd, sizeof cmd,
             "%s %s/tools/make_checkpoint.py %s --quiet --out %s && "
             "%s %s/tools/make_checkpoint.py --drafter --target %s --layers 2 --block-size 16 "
             "--quiet --out %s", py, src, target_flags, model, py, src, model, draft);
    if (system(cmd) == 0) return 0;
    test_failed++;
    fprintf(stderr, "FAIL: could not make the random checkpoints: %s\n", cmd);
    return -1;
}
