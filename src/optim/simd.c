/*
 * simd.c — run-time choice of the kernel variant. Why CPUID and XGETBV by hand: the
 * variants are compiled into one binary and the right one is picked on the machine that
 * runs it (never at compile time), and a CPU flag alone is not enough — the OS must also
 * save the wide registers (XCR0), which a VM may not do.
 */
#include "optim/optim_internal.h"
#include "memwall/common.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static enum mw_simd g_detect, g_active;
static int g_bf16;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(void)
{
    unsigned a, b, c, d;
    g_detect = MW_SIMD_SCALAR;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
        uint64_t xcr0 = osxsave ? xgetbv0() : 0;
        int ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
        unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0, b71, c71, d71;
        if (__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) {
            if (a7 >= 1) __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
            int avx2 = (b7 >> 5) & 1;
            int f512 = (b7 >> 16) & 1, dq = (b7 >> 17) & 1, bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1;
            if (ymm_os && avx && avx2 && fma && f16c) g_detect = MW_SIMD_AVX2;
            if (g_detect == MW_SIMD_AVX2 && zmm_os && f512 && dq && bw && vl) {
                g_detect = MW_SIMD_AVX512;
                g_bf16 = (a71 >> 5) & 1;
            }
        }
    }
    g_active = g_detect;
    const char *e = getenv("MEMWALL_SIMD");
    if (e && *e) {
        enum mw_simd want = MW_SIMD_AUTO;
        if (!strcmp(e, "scalar")) want = MW_SIMD_SCALAR;
        else if (!strcmp(e, "avx2")) want = MW_SIMD_AVX2;
        else if (!strcmp(e, "avx512")) want = MW_SIMD_AVX512;
        if (want == MW_SIMD_AUTO)
            mw_log(MW_LOG_WARN, "MEMWALL_SIMD='%s' is not scalar|avx2|avx512; using %s", e,
                   mw_simd_name(g_detect));
        else if (want > g_detect)
            mw_log(MW_LOG_WARN, "MEMWALL_SIMD=%s: this CPU lacks it; using %s", e, mw_simd_name(g_detect));
        else
            g_active = want;
    }
}

enum mw_simd mw_simd_detect(void) { pthread_once(&g_once, detect); return g_detect; }
enum mw_simd mw_simd_active(void) { pthread_once(&g_once, detect); return g_active; }
int mw_simd_has_avx512bf16(void) { pthread_once(&g_once, detect); return g_bf16; }

int mw_simd_supported(enum mw_simd level)
{
    if (level == MW_SIMD_AUTO) return 1;
    return level >= MW_SIMD_SCALAR && level <= mw_simd_detect();
}

const char *mw_simd_name(enum mw_simd level)
{
    switch (level) {
    case MW_SIMD_AUTO: return "auto";
    case MW_SIMD_SCALAR: return "scalar";
    case MW_SIMD_AVX2: return "avx2";
    case MW_SIMD_AVX512: return "avx512";
    }
    return "?";
}

/* Kernel table of a level; NULL if the CPU lacks it. AUTO resolves to mw_simd_active(). */
const struct mw_optim_kernels *mw_optim_kernels_for(enum mw_simd level)
{
    if (level == MW_SIMD_AUTO) level = mw_simd_active();
    if (!mw_simd_supported(level)) return NULL;
    switch (level) {
    case MW_SIMD_AVX512: return mw_optim_kernels_avx512(mw_simd_has_avx512bf16());
    case MW_SIMD_AVX2: return &mw_optim_kernels_avx2;
    default: return &mw_optim_kernels_scalar;
    }
}
