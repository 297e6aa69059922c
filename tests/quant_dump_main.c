/* quant_dump_main.c - a helper for tests/test_quant_formats.py (not a test by
 * itself): converts raw files between f32 and a quantized block type with
 * dflash's own row functions, so an independent numpy reference can compare
 * the bits.
 *
 *   quant_dump dequant TYPE IN OUT   IN: whole blocks of TYPE; OUT: f32
 *   quant_dump quant TYPE IN OUT     IN: f32 (a block multiple); OUT: blocks
 *
 * Exit status 0 on success, 1 when quantization refuses the input, 2 on a
 * usage or I/O error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int spill(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[1], "dequant") && strcmp(argv[1], "quant"))) {
        fprintf(stderr, "usage: quant_dump dequant|quant TYPE IN OUT\n");
        return 2;
    }
    int t = dfl_type_from_name(argv[2]), blk = t >= 0 ? dfl_type_block(t) : 0;
    size_t bb = t >= 0 ? dfl_type_block_bytes(t) : 0;
    if (blk <= 1) {
        fprintf(stderr, "quant_dump: %s is not a quantized type\n", argv[2]);
        return 2;
    }
    size_t len;
    unsigned char *in = slurp(argv[3], &len);
    if (!in) {
        fprintf(stderr, "quant_dump: cannot read %s\n", argv[3]);
        return 2;
    }
    int rc = 0;
    if (!strcmp(argv[1], "dequant")) {
        if (len % bb) {
            fprintf(stderr, "quant_dump: %zu bytes is not a whole number of blocks\n", len);
            return 2;
        }
        size_t nb = len / bb;
        float *out = malloc(sizeof(float) * blk * (nb ? nb : 1));
        for (size_t b = 0; b < nb; b++) dfl_qdequant_row(t, in + b * bb, out + b * blk, blk);
        rc = spill(argv[4], out, sizeof(float) * blk * nb) ? 2 : 0;
        free(out);
    } else {
        size_t n = len / sizeof(float);
        if (len % sizeof(float) || n % blk) {
            fprintf(stderr, "quant_dump: input is not a whole number of %d-float blocks\n", blk);
            return 2;
        }
        float *x = malloc(len ? len : 1);
        memcpy(x, in, len);
        unsigned char *out = malloc(n / blk * bb + 1);
        /* one block per call, so a refusal names the block */
        for (size_t b = 0; b < n / blk && !rc; b++)
            if (dfl_qquant_row(t, x + b * blk, out + b * bb, blk)) {
                fprintf(stderr, "quant_dump: block %zu refused\n", b);
                rc = 1;
            }
        if (!rc) rc = spill(argv[4], out, n / blk * bb) ? 2 : 0;
        free(x);
        free(out);
    }
    free(in);
    if (rc == 2) fprintf(stderr, "quant_dump: cannot write %s\n", argv[4]);
    return rc;
}
