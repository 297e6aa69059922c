/* machine.h - this machine's own limits, measured on a pool's threads, so
 * kernel speeds can be reported as a fraction of what the hardware gives:
 * read bandwidth (a STREAM-like sum over a buffer far larger than the
 * caches) and f32 FMA peak (independent register-only FMA chains). */
#ifndef DFL_MACHINE_H
#define DFL_MACHINE_H

#include <stddef.h>

#include "base/base.h"

/* GB/s (1e9 bytes) reading `bytes` (0: 512 MiB) split across the pool's
 * threads; the best of `reps` (0: 5) passes after one untimed pass. */
double dfl_machine_read_bw(dfl_pool *pool, size_t bytes, int reps);

/* f32 GFLOP/s (an FMA counts 2) of all the pool's threads running FMA
 * chains for about `seconds` (0: 0.3) per try, the best of 3 tries. Uses
 * 8-wide AVX2 FMA when the CPU has it, scalar fmaf otherwise. */
double dfl_machine_fma_peak(dfl_pool *pool, double seconds);

#endif
