/* The runtime header of generated kernels: self-contained C (standard
 * headers only), embedded as text into every generated translation unit and
 * included by the eager CPU kernels, so both compute with the same
 * functions: f32 math, f16/bf16 conversions, integer semantics, and the
 * double-accumulating row reductions.
 *
 * Everything is SJ_RT_FN with an sj_rt_ prefix (the conversions keep
 * their historical sj_f16_* / sj_bf16_* names), so a unit that includes it
 * exports nothing.
 */
#ifndef SJ_KERNEL_RT_H
#define SJ_KERNEL_RT_H

/* NVRTC has no system headers: a generated CUDA unit defines what these
 * give (the <stdint.h> types and limits, INFINITY and NAN) before this
 * text; memcpy and the math functions are device built-ins there. */
#if !defined(__CUDACC_RTC__)
#include <math.h>
#include <stdint.h>
#include <string.h>
#endif

#ifdef __FAST_MATH__
#error "sj_kernel_rt.h needs IEEE semantics (NaN checks, rounding tricks): no -ffast-math"
#endif

/* static inline, and quiet when a unit leaves one unused (clang warns about
 * those in a main file, which is what a generated unit is). Under nvcc
 * (__CUDACC__) every function is also __host__ __device__, so CUDA kernels
 * (kernels/cuda/eager.cu) compute with the very same definitions. */
#if defined(__CUDACC__)
#define SJ_RT_FN static inline __host__ __device__ __attribute__((unused))
#elif defined(__GNUC__)
#define SJ_RT_FN static inline __attribute__((unused))
#else
#define SJ_RT_FN static inline
#endif

/* -- Shape arithmetic -------------------------------------------------------
 *
 * Python-style integer division and modulo (floor; sign of the divisor),
 * 0 for a zero divisor, as shapes/expr.h defines them. */

