/* cpu.c - which kernel paths may run on this CPU. */
#include "kernels/kernels.h"
#include "kernels/vec.h"

static int force_ref;

int dfl_cpu_has_avx2(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
    }
    return has;
}

void dfl_kernels_force_ref(int on) { force_ref = on; }

int dfl_kernels_simd(void) { return !force_ref && dfl_cpu_has_avx2(); }
