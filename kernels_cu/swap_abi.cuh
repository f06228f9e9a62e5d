// The kernel ABI: what the host passes and how it is laid out.  The Python
// side defines the same thing once, in cupy_swap/cuda/abi.py, and a CPU test
// (tests/test_abi.py) reads this file to check that the two agree.
//
// A swap reaches the kernel in one of three ways.
//
// Inline (most host mappings): the whole swap is ONE kernel parameter, a
// SwapInline<P, N> struct: header, part table and pairs.  The driver copies
// it with the launch, so the kernel needs no dependent read of host memory
// before its first useful load, and a captured launch keeps its pairs.
//
// Descriptor (more pairs than an inline tier holds, CUDA-graph replays with
// a per-replay mapping, staged swaps): the same header, table and pairs
// packed back to back as 64-bit words in a device buffer, the kernel's first
// argument.
//
// By reference (mappings that live on the GPU): header and part table in
// the parameter, a SwapByRef<P>; the block indices are read from the
// caller's GPU array(s) by address.
//
// Work is the flat range [0, n_pairs * units_per_pair) of units (vectors of
// the launch's width), pair-major, so the parts of one block sit next to each
// other, which keeps a block-first host layout contiguous and lets the pair
// count change without touching the part table.
//
// Checks inside the launch: when header.status is not 0, every CTA first
// checks every row (0 <= src < src_limit, 0 <= dst < dst_limit, no
// destination block twice: an open-addressing table in dynamic shared
// memory), so all CTAs reach the same verdict and a bad mapping writes no
// byte.  CTA 0 then writes the verdict into the SwapStatus at header.status
// (pinned host memory, through its device alias), seq last; a failed check
// then writes seq into the board's alarm word too (SwapStatus::alarm).
#pragma once

typedef unsigned long long u64;
typedef long long i64;

#define CUPY_SWAP_HEADER_WORDS 8
#define CUPY_SWAP_PART_WORDS 6
#define CUPY_SWAP_STATUS_WORDS 8
#define CUPY_SWAP_MAX_PARTS 256  // descriptor kernels keep the part table in shared memory
#define CUPY_SWAP_UNROLL 4       // 16-byte loads in flight per thread (benchmarks/NOTES.md, item 4)
#define CUPY_SWAP_MAX_THREADS 1024

struct SwapHeader {
    i64 n_pairs;
    i64 n_parts;
    u64 units_per_pair;
    i64 src_limit;  // the check's bounds: 0 <= src block < src_limit
    i64 dst_limit;
    u64 status;     // device address of this swap's SwapStatus, or 0: no check in the launch
    i64 seq;        // the swap's number, written into its SwapStatus
    u64 unused;
};

struct SwapPart {
    u64 src;         // source base address (device address or host alias)
    u64 dst;         // destination base address
    i64 src_stride;  // bytes from block i to block i + 1 (any sign)
    i64 dst_stride;
    u64 units;       // units per block
    u64 first_unit;  // first unit of this part within one pair
};

// kind: 0 valid; 1 a source index out of range, 2 a destination index out of
// range, 3 a destination block seen in an earlier row.  row: the first bad
// row; value: its offending block index.  alarm: device address of the
// swapper's alarm word, written by the host once (0: none).
struct SwapStatus {
    i64 seq;
    i64 kind;
    i64 row;
    i64 value;
    u64 alarm;
    i64 unused[3];
};

// Inline tiers (parts, pairs): the first that holds a swap is used.  The
// last one takes every part count the kernel allows (layers x K/V of the
// deepest models) with up to 1024 pairs.  64 x 16 carries a short swap of
// 32 layers x K/V in 3.3 KiB instead of 64 x 1792's 31 KiB: the driver
// copies the whole parameter at every launch.
// Parameters above 4 KiB need CUDA 12.1+ (compiler and driver): the largest
// tiers exist only where the compiler has them, and the host falls back to
// the descriptor when a tier's kernel is missing.
#define CUPY_SWAP_TIERS(X) X(4, 16) X(16, 192) X(64, 16) X(64, 1792) X(256, 1024)

template <int P, int N>
struct SwapInline {
    SwapHeader header;
    SwapPart parts[P];
    i64 pairs[2 * N];
};

template <int P>
struct SwapByRef {
    SwapHeader header;
    const i64* src_index;  // device address of the first source block index
    const i64* dst_index;
    i64 index_step;        // words from one row's index to the next (2: (N, 2) rows, 1: two 1-D arrays)
    u64 unused;
    SwapPart parts[P];
};

#define CUPY_SWAP_BYREF_TIERS(X) X(16) X(64) X(256)

static_assert(sizeof(SwapHeader) == 8 * CUPY_SWAP_HEADER_WORDS, "SwapHeader size");
static_assert(sizeof(SwapPart) == 8 * CUPY_SWAP_PART_WORDS, "SwapPart size");
static_assert(sizeof(SwapStatus) == 8 * CUPY_SWAP_STATUS_WORDS, "SwapStatus size");
static_assert(sizeof(SwapInline<4, 16>) == 8 * (CUPY_SWAP_HEADER_WORDS + 4 * CUPY_SWAP_PART_WORDS + 2 * 16),
              "SwapInline<4, 16> size");
static_assert(sizeof(SwapInline<16, 192>) <= 4096, "inline tier 16 x 192 exceeds the classic parameter limit");
static_assert(sizeof(SwapInline<64, 16>) <= 4096, "inline tier 64 x 16 exceeds the classic parameter limit");
static_assert(sizeof(SwapInline<64, 1792>) <= 32764, "inline tier 64 x 1792 exceeds the parameter limit");
static_assert(sizeof(SwapInline<256, 1024>) <= 32764, "inline tier 256 x 1024 exceeds the parameter limit");
static_assert(sizeof(SwapByRef<16>) == 8 * (CUPY_SWAP_HEADER_WORDS + 4 + 16 * CUPY_SWAP_PART_WORDS), "SwapByRef<16> size");
static_assert(sizeof(SwapByRef<64>) <= 4096, "SwapByRef<64> exceeds the classic parameter limit");
static_assert(sizeof(SwapByRef<256>) <= 32764, "SwapByRef<256> exceeds the parameter limit");
