// One launch copies every block of every part of a swap.
//
// The work is a flat range of units: vectors of T (16, 8, 4, 2 or 1 bytes),
// see swap_abi.cuh.  Warp w of the grid copies runs of 32 x UNROLL
// consecutive units; lane l takes units l, l + 32, ... of the run, so each
// load instruction of a warp covers 32 consecutive units.  A thread issues
// all its UNROLL loads before any store, so UNROLL loads per thread are in
// flight across PCIe at once.  The grid strides over the range, so a 2 MiB
// block spreads over every CTA and many small blocks pack into one CTA's
// iteration.  Loads and stores are plain ld/st.global: cache hints and other
// orders measured no better (benchmarks/NOTES.md, items 4-6).
#include "swap_abi.cuh"

// Index of the part that owns `unit` (0 <= unit < units_per_pair): the last
// part whose first_unit <= unit.  Parts are few (layers x K/V), so a binary
// search over shared memory is a handful of steps.
__device__ __forceinline__ int find_part(const SwapPart* parts, int n_parts, u64 unit) {
    int lo = 0, hi = n_parts - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (parts[mid].first_unit <= unit) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Copy units [0, n_pairs * units_per_pair): `parts` in shared memory,
// `pairs` anywhere the SM can read (kernel parameters, device memory, or a
// pinned buffer's device alias).
template <typename T>
__device__ __forceinline__ void copy_units(const SwapPart* parts, int n_parts, u64 units_per_pair,
                                           const i64* __restrict__ pairs, u64 n_pairs) {
    const u64 total = n_pairs * units_per_pair;
    // 32-bit division is several times cheaper than 64-bit; use it whenever
    // the whole range fits (every realistic swap below 64 GiB of 16 B units).
    const bool narrow = total <= 0xffffffffull;
    const u64 lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const u64 run = 32ull * CUPY_SWAP_UNROLL;
    const u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    for (u64 base = first * run + lane; base < total; base += warps * run) {
        const T* src[CUPY_SWAP_UNROLL];
        T* dst[CUPY_SWAP_UNROLL];
        T val[CUPY_SWAP_UNROLL];
#pragma unroll
        for (int k = 0; k < CUPY_SWAP_UNROLL; ++k) {
            const u64 unit = base + 32ull * k;
            src[k] = nullptr;
            dst[k] = nullptr;
            if (unit < total) {
                u64 pair, rest;
                if (narrow) {
                    const unsigned u = (unsigned)unit, per = (unsigned)units_per_pair;
                    pair = u / per;
                    rest = u - (unsigned)pair * per;
                } else {
                    pair = unit / units_per_pair;
                    rest = unit - pair * units_per_pair;
                }
                const SwapPart& part = parts[find_part(parts, n_parts, rest)];
                const u64 in_block = rest - part.first_unit;
                src[k] = reinterpret_cast<const T*>(part.src + pairs[2 * pair] * part.src_stride) + in_block;
                dst[k] = reinterpret_cast<T*>(part.dst + pairs[2 * pair + 1] * part.dst_stride) + in_block;
            }
        }
#pragma unroll
        for (int k = 0; k < CUPY_SWAP_UNROLL; ++k) {
            if (src[k]) val[k] = *src[k];
        }
#pragma unroll
        for (int k = 0; k < CUPY_SWAP_UNROLL; ++k) {
            if (dst[k]) *dst[k] = val[k];
        }
    }
}

// Descriptor form.  n_parts and units_per_pair come as arguments (fixed per
// layout, also across graph replays) so the part table, the pairs and the
// data can be fetched without first waiting for the header; n_pairs too,
// except in graph replays, which pass -1 and read the current count from
// word 0.  first_pair skips that many pairs, so one descriptor can serve
// several launches over consecutive pair ranges (staged swaps scatter chunk
// by chunk as the copy engines deliver them).
template <typename T>
__device__ __forceinline__ void swap_descriptor(const u64* __restrict__ desc, int n_parts, u64 units_per_pair,
                                                i64 n_pairs_arg, i64 first_pair) {
    __shared__ SwapPart parts[CUPY_SWAP_MAX_PARTS];
    __shared__ u64 header_pairs;
    if (n_pairs_arg < 0 && threadIdx.x == 0) header_pairs = desc[0];
    const u64* part_words = desc + CUPY_SWAP_HEADER_WORDS;
    for (int w = threadIdx.x; w < n_parts * CUPY_SWAP_PART_WORDS; w += blockDim.x) {
        reinterpret_cast<u64*>(parts)[w] = part_words[w];
    }
    __syncthreads();
    const u64 n_pairs = n_pairs_arg < 0 ? header_pairs : (u64)n_pairs_arg;
    const i64* pairs = reinterpret_cast<const i64*>(part_words + (u64)n_parts * CUPY_SWAP_PART_WORDS);
    copy_units<T>(parts, n_parts, units_per_pair, pairs + 2 * first_pair, n_pairs);
}

// Inline form: everything arrives in the parameter (a __grid_constant__
// struct is read in place from the constant bank, not copied per thread).
template <typename T, int P, int N>
__device__ __forceinline__ void swap_inline(const SwapInline<P, N>& a) {
    __shared__ SwapPart parts[P];
    const int n_parts = (int)a.header.n_parts;
    for (int w = threadIdx.x; w < n_parts * CUPY_SWAP_PART_WORDS; w += blockDim.x) {
        reinterpret_cast<u64*>(parts)[w] = reinterpret_cast<const u64*>(a.parts)[w];
    }
    __syncthreads();
    copy_units<T>(parts, n_parts, a.header.units_per_pair, a.pairs, (u64)a.header.n_pairs);
}

// A GPU-resident mapping: header and part table in the parameter, pairs by
// address; copies only if this swap's check passed (see swap_abi.cuh).
template <typename T, int P>
__device__ __forceinline__ void swap_byref(const SwapByRef<P>& a) {
    __shared__ SwapPart parts[P];
    __shared__ int passed;
    if (threadIdx.x == 0) {
        const volatile SwapStatus* status = a.status;
        passed = status->seq == a.seq && status->kind == 0;
    }
    const int n_parts = (int)a.header.n_parts;
    for (int w = threadIdx.x; w < n_parts * CUPY_SWAP_PART_WORDS; w += blockDim.x) {
        reinterpret_cast<u64*>(parts)[w] = reinterpret_cast<const u64*>(a.parts)[w];
    }
    __syncthreads();
    if (!passed) return;
    copy_units<T>(parts, n_parts, a.header.units_per_pair, a.pairs, (u64)a.header.n_pairs);
}

// Plain C names so the host can look kernels up without name mangling:
// cupy_swap_w<bytes per unit> (descriptor) and cupy_swap_w<bytes>_p<P>_n<N>
// (inline tier P parts, N pairs).
#define CUPY_SWAP_INLINE_KERNEL(P, N)                                                                      \
    extern "C" __global__ void __launch_bounds__(CUPY_SWAP_MAX_THREADS)                                    \
        CUPY_SWAP_NAME(P, N)(const __grid_constant__ SwapInline<P, N> a) {                                 \
        swap_inline<CUPY_SWAP_T, P, N>(a);                                                                 \
    }

// Parameters over 4 KiB: CUDA 12.1 and later.
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))
#define CUPY_SWAP_TIERS_HERE(X) CUPY_SWAP_TIERS(X)
#else
#define CUPY_SWAP_TIERS_HERE(X) X(4, 16) X(16, 192)
#endif

