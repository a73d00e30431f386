/* Half-precision conversions: IEEE binary16 (f16) and bfloat16 (bf16).
 *
 * sj_f16_to_f32, sj_f32_to_f16, sj_bf16_to_f32 and sj_f32_to_bf16 live in
 * base/sj_kernel_rt.h (the runtime header shared with generated kernels,
 * which documents their rounding); this header stays so existing includes
 * keep working.
 */
#ifndef SJ_HALF_H
#define SJ_HALF_H

#include "base/sj_kernel_rt.h"

#endif /* SJ_HALF_H */