SJ_RT_FN int64_t sj_rt_floordiv(int64_t a, int64_t b) {
    if (b == 0 || (a == INT64_MIN && b == -1)) return b == 0 ? 0 : INT64_MIN;
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
SJ_RT_FN int64_t sj_rt_mod(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
#define SJ_FLOORDIV(a, b) sj_rt_floordiv((a), (b))
#define SJ_MOD(a, b) sj_rt_mod((a), (b))
#define SJ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SJ_MAX(a, b) ((a) > (b) ? (a) : (b))

/* -- Bits -------------------------------------------------------------------- */

SJ_RT_FN uint32_t sj_rt_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

SJ_RT_FN float sj_rt_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* c ? a : b on bit patterns. */
SJ_RT_FN uint32_t sj_rt_sel32(int c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)(c != 0);
    return (a & m) | (b & ~m);
}

/* c ? a : b on floats, as bit masks. gcc -O2 does not vectorize a float ?:
 * whose arms it has sunk into branches (they may trap), so the math below
 * selects with this. */
SJ_RT_FN float sj_rt_sel(int c, float a, float b) {
    return sj_rt_u2f(sj_rt_sel32(c, sj_rt_f2u(a), sj_rt_f2u(b)));
}

/* -- Half precision ------------------------------------------------------------
 *
 * IEEE binary16 (f16) and bfloat16 (bf16), both stored as uint16_t.
 * Widening to f32 is exact. Narrowing rounds to nearest, ties to even; NaN
 * stays NaN (made quiet, sign and the top payload bits kept), infinities
 * stay infinite, values past the largest finite number round to infinity,
 * and f16 subnormals are produced and read exactly. The f16 ones are
 * written without branches (all cases computed, then selected with masks)
 * so that loops over arrays vectorize.
 *
 * On a CUDA device (__CUDA_ARCH__) f16 both ways, and f32 -> bf16 from
 * compute capability 8.0, are one cvt instruction each: the same values,
 * except that a NaN becomes the device's canonical NaN (payload and sign
 * not kept). The bit-level forms cost about 15 instructions a conversion,
 * which doubled the code of an f16 row kernel and its NVRTC compile time.
 */

#if defined(__CUDA_ARCH__)
SJ_RT_FN float sj_f16_to_f32(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

SJ_RT_FN uint16_t sj_f32_to_f16(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
SJ_RT_FN float sj_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    /* normal: rebias the exponent by 127 - 15; inf/NaN (exponent 31) by
     * twice that, which lands on 255 and keeps the payload (the f16 quiet
     * bit becomes the f32 quiet bit) */
    uint32_t bits = (em << 13) + 0x38000000u;
    bits += sj_rt_sel32(em >= 0x7c00u, 0x38000000u, 0u);
    /* zero or subnormal: em * 2^-24, exact in f32 */
    float sub = (float)(int32_t)em * 0x1p-24f;
    bits = sj_rt_sel32(em < 0x0400u, sj_rt_f2u(sub), bits) | sign;
    return sj_rt_u2f(bits);
}

SJ_RT_FN uint16_t sj_f32_to_f16(float f) {
    uint32_t x = sj_rt_f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    /* normal result (2^-14 <= |f| < 65520): round the 13 dropped bits to
     * nearest even, then rebias; a mantissa carry moves into the exponent */
    uint32_t norm = (x + 0xfffu + ((x >> 13) & 1u) - 0x38000000u) >> 13;
    /* subnormal result (|f| < 2^-14): |f| + 0.5 rounds |f| to a multiple of
     * 2^-24, the ulp of 0.5 (round to nearest even, the default mode) */
    float a = sj_rt_u2f(x) + 0.5f;
    uint32_t sub = sj_rt_f2u(a) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((x >> 13) & 0x3ffu); /* quiet, top payload bits */
    uint32_t r = sj_rt_sel32(x < 0x38800000u, sub, norm);
    r = sj_rt_sel32(x >= 0x477ff000u, 0x7c00u, r); /* >= 65520: inf */
    r = sj_rt_sel32(x > 0x7f800000u, nan, r);
    return (uint16_t)(r | sign);
}

#endif /* __CUDA_ARCH__ */

SJ_RT_FN float sj_bf16_to_f32(uint16_t h) { return sj_rt_u2f((uint32_t)h << 16); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
SJ_RT_FN uint16_t sj_f32_to_bf16(float f) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
SJ_RT_FN uint16_t sj_f32_to_bf16(float f) {
    uint32_t x = sj_rt_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);            /* round to nearest even */
    return (uint16_t)(x >> 16);
}
#endif

/* -- f32 math ----------------------------------------------------------------
 *
 * Branch-free approximations that gcc vectorizes (selects, not branches;
 * no libm calls). Bounds asserted by test_approximations against double
 * libm on every 1021st f32 bit pattern (measured maxima in brackets):
 *   sj_rt_expf   relative < 2e-7 [1.1e-7] where exp(x) >= 1e-30, absolute
 *                < 2e-37 below; inf past ~88.72, subnormals, 0 below ~-103.9
 *   sj_rt_tanhf  relative < 2e-7 [1.6e-7]
 *   sj_rt_erff   absolute < 1.5e-7 [8.5e-8]
 *   sigmoid      relative < 2e-7 [1.4e-7]
 *   gelu         |err| / max(|ref|, 1) < 3e-7 [1.1e-7]; relative < 2e-6
 *                [1.2e-6] for x in [-6, 0) (no cancellation)
 *   gelu_tanh    |err| / max(|ref|, 1) < 4e-7 [2.9e-7] (1 + tanh cancels for
 *                negative x: the f32 formula's own limit)
 * NaN in gives NaN out; +-inf give the limits.
 *
 * On a CUDA device (__CUDA_ARCH__) exp, tanh and erf are the CUDA math
 * library's expf, tanhf and erff instead (at most 2 ulp, IEEE specials),
 * and sigmoid divides with __fdividef (2 ulp):
 * its special-function unit makes them a few instructions, where the
 * polynomials above, both branches computed, would make a fused kernel
 * compute-bound. Results agree with the CPU's within the bounds above plus
 * 2 ulp.
 */

#define SJ_RT_LOG2E 1.44269504089f
#define SJ_RT_LN2_HI 0.693145751953125f /* 15 significant bits: n * HI is exact */
#define SJ_RT_LN2_LO 1.42860682030941723e-6f
#define SJ_RT_RMAGIC 12582912.0f /* 1.5 * 2^23: x + RMAGIC rounds x to an integer */

/* Split x = n ln2 + r with n = round(x / ln2) (x already clamped to a range
 * where |n| < 2^21); returns r, stores n. */
SJ_RT_FN float sj_rt_reduce_ln2(float x, int32_t *n) {
    float t = x * SJ_RT_LOG2E + SJ_RT_RMAGIC;
    float nf = t - SJ_RT_RMAGIC;
    /* the low mantissa bits of t hold n (two's complement); for a NaN x
     * they are arbitrary, harmless since r is NaN too */
    *n = (int32_t)(sj_rt_f2u(t) - sj_rt_f2u(SJ_RT_RMAGIC));
    float r = x - nf * SJ_RT_LN2_HI;
    return r - nf * SJ_RT_LN2_LO;
}

/* 2^n for n in [-126, 127]. */
SJ_RT_FN float sj_rt_pow2i(int32_t n) { return sj_rt_u2f((uint32_t)(n + 127) << 23); }

/* exp(r) for |r| <= 0.35 (a reduced argument): a degree-6 fit
 * (mpmath.chebyfit, error 2.1e-9). */
SJ_RT_FN float sj_rt_exp_poly(float r) {
    float p = 1.394215983e-03f;
    p = p * r + 8.375968226e-03f;
    p = p * r + 4.166634014e-02f;
    p = p * r + 1.666640530e-01f;
    p = p * r + 5.000000050e-01f;
    p = p * r + 1.0f;
    return p * r + 1.0f;
}

/* exp(x) = 2^n * exp(r), exp(r) by sj_rt_exp_poly; 2^n applied as two
 * factors so that results that overflow become inf and tiny ones pass
 * through the subnormals; 0 below -104. The clamps let a NaN through (its
 * comparisons are false). */
SJ_RT_FN float sj_rt_expf(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    /* below -104 (exp rounds to 0) compute at 0 and select 0 after: an
     * underflowing multiplication costs a microcode assist of ~150 cycles
     * on Intel cores, which masked softmax rows (-1e4) would pay per vector */
    int tiny = x < -104.0f;
    float xc = sj_rt_sel(tiny, 0.0f, x);
    xc = sj_rt_sel(xc > 88.8f, 88.8f, xc); /* exp(88.8) overflows */
    int32_t n;
    float p = sj_rt_exp_poly(sj_rt_reduce_ln2(xc, &n));
    int32_t n1 = n >> 1, n2 = n - n1; /* arithmetic shift: any split works */
    return sj_rt_sel(tiny, 0.0f, p * sj_rt_pow2i(n1) * sj_rt_pow2i(n2));
#endif
}

/* exp(x) for x <= 0 (softmax's x - max, erfc's -a^2) or NaN: one factor
 * 2^n instead of two, no overflow clamp, and results below 2^-126
 * (x < -87.33) flushed to 0, as the GPU's ex2.approx.ftz does; about 30%
 * less work than sj_rt_expf. A softmax output that small is below every
 * tolerance that a probability has. */
SJ_RT_FN float sj_rt_exp_shifted(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    int tiny = x < -87.33f;
    int32_t n;
    float p = sj_rt_exp_poly(sj_rt_reduce_ln2(sj_rt_sel(tiny, 0.0f, x), &n));
    return sj_rt_sel(tiny, 0.0f, p * sj_rt_pow2i(n));
#endif
}

/* expm1(x) for x in [-20, 0]: 2^n expm1(r) + (2^n - 1), expm1(r) by its
 * Taylor series to r^8/8!; exact cancellation-free for n = 0. */
SJ_RT_FN float sj_rt_expm1_neg(float x) {
    int32_t n;
    float r = sj_rt_reduce_ln2(x, &n);
    float q = 1.0f / 40320.0f;
    q = q * r + 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r;
    float s = sj_rt_pow2i(n);
    return s * q + (s - 1.0f);
}

/* tanh: for |x| < 0.6, x + x u P(u) with u = x^2 and P a degree-5 fit
 * (mpmath.chebyfit) of (tanh(x)/x - 1)/u on u in [0, 0.36] (error 9e-11);
 * otherwise tanh(|x|) = -e / (e + 2) with e = expm1(-2|x|), which does not
 * cancel; |x| >= 10 gives exactly 1. The sign is copied from x. */
SJ_RT_FN float sj_rt_tanhf(float x) {
#if defined(__CUDA_ARCH__)
    return tanhf(x);
#else
    float a = fabsf(x);
    float u = a * a;
    float p = 2.212133989e-03f;
    p = p * u - 8.245524711e-03f;
    p = p * u + 2.172505575e-02f;
    p = p * u - 5.395053585e-02f;
    p = p * u + 1.333322862e-01f;
    p = p * u - 3.333333100e-01f;
    float small = a + a * (u * p);
    float ac = sj_rt_sel(a > 10.0f, 10.0f, a); /* NaN stays NaN */
    float e = sj_rt_expm1_neg(-2.0f * ac);
    float big = -e / (e + 2.0f);
    return copysignf(sj_rt_sel(a < 0.6f, small, big), x);
#endif
}

/* exp(x) for x in [-87, 88]: sj_rt_exp_poly with 2^n added to the exponent
 * bits (n in [-126, 127]), no multiplications: the callers are bound by
 * floating-point throughput. Below -87 the bits are no longer exp(x), so
 * callers clamp and select. */
SJ_RT_FN float sj_rt_exp_bits(float x) {
    int32_t n;
    float p = sj_rt_exp_poly(sj_rt_reduce_ln2(x, &n));
    return sj_rt_u2f(sj_rt_f2u(p) + ((uint32_t)n << 23));
}

/* erfc(a) / 2 for a >= 0, given a2 = a^2 rounded once (its rounding error
 * is the result's relative error times 1/a2): exp(-a^2) R(a) with R = P/Q a rational fit of
 * erfc(a) exp(a^2) / 2 on [0, 10] (P of degree 4, Q of degree 5; relative
 * error 5.6e-9 in double; iteratively reweighted least squares toward
 * minimax). Accurate in relative terms however small it gets, which is
 * what gelu needs for negative x, down to 2^-126 (flushed to 0 below, past
 * a = 9.3); R's argument is clamped to 10. NaN passes (through P/Q). */
SJ_RT_FN float sj_rt_half_erfcf(float a, float a2) {
    float ac = sj_rt_sel(a > 10.0f, 10.0f, a);
    float p = 1.635517632e-02f;
    p = p * ac + 1.144041449e-01f;
    p = p * ac + 3.653714430e-01f;
    p = p * ac + 6.187940313e-01f;
    p = p * ac + 5.000000028e-01f;
    float q = 5.797687721e-02f;
    q = q * ac + 4.055789477e-01f;
    q = q * ac + 1.323760859e+00f;
    q = q * ac + 2.400442467e+00f;
    q = q * ac + 2.365967798e+00f;
    q = q * ac + 1.0f;
    return sj_rt_exp_shifted(-a2) * (p / q);
}

/* erf: for |x| < 0.8, x + x (c + u P(u)) with u = x^2, c = 2/sqrt(pi) - 1
 * and P a degree-5 fit of erf(x)/x on u in [0, 0.64] (mpmath.chebyfit,
 * error 6e-11); otherwise 1 - 2 half_erfc(|x|), which does not cancel
 * there (erf(0.8) = 0.74). The sign is copied from x. */
SJ_RT_FN float sj_rt_erff(float x) {
#if defined(__CUDA_ARCH__)
    return erff(x);
#else
    float a = fabsf(x);
    float u = a * a;
    float p = 9.164211901e-05f;
    p = p * u - 8.306234622e-04f;
    p = p * u + 5.213663502e-03f;
    p = p * u - 2.686389065e-02f;
    p = p * u + 1.128376753e-01f;
    p = p * u - 3.761263794e-01f;
    float small = a + a * (0.1283791671f + u * p);
    float big = 1.0f - 2.0f * sj_rt_half_erfcf(a, u); /* computed and discarded below 0.8 */
    return copysignf(sj_rt_sel(a < 0.8f, small, big), x);
#endif
}

/* The definitions every kernel (eager and fused) computes, in f32:
 *   sigmoid(x)   = 1 / (1 + exp(-x))
 *   silu(x)      = x * sigmoid(x)
 *   gelu(x)      = 0.5 x (1 + erf(x / sqrt(2)))
 *   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   relu(x)      = x < 0 ? 0 : x   (NaN stays NaN)
 *   rsqrt(x)     = 1 / sqrt(x)
 *   maximum(a,b) = a is NaN or a > b ? a : b   (NaN from either side)
 *   minimum(a,b) = a is NaN or a < b ? a : b
 * At x = -inf, silu and both gelus are NaN (-inf * 0), as the formulas say. */
SJ_RT_FN float sj_rt_sigmoidf(float x) {
#if defined(__CUDA_ARCH__)
    /* 2 ulp reciprocal, no slow-path call (0 past 2^126, where the true
     * value is below 1.2e-38) */
    return __fdividef(1.0f, 1.0f + expf(-x));
#else
    /* exp(-x) with u = -x clamped to [-87, 88], where 2^n goes straight
     * into the exponent bits (n in [-126, 127]; below 2^-126 the bits are a
     * tiny positive number, and 1 + e is 1 either way): no two-factor
     * scaling, which costs this FMA-bound function 2 multiplications and
     * the underflow select. u > 88 (x < -88, sigmoid < 6.1e-39) gives 0,
     * as 1 / (1 + inf) would; NaN passes (its comparisons are false). */
    float u = -x;
    float uc = sj_rt_sel(u > 88.0f, 88.0f, u);
    uc = sj_rt_sel(uc < -87.0f, -87.0f, uc);
    return sj_rt_sel(u > 88.0f, 0.0f, 1.0f / (1.0f + sj_rt_exp_bits(uc)));
#endif
}
SJ_RT_FN float sj_rt_siluf(float x) { return x * sj_rt_sigmoidf(x); }
/* gelu(x) = x Phi(x), Phi(x) = 1 - h for x >= 0 and h for x < 0, with
 * h = half_erfc(|x| / sqrt 2): one erfc evaluation, no cancellation for
 * negative x (where 0.5 x (1 + erf) would lose the small result). */
SJ_RT_FN float sj_rt_geluf(float x) {
#if defined(__CUDA_ARCH__)
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
#else
    float h = sj_rt_half_erfcf(fabsf(x) * 0.70710678118654752f, 0.5f * x * x);
    return x * sj_rt_sel(x < 0.0f, h, 1.0f - h);
#endif
}
SJ_RT_FN float sj_rt_gelu_tanhf(float x) {
    float inner = 0.79788456080286536f * (x + 0.044715f * (x * x * x));
    return 0.5f * x * (1.0f + sj_rt_tanhf(inner));
}
SJ_RT_FN float sj_rt_reluf(float x) { return x < 0.0f ? 0.0f : x; }
/* Layer norm's per-element pass, shared by the eager CPU kernel and the
 * generated C (kernels/cpu/reduce.c states the definition): the row's mean
 * (summed in double) as two floats mhi + mlo (sj_rt_split), so that x - mhi
 * is exact near the mean and a row whose mean is large against its spread
 * keeps its digits, and the rest in f32 vectors. */
SJ_RT_FN float sj_rt_split(double v, float *lo) {
    float hi = (float)v;
    *lo = (float)(v - (double)hi);
    return hi;
}
SJ_RT_FN float sj_rt_layer_norm1(float x, float mhi, float mlo, float rstd, float g, float b) {
    return ((x - mhi) - mlo) * rstd * g + b;
}
SJ_RT_FN float sj_rt_maxf(float a, float b) { return (a != a || a > b) ? a : b; }
SJ_RT_FN float sj_rt_minf(float a, float b) { return (a != a || a < b) ? a : b; }

/* -- Integers ------------------------------------------------------------------
 *
 * Integer tensors compute in int64 with wrapping (through uint64, so
 * overflow is defined), then narrow on store: i32 wraps, bool is != 0.
 */

/* uint64 -> int64 by wrapping (no implementation-defined conversion). */
SJ_RT_FN int64_t sj_rt_i64_from_u(uint64_t u) {
    return u <= INT64_MAX ? (int64_t)u : (int64_t)(u - 0x8000000000000000u) + INT64_MIN;
}

/* Narrow an int64 to int32 by wrapping. */
SJ_RT_FN int32_t sj_rt_wrap32(int64_t v) {
    uint32_t u = (uint32_t)(uint64_t)v;
    return u <= INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}

SJ_RT_FN int64_t sj_rt_iadd(int64_t a, int64_t b) { return sj_rt_i64_from_u((uint64_t)a + (uint64_t)b); }
SJ_RT_FN int64_t sj_rt_isub(int64_t a, int64_t b) { return sj_rt_i64_from_u((uint64_t)a - (uint64_t)b); }
SJ_RT_FN int64_t sj_rt_imul(int64_t a, int64_t b) { return sj_rt_i64_from_u((uint64_t)a * (uint64_t)b); }
SJ_RT_FN int64_t sj_rt_ineg(int64_t a) { return sj_rt_i64_from_u(0u - (uint64_t)a); }
SJ_RT_FN int64_t sj_rt_iabs(int64_t a) { return a < 0 ? sj_rt_ineg(a) : a; }

/* Division truncating toward zero; x / 0 = 0; INT64_MIN / -1 wraps to
 * INT64_MIN. */
SJ_RT_FN int64_t sj_rt_idiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return sj_rt_ineg(a);
    return a / b;
}

/* Power by squaring, wrapping; a negative exponent gives 0 except for
 * bases 1 and -1. */
SJ_RT_FN int64_t sj_rt_ipow(int64_t base, int64_t e) {
    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, b = (uint64_t)base;
    for (; e; e >>= 1) {
        if (e & 1) r *= b;
        b *= b;
    }
    return sj_rt_i64_from_u(r);
}

/* float -> int64 truncating toward zero; NaN gives 0, out-of-range values
 * saturate (to the int32 range when to_i32). */
SJ_RT_FN int64_t sj_rt_f32_to_int(float v, int to_i32) {
    int64_t r;
    if (v != v) return 0;
    if (v >= 9223372036854775808.0f)
        r = INT64_MAX;
    else if (v < -9223372036854775808.0f)
        r = INT64_MIN;
    else
        r = (int64_t)v;
    if (to_i32) r = r > INT32_MAX ? INT32_MAX : r < INT32_MIN ? INT32_MIN : r;
    return r;
}

/* -- Streaming stores ------------------------------------------------------------
 *
 * A plain store to a line that is not cached first reads it (read for
 * ownership): writing an output that does not fit in the caches costs a
 * read and a write per line. Non-temporal stores write the line without the
 * read. Generated kernels whose data exceeds the last-level cache compute an
 * f32 output into a small stack chunk and stream the chunk out with
 * sj_rt_stream_f32; before returning they call sj_rt_sfence, which orders
 * those weakly ordered stores before whatever the thread does next (the
 * executor's completion signal). Where the unit is built without AVX (the
 * eager kernels, other architectures) SJ_RT_HAVE_STREAM is 0 and the
 * functions are a plain copy and nothing. Not in CUDA units.
 */
#if !defined(__CUDACC__)
#if defined(__AVX__) && defined(__GNUC__)
/* The compilers' builtins rather than <immintrin.h>: that header takes
 * longer to parse than the rest of a generated unit to compile. */
#define SJ_RT_HAVE_STREAM 1
typedef float sj_rt_v8f __attribute__((vector_size(32)));

/* dst[0 .. n) = src[0 .. n): plain stores up to dst's first 64-byte
 * boundary and after its last whole vector, non-temporal ones between. */
SJ_RT_FN void sj_rt_stream_f32(float *restrict dst, const float *restrict src, int64_t n) {
    int64_t i = 0;
    while (i < n && ((uintptr_t)(dst + i) & 63u) != 0) {
        dst[i] = src[i];
        i++;
    }
    for (; i + 8 <= n; i += 8) {
        sj_rt_v8f v;
        memcpy(&v, src + i, sizeof v);
#if defined(__clang__)
        __builtin_nontemporal_store(v, (sj_rt_v8f *)(dst + i));
#else
        __builtin_ia32_movntps256(dst + i, v);
#endif
    }
    for (; i < n; i++) dst[i] = src[i];
}

SJ_RT_FN void sj_rt_sfence(void) { __builtin_ia32_sfence(); }
#else
#define SJ_RT_HAVE_STREAM 0

SJ_RT_FN void sj_rt_stream_f32(float *restrict dst, const float *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

SJ_RT_FN void sj_rt_sfence(void) {}
#endif
#endif /* !__CUDACC__ */

/* -- f16 chunks -------------------------------------------------------------------
 *
 * n contiguous f16 to f32 (sj_rt_f16_load) and back (sj_rt_f16_store), the
 * same bits as sj_f16_to_f32 / sj_f32_to_f16 element by element. Generated
 * kernels convert their unit-stride f16 accesses a chunk at a time with
 * these (specialize/codegen_c.c). Where the unit is built for a CPU with
 * F16C (the generated kernels' -march=native on x86-64) 8 at a time in
 * hardware: vcvtps2ph rounds to nearest even as sj_f32_to_f16 does (NaNs
 * quiet, top payload bits kept, the same way); vcvtph2ps quiets a
 * signalling NaN, which sj_f16_to_f32 keeps signalling, so a chunk that
 * holds one converts those again in software. Elsewhere, the scalar
 * functions. Not in CUDA units.
 */
#if !defined(__CUDACC__)
#if defined(__F16C__) && defined(__AVX__) && defined(__GNUC__)
typedef short sj_rt_v8h __attribute__((vector_size(16)));

SJ_RT_FN void sj_rt_f16_load(float *restrict dst, const uint16_t *restrict src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sj_rt_v8h h;
        memcpy(&h, src + i, sizeof h);
        sj_rt_v8f f = __builtin_ia32_vcvtph2ps256(h);
        memcpy(dst + i, &f, sizeof f);
    }
    for (; i < n; i++) dst[i] = sj_f16_to_f32(src[i]);
    /* exponent 31, quiet bit clear (infinities too): rare, so a vectorized
     * scan, then the scalar conversion where one is */
    int odd = 0;
    for (i = 0; i < n; i++) odd |= (src[i] & 0x7e00u) == 0x7c00u;
    if (odd)
        for (i = 0; i < n; i++)
            if ((src[i] & 0x7e00u) == 0x7c00u) dst[i] = sj_f16_to_f32(src[i]);
}

SJ_RT_FN void sj_rt_f16_store(uint16_t *restrict dst, const float *restrict src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sj_rt_v8f f;
        memcpy(&f, src + i, sizeof f);
        sj_rt_v8h h = __builtin_ia32_vcvtps2ph256(f, 8); /* round to nearest even, no exceptions */
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++) dst[i] = sj_f32_to_f16(src[i]);
}
#else
SJ_RT_FN void sj_rt_f16_load(float *restrict dst, const uint16_t *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = sj_f16_to_f32(src[i]);
}