#define CUPY_SWAP_BYREF_KERNEL(P)                                                                          \
    extern "C" __global__ void __launch_bounds__(CUPY_SWAP_MAX_THREADS)                                    \
        CUPY_SWAP_BYREF_NAME(P)(const __grid_constant__ SwapByRef<P> a) {                                  \
        swap_byref<CUPY_SWAP_T, P>(a);                                                                     \
    }

#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))
#define CUPY_SWAP_BYREF_TIERS_HERE(X) CUPY_SWAP_BYREF_TIERS(X)
#else
#define CUPY_SWAP_BYREF_TIERS_HERE(X) X(16)
#endif

#define CUPY_SWAP_WIDTH(TYPE, WIDTH)                                                                       \
    extern "C" __global__ void __launch_bounds__(CUPY_SWAP_MAX_THREADS) cupy_swap_w##WIDTH(                \
        const u64* __restrict__ desc, int n_parts, u64 units_per_pair, i64 n_pairs, i64 first_pair) {      \
        swap_descriptor<TYPE>(desc, n_parts, units_per_pair, n_pairs, first_pair);                         \
    }

CUPY_SWAP_WIDTH(uint4, 16)
CUPY_SWAP_WIDTH(uint2, 8)
CUPY_SWAP_WIDTH(unsigned int, 4)
CUPY_SWAP_WIDTH(unsigned short, 2)
CUPY_SWAP_WIDTH(unsigned char, 1)

