/* cpu.c - which kernel paths may run on this CPU, and which one does.
 *
 * The path is one process-wide setting (the kernels are plain functions with
 * no context to carry it): the engine sets it at load from
 * dfl_engine_opts.isa, tests switch it between runs. Every path computes
 * the twins' bits, so the setting changes speed, never results. */
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/vec.h"

static int cpu_has(int avx512) {
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    if (!avx512) return avx2;
    /* gcc's check includes the OS's consent to the zmm state (XCR0) */
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

int dfl_cpu_has_avx2(void) {
    static int has = -1;
    if (has < 0) has = cpu_has(0);
    return has;
}

int dfl_cpu_has_avx512(void) {
    static int has = -1;
    if (has < 0) has = cpu_has(1);
    return has;
}

dfl_isa dfl_cpu_isa(void) {
    return dfl_cpu_has_avx512() ? DFL_ISA_AVX512 : dfl_cpu_has_avx2() ? DFL_ISA_AVX2
                                                                      : DFL_ISA_GENERIC;
}

void dfl_cpu_features(char *out, size_t cap) {
    static const char *const names[] = {"avx2",     "fma",        "f16c",      "avx512f",
                                        "avx512bw", "avx512vl",   "avx512vnni", "avxvnni",
                                        "avx512bf16"};
    size_t n = 0;
    if (cap) out[0] = 0;
    __builtin_cpu_init();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int has = 0;
        /* __builtin_cpu_supports takes literals only */
        switch (i) {
        case 0: has = __builtin_cpu_supports("avx2"); break;
        case 1: has = __builtin_cpu_supports("fma"); break;
        case 2: has = __builtin_cpu_supports("f16c"); break;
        case 3: has = __builtin_cpu_supports("avx512f"); break;
        case 4: has = __builtin_cpu_supports("avx512bw"); break;
        case 5: has = __builtin_cpu_supports("avx512vl"); break;
        case 6: has = __builtin_cpu_supports("avx512vnni"); break;
        case 7: has = __builtin_cpu_supports("avxvnni"); break;
        case 8: has = __builtin_cpu_supports("avx512bf16"); break;
        }
        if (has && n + strlen(names[i]) + 2 < cap)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? " " : "", names[i]);
    }
}

static const char *const isa_names[] = {"generic", "avx2", "avx512"};

const char *dfl_isa_name(dfl_isa isa) {
    return isa >= DFL_ISA_GENERIC && isa <= DFL_ISA_AVX512 ? isa_names[isa] : "?";
}

int dfl_isa_from_name(const char *s) {
    for (int i = 0; i <= DFL_ISA_AVX512; i++)
        if (!strcmp(s, isa_names[i])) return i;
    return -1;
}

static int isa = -1;      /* -1: not set, the best the CPU has */
static int saved_isa = -1; /* the path dfl_kernels_force_ref(0) returns to */

int dfl_kernels_set_isa(dfl_isa want) {
    if (want < DFL_ISA_GENERIC || want > dfl_cpu_isa()) return -1;
    isa = saved_isa = want;
    return 0;
}

dfl_isa dfl_kernels_isa(void) { return isa < 0 ? dfl_cpu_isa() : (dfl_isa)isa; }

void dfl_kernels_force_ref(int on) {
    if (on && isa != DFL_ISA_GENERIC) saved_isa = isa;
    isa = on ? DFL_ISA_GENERIC : saved_isa;
}

int dfl_kernels_simd(void) { return dfl_kernels_isa() >= DFL_ISA_AVX2; }
