/* Eager elementwise kernels (included by eager.cu): unary, binary and
 * comparisons, where, same-dtype copy, cast, zero fill.
 *
 * Two engines run a functor f(a, b, c) -> y over the elements:
 * - ew_contig (_c kernels): the flattened index i is the element offset of
 *   every non-scalar operand; with p.vec, 4 elements per access;
 * - ew_strided (_s kernels): offsets from the collapsed shape, with 32-bit
 *   magic-number division when n < 2^31.
 * _c kernels are specialized per op (the op switch sits outside the loop);
 * _s kernels switch on the (uniform) op per element, their cost being the
 * index arithmetic anyway.
 */
#ifndef SJ_EAGER_ELEMENTWISE_CUH
#define SJ_EAGER_ELEMENTWISE_CUH

#include "kernels/cuda/eager_common.cuh"

/* 4 elements as one aligned access (16 bytes at most per instruction). */
template <class T> struct alignas(sizeof(T) * 4 > 16 ? 16 : sizeof(T) * 4) vec4 {
    T v[4];
};

template <class T> SJ_DEV void load4(const T *p, bool scalar, int64_t v, T (&out)[4]) {
    if (scalar) {
        T s = p[0];
#pragma unroll
        for (int j = 0; j < 4; j++) out[j] = s;
    } else {
        vec4<T> t = reinterpret_cast<const vec4<T> *>(p)[v];
#pragma unroll
        for (int j = 0; j < 4; j++) out[j] = t.v[j];
    }
}

/* NIN inputs (0..3) of stored types A, B, C; output Y. Unused input types
 * are never read. */
template <int NIN, class Y, class A, class B, class C, class F>
SJ_DEV void ew_contig(const sj_ek_ew &p, const F &f) {
    Y *y = reinterpret_cast<Y *>(p.ptr[0]);
    const A *a = reinterpret_cast<const A *>(p.ptr[1]);
    const B *b = reinterpret_cast<const B *>(p.ptr[2]);
    const C *c = reinterpret_cast<const C *>(p.ptr[3]);
    const bool sa = p.stride[1][0] == 0, sb = p.stride[2][0] == 0, sc = p.stride[3][0] == 0;
    const int64_t n = p.n, t = gtid(), nt = gthreads();
    int64_t done = 0;
    if (p.vec) {
        const int64_t nv = n >> 2;
        for (int64_t v = t; v < nv; v += nt) {
            A av[4] = {};
            B bv[4] = {};
            C cv[4] = {};
            if (NIN >= 1) load4(a, sa, v, av);
            if (NIN >= 2) load4(b, sb, v, bv);
            if (NIN >= 3) load4(c, sc, v, cv);
            vec4<Y> yv;
#pragma unroll
            for (int j = 0; j < 4; j++) yv.v[j] = f(av[j], bv[j], cv[j]);
            reinterpret_cast<vec4<Y> *>(y)[v] = yv;
        }
        done = nv << 2;
    }
    for (int64_t i = done + t; i < n; i += nt) {
        A av = NIN >= 1 ? a[sa ? 0 : i] : A();
        B bv = NIN >= 2 ? b[sb ? 0 : i] : B();
        C cv = NIN >= 3 ? c[sc ? 0 : i] : C();
        y[i] = f(av, bv, cv);
    }
}

template <int NIN, class Y, class A, class B, class C, class F>
SJ_DEV void ew_strided(const sj_ek_ew &p, const F &f) {
    Y *y = reinterpret_cast<Y *>(p.ptr[0]);
    const A *a = reinterpret_cast<const A *>(p.ptr[1]);
    const B *b = reinterpret_cast<const B *>(p.ptr[2]);
    const C *c = reinterpret_cast<const C *>(p.ptr[3]);
    int64_t off[NIN + 1];
    if (p.idx32) {
        const uint32_t n = (uint32_t)p.n, nt = (uint32_t)gthreads();
        for (uint32_t i = (uint32_t)gtid(); i < n; i += nt) {
            ew_offsets32<NIN + 1>(p, i, off);
            A av = NIN >= 1 ? a[off[NIN >= 1 ? 1 : 0]] : A();
            B bv = NIN >= 2 ? b[off[NIN >= 2 ? 2 : 0]] : B();
            C cv = NIN >= 3 ? c[off[NIN >= 3 ? 3 : 0]] : C();
            y[off[0]] = f(av, bv, cv);
        }
    } else {
        const int64_t n = p.n, nt = gthreads();
        for (int64_t i = gtid(); i < n; i += nt) {
            ew_offsets64<NIN + 1>(p, i, off);
            A av = NIN >= 1 ? a[off[NIN >= 1 ? 1 : 0]] : A();
            B bv = NIN >= 2 ? b[off[NIN >= 2 ? 2 : 0]] : B();
            C cv = NIN >= 3 ? c[off[NIN >= 3 ? 3 : 0]] : C();
            y[off[0]] = f(av, bv, cv);
        }
    }
}