#define CUPY_SWAP_T uint4
#define CUPY_SWAP_NAME(P, N) cupy_swap_w16_p##P##_n##N
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w16_ref##P
CUPY_SWAP_TIERS_HERE(CUPY_SWAP_INLINE_KERNEL)
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_NAME
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T uint2
#define CUPY_SWAP_NAME(P, N) cupy_swap_w8_p##P##_n##N
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w8_ref##P
CUPY_SWAP_TIERS_HERE(CUPY_SWAP_INLINE_KERNEL)
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_NAME
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T unsigned int
#define CUPY_SWAP_NAME(P, N) cupy_swap_w4_p##P##_n##N
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w4_ref##P
CUPY_SWAP_TIERS_HERE(CUPY_SWAP_INLINE_KERNEL)
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_NAME
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T unsigned short
#define CUPY_SWAP_NAME(P, N) cupy_swap_w2_p##P##_n##N
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w2_ref##P
CUPY_SWAP_TIERS_HERE(CUPY_SWAP_INLINE_KERNEL)
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_NAME
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T unsigned char
#define CUPY_SWAP_NAME(P, N) cupy_swap_w1_p##P##_n##N
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w1_ref##P
CUPY_SWAP_TIERS_HERE(CUPY_SWAP_INLINE_KERNEL)
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_NAME
#undef CUPY_SWAP_BYREF_NAME

// Descriptor upload: copy `n16` 16-byte words from pinned host memory (its
// device alias) to device memory with SM loads.  A cudaMemcpyAsync would do
// the same on a copy engine, but copy engines run their queue in order: a
// 20 KB descriptor copy can wait behind a 40 MB transfer issued on another
// stream (a concurrent swap-in), stalling the kernel that needs it.
extern "C" __global__ void __launch_bounds__(256) cupy_swap_fetch(const uint4* __restrict__ src,
                                                                  uint4* __restrict__ dst, u64 n16) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}

// Check a GPU-resident mapping (one CTA, n <= CHECK_MAX_ROWS): every index
// in range, no destination block twice; the verdict goes to `status`, its
// `seq` word last, so a reader that sees this swap's seq sees the rest.  The
// rows it read go to `rows` (library memory), which the copy kernel reads:
// the caller's array may change after the check without reaching the copy.
// Duplicates: the rows' (block, row) keys are sorted in shared memory
// (bitonic), and equal blocks end up next to each other, lowest rows first.
extern "C" __global__ void __launch_bounds__(CUPY_SWAP_MAX_THREADS)
    cupy_swap_check(const i64* __restrict__ pairs, i64 n, i64 src_limit, i64 dst_limit, SwapStatus* status, i64 seq,
                    i64* __restrict__ rows) {
    __shared__ u64 keys[CUPY_SWAP_CHECK_MAX_ROWS];
    __shared__ unsigned long long bad;  // (kind << 32) | position; the lowest wins
    const u64 row_mask = (1ull << CUPY_SWAP_CHECK_ROW_BITS) - 1;
    if (threadIdx.x == 0) bad = ~0ull;
    __syncthreads();
    int m = 1;
    while (m < n) m <<= 1;
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        u64 key = ~0ull;  // padding sorts last
        if (i < n) {
            const i64 s = pairs[2 * i], d = pairs[2 * i + 1];
            rows[2 * i] = s;
            rows[2 * i + 1] = d;
            if (s < 0 || s >= src_limit) {
                atomicMin(&bad, (1ull << 32) | (u64)i);
            } else if (d < 0 || d >= dst_limit) {
                atomicMin(&bad, (2ull << 32) | (u64)i);
            } else {
                key = ((u64)d << CUPY_SWAP_CHECK_ROW_BITS) | (u64)i;
            }
        }
        keys[i] = key;
    }
    __syncthreads();
    if (bad == ~0ull) {
        for (int k = 2; k <= m; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = threadIdx.x; i < m; i += blockDim.x) {
                    const int partner = i ^ j;
                    if (partner > i) {
                        const u64 a = keys[i], b = keys[partner];
                        if ((a > b) == ((i & k) == 0)) {
                            keys[i] = b;
                            keys[partner] = a;
                        }
                    }
                }
                __syncthreads();
            }
        }
        for (int i = threadIdx.x; i + 1 < n; i += blockDim.x) {
            if ((keys[i] >> CUPY_SWAP_CHECK_ROW_BITS) == (keys[i + 1] >> CUPY_SWAP_CHECK_ROW_BITS)) {
                atomicMin(&bad, (3ull << 32) | (u64)i);
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const i64 kind = bad == ~0ull ? 0 : (i64)(bad >> 32);
        const u64 at = bad & 0xffffffffull;
        volatile SwapStatus* out = status;
        out->kind = kind;
        out->row = kind == 3 ? (i64)(keys[at] & row_mask) : (i64)at;
        out->other = kind == 3 ? (i64)(keys[at + 1] & row_mask) : 0;
        out->value = kind == 3 ? (i64)(keys[at] >> CUPY_SWAP_CHECK_ROW_BITS) : kind ? rows[2 * at + kind - 1] : 0;
        __threadfence_system();
        out->seq = seq;
    }
}