SJ_RT_FN void sj_rt_f16_store(uint16_t *restrict dst, const float *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = sj_f32_to_f16(src[i]);
}
#endif
#endif /* !__CUDACC__ */

/* -- Row reductions -------------------------------------------------------------
 *
 * Sums of floats accumulate in double in SJ_RT_LANES partial sums (one per
 * position modulo SJ_RT_LANES, vectorized), then the tail in order, then the
 * partials in order. A sum may be fed in pieces (sj_rt_dsum_add): as long as
 * every piece but the last is a multiple of SJ_RT_LANES long, the result is
 * bit-identical to one call over the whole row.
 */

#define SJ_RT_LANES 16

typedef struct sj_rt_dsum {
    double acc[SJ_RT_LANES];
    double tail;
} sj_rt_dsum;

SJ_RT_FN void sj_rt_dsum_init(sj_rt_dsum *a) {
    for (int j = 0; j < SJ_RT_LANES; j++) a->acc[j] = 0.0;
    a->tail = 0.0;
}

/* Add x[0 .. n). */
SJ_RT_FN void sj_rt_dsum_add(sj_rt_dsum *a, const float *x, int64_t n) {
    double acc[SJ_RT_LANES], s = a->tail;
    int64_t i = 0, nb = n - n % SJ_RT_LANES; /* not i + LANES <= n: gcc 12 -O3 warns */
    for (int j = 0; j < SJ_RT_LANES; j++) acc[j] = a->acc[j];
    for (; i < nb; i += SJ_RT_LANES)
        for (int j = 0; j < SJ_RT_LANES; j++) acc[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < SJ_RT_LANES; j++) a->acc[j] = acc[j];
    a->tail = s;
}