/* Both engines behind one switch: STRIDED picks ew_strided. */
template <bool STRIDED, int NIN, class Y, class A, class B, class C, class F>
SJ_DEV void ew_run(const sj_ek_ew &p, const F &f) {
    if (STRIDED)
        ew_strided<NIN, Y, A, B, C>(p, f);
    else
        ew_contig<NIN, Y, A, B, C>(p, f);
}

/* -- Unary ------------------------------------------------------------------ */

template <class T> struct un_fn {
    int op;
    __device__ __forceinline__ typename T::S operator()(typename T::S x, uint8_t, uint8_t) const {
        if constexpr (is_float_dt<T>::value)
            return T::st(un_f(op, T::ld(x)));
        else
            return T::st(un_i(op, T::ld(x)));
    }
};

template <class T, int OP> struct un_fn_c {
    __device__ __forceinline__ typename T::S operator()(typename T::S x, uint8_t, uint8_t) const {
        if constexpr (is_float_dt<T>::value)
            return T::st(un_f(OP, T::ld(x)));
        else
            return T::st(un_i(OP, T::ld(x)));
    }
};

template <class T> SJ_DEV void unary_s(const sj_ek_ew &p) {
    typedef typename T::S S;
    ew_strided<1, S, S, uint8_t, uint8_t>(p, un_fn<T>{p.op});
}

#define SJ_EK_UN_CASE(OP)                                                                          \
    case OP: ew_contig<1, S, S, uint8_t, uint8_t>(p, un_fn_c<T, OP>()); break;

template <class T> SJ_DEV void unary_c(const sj_ek_ew &p) {
    typedef typename T::S S;
    if constexpr (is_float_dt<T>::value) {
        switch (p.op) {
            SJ_EK_UN_CASE(SJ_OP_NEG)
            SJ_EK_UN_CASE(SJ_OP_ABS)
            SJ_EK_UN_CASE(SJ_OP_EXP)
            SJ_EK_UN_CASE(SJ_OP_LOG)
            SJ_EK_UN_CASE(SJ_OP_SQRT)
            SJ_EK_UN_CASE(SJ_OP_RSQRT)
            SJ_EK_UN_CASE(SJ_OP_TANH)
            SJ_EK_UN_CASE(SJ_OP_SIGMOID)
            SJ_EK_UN_CASE(SJ_OP_RELU)
            SJ_EK_UN_CASE(SJ_OP_GELU)
            SJ_EK_UN_CASE(SJ_OP_GELU_TANH)
            SJ_EK_UN_CASE(SJ_OP_SILU)
        default: break;
        }
    } else {
        switch (p.op) {
            SJ_EK_UN_CASE(SJ_OP_NEG)
            SJ_EK_UN_CASE(SJ_OP_ABS)
            SJ_EK_UN_CASE(SJ_OP_RELU)
        default: break;
        }
    }
}

/* -- Binary and comparisons --------------------------------------------------- */

template <class T> struct bin_fn {
    int op;
    __device__ __forceinline__ typename T::S operator()(typename T::S a, typename T::S b, uint8_t) const {
        if constexpr (is_float_dt<T>::value)
            return T::st(bin_f(op, T::ld(a), T::ld(b)));
        else
            return T::st(bin_i(op, T::ld(a), T::ld(b)));
    }
};

