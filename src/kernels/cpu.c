/* cpu.c - which kernel paths may run on this CPU, and which one does.
 *
 * The path is one process-wide setting (the kernels are plain functions with
 * no context to carry it): the engine sets it at load from
 * dfl_engine_opts.isa, tests switch it between runs. x86 paths are asked of
 * cpuid (gcc's builtins), the aarch64 one of the kernel's hwcaps. Every path computes
 * the twins' bits, so the setting changes speed, never results. */
#include <stdio.h>
#include <string.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "kernels/kernels.h"
#include "kernels/vec.h"

#if DFL_X86
static int cpu_has(int avx512) {
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    if (!avx512) return avx2;
    /* gcc's check includes the OS's consent to the zmm state (XCR0) */
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

static const char *const feature_names[] = {"avx2",     "fma",        "f16c",      "avx512f",
                                            "avx512bw", "avx512vl",   "avx512vnni", "avxvnni",
                                            "avx512bf16"};

static int has_feature(size_t i) {
    __builtin_cpu_init();
    switch (i) { /* __builtin_cpu_supports takes literals only */
    case 0: return __builtin_cpu_supports("avx2");
    case 1: return __builtin_cpu_supports("fma");
    case 2: return __builtin_cpu_supports("f16c");
    case 3: return __builtin_cpu_supports("avx512f");
    case 4: return __builtin_cpu_supports("avx512bw");
    case 5: return __builtin_cpu_supports("avx512vl");
    case 6: return __builtin_cpu_supports("avx512vnni");
    case 7: return __builtin_cpu_supports("avxvnni");
    default: return __builtin_cpu_supports("avx512bf16");
    }
}
#else
static int cpu_has(int avx512) { return 0; }
#endif

#if defined(__aarch64__)
/* The kernel's hwcaps (asm/hwcap.h bits, named here so that no kernel header
 * is needed): Advanced SIMD, and the dot-product instructions. */
enum { HWCAP_ASIMD_BIT = 1 << 1, HWCAP_ASIMDDP_BIT = 1 << 20 };

static const char *const feature_names[] = {"asimd", "asimddp"};

static int has_feature(size_t i) {
    unsigned long hw = getauxval(AT_HWCAP);
    return (hw & (i == 0 ? HWCAP_ASIMD_BIT : HWCAP_ASIMDDP_BIT)) != 0;
}
#endif

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

int dfl_cpu_has_neon(void) {
#if defined(__aarch64__)
    static int has = -1;
    if (has < 0) has = has_feature(0) && has_feature(1);
    return has;
#else
    return 0;
#endif
}

int dfl_cpu_has_isa(dfl_isa want) {
    switch (want) {
    case DFL_ISA_GENERIC: return 1;
    case DFL_ISA_AVX2: return dfl_cpu_has_avx2();
    case DFL_ISA_AVX512: return dfl_cpu_has_avx512();
    case DFL_ISA_NEON: return dfl_cpu_has_neon();
    default: return 0;
    }
}

dfl_isa dfl_cpu_isa(void) {
    return dfl_cpu_has_avx512() ? DFL_ISA_AVX512 : dfl_cpu_has_avx2() ? DFL_ISA_AVX2
         : dfl_cpu_has_neon()   ? DFL_ISA_NEON   : DFL_ISA_GENERIC;
}

void dfl_cpu_features(char *out, size_t cap) {
    size_t n = 0;
    if (cap) out[0] = 0;
#if DFL_X86 || defined(__aarch64__)
    for (size_t i = 0; i < sizeof feature_names / sizeof feature_names[0]; i++)
        if (has_feature(i) && n + strlen(feature_names[i]) + 2 < cap)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? " " : "", feature_names[i]);
#endif
}

static const char *const isa_names[DFL_ISA_COUNT] = {"generic", "avx2", "avx512", "neon"};

const char *dfl_isa_name(dfl_isa isa) {
    return isa >= DFL_ISA_GENERIC && isa < DFL_ISA_COUNT ? isa_names[isa] : "?";
}

int dfl_isa_from_name(const char *s) {
    for (int i = 0; i < DFL_ISA_COUNT; i++)
        if (!strcmp(s, isa_names[i])) return i;
    return -1;
}

static int isa = -1;      /* -1: not set, the best the CPU has */
static int saved_isa = -1; /* the path dfl_kernels_force_ref(0) returns to */

int dfl_kernels_set_isa(dfl_isa want) {
    if (!dfl_cpu_has_isa(want)) return -1;
    isa = saved_isa = want;
    return 0;
}

dfl_isa dfl_kernels_isa(void) { return isa < 0 ? dfl_cpu_isa() : (dfl_isa)isa; }

void dfl_kernels_force_ref(int on) {
    if (on && isa != DFL_ISA_GENERIC) saved_isa = isa;
    isa = on ? DFL_ISA_GENERIC : saved_isa;
}

int dfl_kernels_simd(void) {
    dfl_isa i = dfl_kernels_isa();
    return i == DFL_ISA_AVX2 || i == DFL_ISA_AVX512;
}
