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

// Check every row of a swap before any CTA writes (see swap_abi.cuh):
// bounds, then destinations through an open-addressing table of
// (block, lowest row) in dynamic shared memory, 2 x 32-bit words a slot,
// at least 2 n slots.  The first bad row wins: a destination seen before
// reports the later of the two rows, so the lowest report is the first row
// that repeats an earlier one.  Each row is read once per CTA, coalesced,
// and kept in shared memory behind the table (32-bit source and
// destination blocks: the host checks layouts with more blocks itself), so
// the copy reads its indices from there, wherever they came from (kernel
// parameter, device memory or a pinned slot's device alias).  The host
// sizes the dynamic shared memory with check_shared_bytes().  Returns the
// verdict, the same in every CTA.
#define CUPY_SWAP_EMPTY 0xffffffffu

__device__ __forceinline__ unsigned table_slots(u64 n_pairs) {
    unsigned slots = 2;
    while (slots < 2 * n_pairs) slots <<= 1;
    return slots;
}

// The rows a checked launch keeps: (source, destination) blocks of row i at
// [2 i] and [2 i + 1], after the check's table.
__device__ __forceinline__ unsigned* checked_rows(u64 n_pairs) {
    extern __shared__ unsigned table[];
    return table + 2 * table_slots(n_pairs);
}

// Write a verdict into the SwapStatus at `status` (seq last: a reader that
// sees this swap's seq sees its verdict), and a failure's seq into the
// board's alarm word after it.
__device__ void report(u64 status, i64 seq, i64 kind, i64 row, i64 value) {
    volatile SwapStatus* out = reinterpret_cast<SwapStatus*>(status);
    out->seq = 0;  // first: a reader of a reused record (a ring slot's) sees it change under it
    __threadfence_system();
    out->kind = kind;
    out->row = row;
    out->value = value;
    __threadfence_system();
    out->seq = seq;
    if (kind && out->alarm) {  // last: a reader that sees the alarm finds the record landed
        __threadfence_system();
        *reinterpret_cast<volatile i64*>(out->alarm) = seq;
    }
}

// One launch's rows and verdict: what the check reads, wherever the launch
// form found it.  first_src / first_dst: row threadIdx.x, read ahead with the
// launch's control record (have_first), so the rows cost no extra round trip.
struct Rows {
    u64 n;
    const i64* src_index;
    const i64* dst_index;
    int step;
    u64 status;  // SwapStatus address, 0: unchecked
    i64 seq;
    bool count_bad;  // the control record's count is out of [0, capacity] (kind 4: no row is read)
    i64 count;       // that count as it came
    bool have_first;
    i64 first_src, first_dst;
    bool padded;  // rows of -1 are padding: skipped (captured replays)
    i64 ring;     // captured replays: records in the failure ring at status (else 0)
};

// A captured replay's verdict.  Only a failure is written: into record
// f % ring of the ring at r.status, f being the failure's number (one more
// than the count in the ring's last row, which it then becomes), with f in
// the record's word 4 and the replay's number (seq) last.  Good replays write
// nothing, so however many run between two reads, no failure is pushed out
// by them.  Replays of one captured swap run one after another (its control
// record's seq says so too), so one thread's read-and-increment suffices.
__device__ void report_replay(const Rows& r, i64 kind, i64 row, i64 value) {
    if (!kind) return;
    volatile i64* failures = reinterpret_cast<volatile i64*>(r.status + (u64)r.ring * sizeof(SwapStatus));
    const i64 f = *failures + 1;
    volatile SwapStatus* out = reinterpret_cast<SwapStatus*>(r.status + (u64)(f % r.ring) * sizeof(SwapStatus));
    out->seq = 0;  // first: a reader sees the record change under it
    __threadfence_system();
    out->kind = kind;
    out->row = row;
    out->value = value;
    out->alarm = (u64)f;
    __threadfence_system();
    out->seq = r.seq;
    __threadfence_system();
    *failures = f;  // last: a reader that sees f finds record f landed
}

__device__ __forceinline__ void report_verdict(const Rows& r, i64 kind, i64 row, i64 value) {
    if (r.ring) {
        report_replay(r, kind, row, value);
    } else {
        report(r.status, r.seq, kind, row, value);
    }
}

