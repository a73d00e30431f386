/* Half-precision conversions: IEEE binary16 (f16) and bfloat16 (bf16).
 *
 * Both are stored as uint16_t. Widening to f32 is exact. Narrowing rounds to
 * nearest, ties to even; NaN stays NaN (made quiet, sign and the top payload
 * bits kept), infinities stay infinite, values past the largest finite
 * number round to infinity, and f16 subnormals are produced and read
 * exactly.
 *
 * Self-contained (only <stdint.h> and <string.h>) so generated kernels can
 * include it as it is.
 */
#ifndef SJ_HALF_H
#define SJ_HALF_H

#include <stdint.h>
#include <string.h>

/* -- f16 ---------------------------------------------------------------------
 *
 * Written without branches (all cases computed, then selected with masks)
 * so that loops over arrays vectorize.
 */

/* c ? a : b on bit patterns. */
static inline uint32_t sj_half_sel(int c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)(c != 0);
    return (a & m) | (b & ~m);
}

static inline float sj_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    /* normal: rebias the exponent by 127 - 15; inf/NaN (exponent 31) by
     * twice that, which lands on 255 and keeps the payload (the f16 quiet
     * bit becomes the f32 quiet bit) */
    uint32_t bits = (em << 13) + 0x38000000u;
    bits += sj_half_sel(em >= 0x7c00u, 0x38000000u, 0u);
    /* zero or subnormal: em * 2^-24, exact in f32 */
    float sub = (float)(int32_t)em * 0x1p-24f;
    uint32_t sbits;
    memcpy(&sbits, &sub, sizeof sbits);
    bits = sj_half_sel(em < 0x0400u, sbits, bits) | sign;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t sj_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    /* normal result (2^-14 <= |f| < 65520): round the 13 dropped bits to
     * nearest even, then rebias; a mantissa carry moves into the exponent */
    uint32_t norm = (x + 0xfffu + ((x >> 13) & 1u) - 0x38000000u) >> 13;
    /* subnormal result (|f| < 2^-14): |f| + 0.5 rounds |f| to a multiple of
     * 2^-24, the ulp of 0.5 (round to nearest even, the default mode) */
    float a;
    memcpy(&a, &x, sizeof a);
    a += 0.5f;
    uint32_t sub;
    memcpy(&sub, &a, sizeof sub);
    sub -= 0x3f000000u;
    uint32_t nan = 0x7e00u | ((x >> 13) & 0x3ffu); /* quiet, top payload bits */
    uint32_t r = sj_half_sel(x < 0x38800000u, sub, norm);
    r = sj_half_sel(x >= 0x477ff000u, 0x7c00u, r); /* >= 65520: inf */
    r = sj_half_sel(x > 0x7f800000u, nan, r);
    return (uint16_t)(r | sign);
}

/* -- bf16 ----------------------------------------------------------------- */

static inline float sj_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t sj_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);            /* round to nearest even */
    return (uint16_t)(x >> 16);
}

#endif /* SJ_HALF_H */