/* Add the squares (x[i] - c)^2. */
SJ_RT_FN void sj_rt_dsum_addsq(sj_rt_dsum *a, const float *x, double c, int64_t n) {
    double acc[SJ_RT_LANES], s = a->tail;
    int64_t i = 0, nb = n - n % SJ_RT_LANES; /* not i + LANES <= n: gcc 12 -O3 warns */
    for (int j = 0; j < SJ_RT_LANES; j++) acc[j] = a->acc[j];
    for (; i < nb; i += SJ_RT_LANES)
        for (int j = 0; j < SJ_RT_LANES; j++) {
            double d = x[i + j] - c;
            acc[j] += d * d;
        }
    for (; i < n; i++) s += (x[i] - c) * (x[i] - c);
    for (int j = 0; j < SJ_RT_LANES; j++) a->acc[j] = acc[j];
    a->tail = s;
}

SJ_RT_FN double sj_rt_dsum_get(const sj_rt_dsum *a) {
    double s = a->tail;
    for (int j = 0; j < SJ_RT_LANES; j++) s += a->acc[j];
    return s;
}

/* Sum of n floats in double (what one sj_rt_dsum_add over the row gives,
 * without the struct). */
SJ_RT_FN double sj_rt_sum_f32(const float *x, int64_t n) {
    double acc[SJ_RT_LANES] = {0}, s = 0.0;
    int64_t i = 0, nb = n - n % SJ_RT_LANES;
    for (; i < nb; i += SJ_RT_LANES)
        for (int j = 0; j < SJ_RT_LANES; j++) acc[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < SJ_RT_LANES; j++) s += acc[j];
    return s;
}

