// One launch copies every block of every part named by a swap descriptor.
//
// The work is a flat range of `units`: vectors of T (16, 8, 4, 2 or 1
// bytes), see swap_desc.cuh.  Each thread takes UNROLL units, issues all
// their loads before any store (so UNROLL loads per thread are in flight
// across PCIe at once), then stores them.  Each load instruction of a warp
// covers 32 consecutive units, so warps read and write contiguous runs
// inside a block.  The grid is a CTA budget chosen by the host; it
// strides over the whole range, so a 2 MiB block spreads over every CTA and
// many small blocks pack into one CTA's iteration.
#include "swap_desc.cuh"

typedef unsigned long long u64;
typedef long long i64;

struct SwapPart {
    u64 src;
    u64 dst;
    i64 src_stride;
    i64 dst_stride;
    u64 units;
    u64 first_unit;
};

// Cache policy of the copy.  Each byte is read once and written once.  The
// variants exist so benchmarks can compare them (see benchmarks/NOTES.md);
// the defaults are the measured best.
//   CUPY_SWAP_LOAD : 0 plain ld.global, 1 ld.global.cs (evict first),
//                    2 ld.global.nc (read-only path)
//   CUPY_SWAP_STORE: 0 plain st.global, 1 st.global.cs (evict first)
#ifndef CUPY_SWAP_LOAD
#define CUPY_SWAP_LOAD 0
#endif
#ifndef CUPY_SWAP_STORE
#define CUPY_SWAP_STORE 0
#endif
// Work order: 0 = unit k of a thread is one grid stride after unit k-1;
// 1 = each warp copies 32 x UNROLL consecutive units (one contiguous run
// per CTA iteration, fewer distinct pages in flight).
#ifndef CUPY_SWAP_WARP_RUNS
#define CUPY_SWAP_WARP_RUNS 1
#endif

template <typename T>
__device__ __forceinline__ T load_unit(const T* p) {
#if CUPY_SWAP_LOAD == 1
    return __ldcs(p);
#elif CUPY_SWAP_LOAD == 2
    return __ldg(p);
#else
    return *p;
#endif
}
template <typename T>
__device__ __forceinline__ void store_unit(T* p, T v) {
#if CUPY_SWAP_STORE == 1
    __stcs(p, v);
#else
    *p = v;
#endif
}

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

// n_parts and units_per_pair come as arguments (they are fixed per layout,
// also across graph replays) so the part table, the pairs and the data can be
// fetched without first waiting for the header; n_pairs too, except in graph
// replays, which pass -1 and read the current count from header word 0.
// first_pair skips that many pairs of the descriptor, so one descriptor can
// serve several launches over consecutive pair ranges (staged swap-ins
// scatter chunk by chunk as the copy engines deliver them).
template <typename T, int UNROLL>
__device__ __forceinline__ void swap_blocks(const u64* __restrict__ desc, int n_parts, u64 units_per_pair,
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

    const i64* pairs = reinterpret_cast<const i64*>(part_words + (u64)n_parts * CUPY_SWAP_PART_WORDS) + 2 * first_pair;
    const u64 total = n_pairs * units_per_pair;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    // 32-bit division is several times cheaper than 64-bit; use it whenever
    // the whole range fits (every realistic swap below 64 GiB of 16 B units).
    const bool narrow = total <= 0xffffffffull;

#if CUPY_SWAP_WARP_RUNS
    // Warp w of the grid copies runs of 32 x UNROLL units; lane l takes
    // units l, l + 32, ... of the run, so each load instruction of a warp
    // covers 32 consecutive units.
    const u64 lane = threadIdx.x & 31;
    const u64 warps = stride >> 5;
    const u64 run = 32ull * UNROLL;
    const u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    for (u64 base = first * run + lane; base < total; base += warps * run) {
        const u64 step = 32;
#else
    const u64 step = stride;
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < total; base += stride * UNROLL) {
#endif
        const T* src[UNROLL];
        T* dst[UNROLL];
        T val[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const u64 unit = base + (u64)k * step;
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
                const i64 s = pairs[2 * pair];
                const i64 d = pairs[2 * pair + 1];
                src[k] = reinterpret_cast<const T*>(part.src + s * part.src_stride) + in_block;
                dst[k] = reinterpret_cast<T*>(part.dst + d * part.dst_stride) + in_block;
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            if (src[k]) val[k] = load_unit(src[k]);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            if (dst[k]) store_unit(dst[k], val[k]);
        }
    }
}

// Plain C names so the host can look kernels up without name mangling:
// cupy_swap_w<bytes per unit>_u<loads in flight per thread>.  Eight loads in
// flight need more registers than 64 per thread, so those kernels cap their
// CTAs at 512 threads instead of spilling (the host reads the cap).
#define CUPY_SWAP_KERNEL(T, WIDTH, UNROLL)                                        \
    extern "C" __global__ void __launch_bounds__((UNROLL) >= 8 ? 512 : 1024)                            \
    cupy_swap_w##WIDTH##_u##UNROLL(const u64* __restrict__ desc, int n_parts,     \
                                   u64 units_per_pair, i64 n_pairs, i64 first_pair) { \
        swap_blocks<T, UNROLL>(desc, n_parts, units_per_pair, n_pairs, first_pair); \
    }

#define CUPY_SWAP_WIDTH(T, WIDTH)   \
    CUPY_SWAP_KERNEL(T, WIDTH, 2)   \
    CUPY_SWAP_KERNEL(T, WIDTH, 4)   \
    CUPY_SWAP_KERNEL(T, WIDTH, 8)

CUPY_SWAP_WIDTH(uint4, 16)
CUPY_SWAP_WIDTH(uint2, 8)
CUPY_SWAP_WIDTH(unsigned int, 4)
CUPY_SWAP_WIDTH(unsigned short, 2)
CUPY_SWAP_WIDTH(unsigned char, 1)

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