__device__ bool check_rows(const SwapHeader& h, const Rows& r) {
    extern __shared__ unsigned table[];
    __shared__ unsigned long long bad;  // (row << 2) | kind; the lowest wins
    const u64 n = r.n;
    const unsigned slots = table_slots(n);
    unsigned* keys = table;
    unsigned* rows = table + slots;
    unsigned* kept = table + 2 * slots;
    if (threadIdx.x == 0) bad = ~0ull;
    for (unsigned i = threadIdx.x; i < slots; i += blockDim.x) {
        keys[i] = CUPY_SWAP_EMPTY;
        rows[i] = CUPY_SWAP_EMPTY;
    }
    __syncthreads();
    const int shift = 32 - __ffs(slots) + 1;  // slots == 1 << (32 - shift)
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        const bool ahead = r.have_first && i == threadIdx.x;
        const i64 s = ahead ? r.first_src : r.src_index[i * r.step];
        const i64 d = ahead ? r.first_dst : r.dst_index[i * r.step];
        if (r.padded && (s == -1 || d == -1)) {  // padding: no byte moves, no block is claimed
            kept[2 * i] = CUPY_SWAP_EMPTY;
            kept[2 * i + 1] = CUPY_SWAP_EMPTY;
            continue;
        }
        kept[2 * i] = (unsigned)s;
        kept[2 * i + 1] = (unsigned)d;
        if (s < 0 || s >= h.src_limit) {
            atomicMin(&bad, (i << 2) | 1);
        } else if (d < 0 || d >= h.dst_limit) {
            atomicMin(&bad, (i << 2) | 2);
        } else {
            const unsigned key = (unsigned)d;  // dst_limit < 2^32 - 1: the host checks on the host otherwise
            unsigned at = (key * 0x9E3779B1u) >> shift;
            for (;;) {
                const unsigned seen = atomicCAS(&keys[at], CUPY_SWAP_EMPTY, key);
                if (seen == CUPY_SWAP_EMPTY || seen == key) {
                    const unsigned earlier = atomicMin(&rows[at], (unsigned)i);
                    if (earlier != CUPY_SWAP_EMPTY) {
                        const u64 later = earlier > i ? earlier : i;
                        atomicMin(&bad, (later << 2) | 3);
                    }
                    break;
                }
                at = (at + 1) & (slots - 1);
            }
        }
    }
    __syncthreads();
    const unsigned long long verdict = bad;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const i64 kind = verdict == ~0ull ? 0 : (i64)(verdict & 3);
        const u64 row = verdict >> 2;
        report_verdict(r, kind, kind ? (i64)row : 0,
                       kind == 1 ? r.src_index[row * r.step] : kind ? r.dst_index[row * r.step] : 0);
    }
    return verdict == ~0ull;
}

// A kept row the check marked as padding (kept rows only: a block index
// below 2^32 - 1 is never CUPY_SWAP_EMPTY).
__device__ __forceinline__ bool padding(unsigned index) { return index == CUPY_SWAP_EMPTY; }
__device__ __forceinline__ bool padding(i64) { return false; }