template <class T> struct cmp_fn {
    int op;
    __device__ __forceinline__ uint8_t operator()(typename T::S a, typename T::S b, uint8_t) const {
        return cmp_op(op, T::ld(a), T::ld(b));
    }
};

template <class T, int OP> struct bin_fn_c {
    __device__ __forceinline__ typename T::S operator()(typename T::S a, typename T::S b, uint8_t) const {
        if constexpr (is_float_dt<T>::value)
            return T::st(bin_f(OP, T::ld(a), T::ld(b)));
        else
            return T::st(bin_i(OP, T::ld(a), T::ld(b)));
    }
};

template <class T, int OP> struct cmp_fn_c {
    __device__ __forceinline__ uint8_t operator()(typename T::S a, typename T::S b, uint8_t) const {
        return cmp_op(OP, T::ld(a), T::ld(b));
    }
};

template <class T> SJ_DEV void binary_s(const sj_ek_ew &p) {
    typedef typename T::S S;
    if (is_cmp_op(p.op))
        ew_strided<2, uint8_t, S, S, uint8_t>(p, cmp_fn<T>{p.op});
    else if (T::code != SJ_BOOL)
        ew_strided<2, S, S, S, uint8_t>(p, bin_fn<T>{p.op});
}

#define SJ_EK_BIN_CASE(OP)                                                                         \
    case OP: ew_contig<2, S, S, S, uint8_t>(p, bin_fn_c<T, OP>()); break;
#define SJ_EK_CMP_CASE(OP)                                                                         \
    case OP: ew_contig<2, uint8_t, S, S, uint8_t>(p, cmp_fn_c<T, OP>()); break;

template <class T> SJ_DEV void binary_c(const sj_ek_ew &p) {
    typedef typename T::S S;
    switch (p.op) {
        SJ_EK_CMP_CASE(SJ_OP_EQ)
        SJ_EK_CMP_CASE(SJ_OP_NE)
        SJ_EK_CMP_CASE(SJ_OP_LT)
        SJ_EK_CMP_CASE(SJ_OP_LE)
        SJ_EK_CMP_CASE(SJ_OP_GT)
        SJ_EK_CMP_CASE(SJ_OP_GE)
    default: break;
    }
    if constexpr (T::code != SJ_BOOL) {
        switch (p.op) {
            SJ_EK_BIN_CASE(SJ_OP_ADD)
            SJ_EK_BIN_CASE(SJ_OP_SUB)
            SJ_EK_BIN_CASE(SJ_OP_MUL)
            SJ_EK_BIN_CASE(SJ_OP_DIV)
            SJ_EK_BIN_CASE(SJ_OP_MAXIMUM)
            SJ_EK_BIN_CASE(SJ_OP_MINIMUM)
            SJ_EK_BIN_CASE(SJ_OP_POW)
        default: break;
        }
    }
}

/* -- Where, copy, fill ------------------------------------------------------------ */

template <class S> struct where_fn {
    __device__ __forceinline__ S operator()(uint8_t c, S a, S b) const { return c ? a : b; }
};
template <class S> struct copy_fn {
    __device__ __forceinline__ S operator()(S x, uint8_t, uint8_t) const { return x; }
};
template <class S> struct zero_fn {
    __device__ __forceinline__ S operator()(uint8_t, uint8_t, uint8_t) const { return S(0); }
};

template <class E, bool STRIDED> SJ_DEV void where_k(const sj_ek_ew &p) {
    typedef typename E::S S;
    ew_run<STRIDED, 3, S, uint8_t, S, S>(p, where_fn<S>());
}

/* -- Cast ----------------------------------------------------------------------------
 * As kernels/cpu/elementwise.c: to a float through f32 (ints rounded to f32
 * first); float -> int truncates toward zero, NaN gives 0, saturates; int ->
 * int wraps; anything -> bool is != 0; bool reads as 0/1. */

template <class F> SJ_DEV float cast_to_f32(typename F::S x) {
    if constexpr (is_float_dt<F>::value)
        return F::ld(x);
    else
        return (float)F::ld(x);
}