/* Sum of (x - c)^2 in double. */
SJ_RT_FN double sj_rt_sumsq_f32(const float *x, double c, int64_t n) {
    double acc[SJ_RT_LANES] = {0}, s = 0.0;
    int64_t i = 0, nb = n - n % SJ_RT_LANES;
    for (; i < nb; i += SJ_RT_LANES)
        for (int j = 0; j < SJ_RT_LANES; j++) {
            double d = x[i + j] - c;
            acc[j] += d * d;
        }
    for (; i < n; i++) s += (x[i] - c) * (x[i] - c);
    for (int j = 0; j < SJ_RT_LANES; j++) s += acc[j];
    return s;
}

/* NaN-propagating max of n floats (-inf for n = 0). Written with GCC/Clang
 * vector extensions in the target's own vector width (64 bytes with
 * AVX-512, 32 with AVX, 16 otherwise: SSE, NEON), 32 floats an iteration
 * over 2, 4 or 8 accumulators: the auto-vectoriser turns the scalar form
 * into slow code at -O3, and a vector wider than the target's registers is
 * lowered through the stack (a 64-byte vector made this max 9x slower on an
 * AVX2 core, 1 ns an element). Alongside the max, a lane sum of v - v turns
 * NaN if any v is NaN or infinite; only then does a scalar pass decide
 * exactly. */