// Copy units [0, n_pairs * units_per_pair): `parts` in shared memory,
// block indices anywhere the SM can read (kernel parameters, device memory,
// or a pinned buffer's device alias), row i at src_index[i * step] and
// dst_index[i * step].
template <typename T, typename I>
__device__ __forceinline__ void copy_units(const SwapPart* parts, int n_parts, u64 units_per_pair,
                                           const I* __restrict__ src_index, const I* __restrict__ dst_index,
                                           int step, u64 n_pairs) {
    const u64 total = n_pairs * units_per_pair;
    // 32-bit division is several times cheaper than 64-bit; use it whenever
    // the whole range fits (every realistic swap below 64 GiB of 16 B units).
    const bool narrow = total <= 0xffffffffull;
    const u64 lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const u64 run = 32ull * CUPY_SWAP_UNROLL;
    // Warp w of CTA b takes run w * gridDim.x + b: a short swap spreads over
    // every CTA (every SM) rather than filling the first CTA's warps.
    const u64 first = (u64)(threadIdx.x >> 5) * gridDim.x + blockIdx.x;
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
                if (padding(src_index[pair * step])) continue;
                const SwapPart& part = parts[find_part(parts, n_parts, rest)];
                const u64 in_block = rest - part.first_unit;
                src[k] = reinterpret_cast<const T*>(part.src + (u64)src_index[pair * step] * part.src_stride) + in_block;
                dst[k] = reinterpret_cast<T*>(part.dst + (u64)dst_index[pair * step] * part.dst_stride) + in_block;
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

// Copy a swap's rows, checked first when it has a status record: then the
// copy reads the rows the check kept in shared memory.  False when the
// check found a bad row or count (nothing is written).
template <typename T>
__device__ __forceinline__ bool check_and_copy(const SwapHeader& h, const SwapPart* parts, int n_parts,
                                               u64 units_per_pair, const Rows& r) {
    if (r.count_bad) {  // report it, read no row
        if (r.status && blockIdx.x == 0 && threadIdx.x == 0) report_verdict(r, 4, 0, r.count);
        return false;
    }
    if (!r.status) {
        copy_units<T, i64>(parts, n_parts, units_per_pair, r.src_index, r.dst_index, r.step, r.n);
        return true;
    }
    if (!check_rows(h, r)) return false;
    const unsigned* kept = checked_rows(r.n);
    copy_units<T, unsigned>(parts, n_parts, units_per_pair, kept, kept + 1, 2, r.n);
    return true;
}

// Part table into shared memory.
__device__ __forceinline__ void load_parts(SwapPart* parts, const SwapPart* from, int n_parts) {
    for (int w = threadIdx.x; w < n_parts * CUPY_SWAP_PART_WORDS; w += blockDim.x) {
        reinterpret_cast<u64*>(parts)[w] = reinterpret_cast<const u64*>(from)[w];
    }
}

// Slot form (SwapByRef with a control record) and by reference (no record:
// count, status and seq in the header; kept for the layouts' tests).  With a
// record, thread t reads record word t and row t together (one round trip
// over PCIe for host rows), then the count and where the rows are decide.
// The last CTA to finish writes seq into the record's done word.
template <typename T, int P>
__device__ __forceinline__ void swap_byref(const SwapByRef<P>& a) {
    __shared__ SwapPart parts[P];
    __shared__ i64 control[CUPY_SWAP_CONTROL_WORDS];
    const SwapHeader& h = a.header;
    const int n_parts = (int)h.n_parts;
    const u64 capacity = (u64)h.n_pairs;
    const i64* word = reinterpret_cast<const i64*>(a.control);
    load_parts(parts, a.parts, n_parts);
    Rows r = {capacity, a.src_index, a.dst_index, (int)a.index_step, h.status, h.seq, false, 0, false, 0, 0, false};
    if (word) {
        if (threadIdx.x < capacity) {
            r.first_src = a.src_index[threadIdx.x * r.step];
            r.first_dst = a.dst_index[threadIdx.x * r.step];
        }
        if (threadIdx.x < CUPY_SWAP_CONTROL_WORDS) control[threadIdx.x] = word[threadIdx.x];
    }
    __syncthreads();
    if (word) {
        const SwapControl& c = *reinterpret_cast<const SwapControl*>(control);
        r.count = c.n_pairs;
        r.count_bad = c.n_pairs < 0 || (u64)c.n_pairs > capacity;
        r.n = r.count_bad ? 0 : (u64)c.n_pairs;
        r.status = c.status;
        r.seq = c.seq;
        r.have_first = c.src_index == 0 && threadIdx.x < capacity;
        if (c.src_index) {
            r.src_index = reinterpret_cast<const i64*>(c.src_index);
            r.dst_index = reinterpret_cast<const i64*>(c.dst_index);
            r.step = (int)c.index_step;
        }
        if (c.replays > 0) {  // a captured replay: its number, the failure ring, padding skipped
            r.seq = c.seq + 1;
            r.ring = c.replays;
            r.padded = true;
        }
    }
    check_and_copy<T>(h, parts, n_parts, h.units_per_pair, r);
    if (h.arrivals) {  // slot launches: the slot is free once every CTA is past it
        __syncthreads();
        if (threadIdx.x == 0) {
            // System scope: this CTA's verdict (pinned memory) is seen by the
            // host before the done word the last CTA writes (the host reads a
            // record that lacks its number after the done word as lost).
            __threadfence_system();
            unsigned* arrivals = reinterpret_cast<unsigned*>(h.arrivals);
            if (atomicAdd(arrivals, 1u) == gridDim.x - 1) {
                *reinterpret_cast<volatile unsigned*>(arrivals) = 0;  // for the slot's next launch
                __threadfence_system();
                volatile i64* done = reinterpret_cast<volatile i64*>(a.control);
                if (control[7] > 0) done[2] = r.seq;  // SwapControl::seq: the next replay's is one more
                done[3] = r.seq;                      // SwapControl::done
            }
        }
    }
}

// Plain C names so the host can look kernels up without name mangling:
// cupy_swap_w<bytes per unit>_ref<P> (up to P parts).
#define CUPY_SWAP_BYREF_KERNEL(P)                                                                          \
    extern "C" __global__ void __launch_bounds__(CUPY_SWAP_MAX_THREADS)                                    \
        CUPY_SWAP_BYREF_NAME(P)(const __grid_constant__ SwapByRef<P> a) {                                  \
        swap_byref<CUPY_SWAP_T, P>(a);                                                                     \
    }

#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))
#define CUPY_SWAP_BYREF_TIERS_HERE(X) CUPY_SWAP_BYREF_TIERS(X)
#else
#define CUPY_SWAP_BYREF_TIERS_HERE(X) X(16) X(64)
#endif

#define CUPY_SWAP_T uint4
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w16_ref##P
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T uint2
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w8_ref##P
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T unsigned int
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w4_ref##P
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T unsigned short
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w2_ref##P
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_BYREF_NAME
#define CUPY_SWAP_T unsigned char
#define CUPY_SWAP_BYREF_NAME(P) cupy_swap_w1_ref##P
CUPY_SWAP_BYREF_TIERS_HERE(CUPY_SWAP_BYREF_KERNEL)
#undef CUPY_SWAP_T
#undef CUPY_SWAP_BYREF_NAME

// Row upload (graph swaps' set_mapping): copy `n16` 16-byte words from pinned
// host memory (its device alias) to device memory with SM loads.  A
// cudaMemcpyAsync would do the same on a copy engine, but copy engines run
// their queue in order: a 20 KB copy can wait behind a 40 MB transfer issued
// on another stream (a concurrent swap-in), stalling the replay that needs it.
extern "C" __global__ void __launch_bounds__(256) cupy_swap_fetch(const uint4* __restrict__ src,
                                                                  uint4* __restrict__ dst, u64 n16) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}