template <class F, class T> struct cast_fn {
    __device__ __forceinline__ typename T::S operator()(typename F::S x, uint8_t, uint8_t) const {
        if constexpr (is_float_dt<T>::value) {
            return T::st(cast_to_f32<F>(x));
        } else if constexpr (is_float_dt<F>::value) {
            float f = F::ld(x);
            if constexpr (T::code == SJ_BOOL)
                return (typename T::S)(f != 0.0f);
            else
                return T::st(sj_rt_f32_to_int(f, T::code == SJ_I32));
        } else {
            return T::st(F::ld(x));
        }
    }
};

#define SJ_EK_CAST_CASE(TO)                                                                        \
    case TO::code:                                                                                 \
        ew_run<STRIDED, 1, typename TO::S, typename F::S, uint8_t, uint8_t>(p, cast_fn<F, TO>()); \
        break;

template <class F, bool STRIDED> SJ_DEV void cast_k(const sj_ek_ew &p) {
    switch (p.aux) {
        SJ_EK_CAST_CASE(dt_f32)
        SJ_EK_CAST_CASE(dt_f16)
        SJ_EK_CAST_CASE(dt_bf16)
        SJ_EK_CAST_CASE(dt_i32)
        SJ_EK_CAST_CASE(dt_i64)
        SJ_EK_CAST_CASE(dt_bool)
    default: break;
    }
}

/* -- Kernel definitions (X-macro families of eager_abi.cuh) ----------------------- */

/* The kernel waits for its stream's earlier kernels (sj_rt_grid_dep), then
 * runs the body that follows the macro. */
#define SJ_EK_EW_KERNEL(fam, tag)                                                                  \
    static __device__ __forceinline__ void sj_ek_body_##fam##_##tag(const sj_ek_ew &a);            \
    extern "C" __global__ void __launch_bounds__(SJ_EK_THREADS)                                    \
        sj_ek_##fam##_##tag(const __grid_constant__ sj_ek_ew a) {                                  \
        sj_rt_grid_dep();                                                                          \
        sj_ek_body_##fam##_##tag(a);                                                               \
    }                                                                                              \
    static __device__ __forceinline__ void sj_ek_body_##fam##_##tag(const sj_ek_ew &a)

#define SJ_EK_DEF_unary_c(tag) SJ_EK_EW_KERNEL(unary_c, tag) { unary_c<dt_##tag>(a); }
#define SJ_EK_DEF_unary_s(tag) SJ_EK_EW_KERNEL(unary_s, tag) { unary_s<dt_##tag>(a); }
#define SJ_EK_DEF_binary_c(tag) SJ_EK_EW_KERNEL(binary_c, tag) { binary_c<dt_##tag>(a); }
#define SJ_EK_DEF_binary_s(tag) SJ_EK_EW_KERNEL(binary_s, tag) { binary_s<dt_##tag>(a); }
#define SJ_EK_DEF_where_c(tag) SJ_EK_EW_KERNEL(where_c, tag) { where_k<dt_##tag, false>(a); }
#define SJ_EK_DEF_where_s(tag) SJ_EK_EW_KERNEL(where_s, tag) { where_k<dt_##tag, true>(a); }
#define SJ_EK_DEF_copy_s(tag)                                                                      \
    SJ_EK_EW_KERNEL(copy_s, tag) {                                                                 \
        typedef dt_##tag::S S;                                                                     \
        ew_strided<1, S, S, uint8_t, uint8_t>(a, copy_fn<S>());                                    \
    }
#define SJ_EK_DEF_fill_s(tag)                                                                      \
    SJ_EK_EW_KERNEL(fill_s, tag) {                                                                 \
        typedef dt_##tag::S S;                                                                     \
        ew_strided<0, S, uint8_t, uint8_t, uint8_t>(a, zero_fn<S>());                              \
    }
#define SJ_EK_DEF_cast_c(tag) SJ_EK_EW_KERNEL(cast_c, tag) { cast_k<dt_##tag, false>(a); }
#define SJ_EK_DEF_cast_s(tag) SJ_EK_EW_KERNEL(cast_s, tag) { cast_k<dt_##tag, true>(a); }

#endif /* SJ_EAGER_ELEMENTWISE_CUH */