#ifndef __CUDACC__
#if defined(__AVX512F__)
#define SJ_RT_VBYTES 64
#elif defined(__AVX__)
#define SJ_RT_VBYTES 32
#else
#define SJ_RT_VBYTES 16
#endif
#define SJ_RT_VLANES (SJ_RT_VBYTES / 4)
#define SJ_RT_VACC (32 / SJ_RT_VLANES) /* accumulators: 32 floats an iteration */
typedef float sj_rt_vf __attribute__((vector_size(SJ_RT_VBYTES)));
typedef int32_t sj_rt_vi __attribute__((vector_size(SJ_RT_VBYTES)));

/* *a = max(*a, v) lane by lane (a macro: vectors passed by value can
 * change the ABI, which GCC warns about) */
#define SJ_RT_VMAX(a, v)                                                                           \
    do {                                                                                           \
        sj_rt_vi k_ = (a) > (v);                                                                   \
        (a) = (sj_rt_vf)(((sj_rt_vi)(a) & k_) | ((sj_rt_vi)(v) & ~k_));                             \
    } while (0)

static inline float sj_rt_max_f32(const float *x, int64_t n) {
    const float ninf = -INFINITY;
    const sj_rt_vf zero = {0}; /* whole vectors, not lane stores: gcc does not merge those */
    sj_rt_vf a[SJ_RT_VACC], p[SJ_RT_VACC], v;
    for (int k = 0; k < SJ_RT_VACC; k++) a[k] = zero + ninf, p[k] = zero;
    /* bounds as n - n % m, not i + m <= n: gcc 12 -O3 warns about the tail */
    int64_t i = 0, n32 = n - n % 32, nv = n - n % SJ_RT_VLANES;
    for (; i < n32; i += 32)
        for (int k = 0; k < SJ_RT_VACC; k++) {
            memcpy(&v, x + i + SJ_RT_VLANES * k, sizeof v);
            SJ_RT_VMAX(a[k], v);
            p[k] += v - v;
        }
    for (; i < nv; i += SJ_RT_VLANES) {
        memcpy(&v, x + i, sizeof v);
        SJ_RT_VMAX(a[0], v);
        p[0] += v - v;
    }
    for (int k = 1; k < SJ_RT_VACC; k++) {
        SJ_RT_VMAX(a[0], a[k]);
        p[0] += p[k];
    }
    float m = ninf, q = 0.0f;
    for (int j = 0; j < SJ_RT_VLANES; j++) {
        m = a[0][j] > m ? a[0][j] : m;
        q += p[0][j];
    }
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        q += x[i] - x[i];
    }
    if (q != q) { /* a NaN or an infinity somewhere: decide exactly */
        m = ninf;
        for (i = 0; i < n; i++) {
            if (x[i] != x[i]) return x[i];
            m = x[i] > m ? x[i] : m;
        }
    }
    return m;
}
#else
/* Device code: the same result with a plain loop (the first NaN, else the
 * largest value; -inf for n = 0). */
SJ_RT_FN float sj_rt_max_f32(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return x[i];
        m = x[i] > m ? x[i] : m;
    }
    return m;
}
#endif /* __CUDACC__ */

/* Combine two maxima, keeping a NaN. */
SJ_RT_FN float sj_rt_max_combine(float m, float v) { return (v > m || v != v) ? v : m; }

/* -- Programmatic dependent launch -------------------------------------------
 *
 * Every CUDA kernel of shapejit calls this first, before it touches global
 * memory. On compute capability 9.0 and later the runtime launches its
 * kernels with programmatic stream serialization (kernels/cuda/graph_cuda.c,
 * sj_cuda_launch_kernel), so a kernel's blocks may start while the kernel
 * before it in the stream still runs: this lets the next kernel launch in
 * turn, then waits until the kernels before this one have finished and
 * their writes are visible. Launch latency and block scheduling overlap the
 * previous kernel's tail; nothing else changes. Before 9.0, nothing. */
#if defined(__CUDACC__)
static __device__ __forceinline__ __attribute__((unused)) void sj_rt_grid_dep(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
#endif
}
#endif

#endif /* SJ_KERNEL_RT_H */
