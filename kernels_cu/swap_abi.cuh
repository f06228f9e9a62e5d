// The kernel ABI: what the host passes and how it is laid out.  The Python
// side defines the same thing once, in cupy_swap/cuda/abi.py, and a CPU test
// (tests/test_abi.py) reads this file to check that the two agree.
//
// A swap reaches the kernel in one of two ways.
//
// Inline (most eager swaps): the whole swap is ONE kernel parameter, a
// SwapInline<P, N> struct: header, part table and pairs.  The driver copies
// it with the launch, so the kernel needs no dependent read of host memory
// before its first useful load, and a captured launch keeps its pairs.
//
//   header : SwapHeader (4 words)  n_pairs, n_parts, units_per_pair, unused
//   parts  : P x SwapPart (6 words each)
//   pairs  : N x (src_block, dst_block), signed 64-bit
//
// Descriptor (large mappings, CUDA-graph replays with a per-replay mapping,
// staged swaps): the same header, table and pairs packed back to back as
// 64-bit words in a buffer, the kernel's first argument:
//
//   [0]                     n_pairs (read by graph replays, which pass n_pairs = -1)
//   [1]                     n_parts
//   [2]                     units_per_pair
//   [3 .. HEADER_WORDS)     unused
//   then n_parts x SwapPart, then n_pairs x 2 words
//
// Work is the flat range [0, n_pairs * units_per_pair) of units (vectors of
// the launch's width), pair-major, so the parts of one block sit next to each
// other, which keeps a block-first host layout contiguous and lets the pair
// count change without touching the part table.
#pragma once

typedef unsigned long long u64;
typedef long long i64;

#define CUPY_SWAP_HEADER_WORDS 4
#define CUPY_SWAP_PART_WORDS 6
#define CUPY_SWAP_MAX_PARTS 256  // descriptor kernels keep the part table in shared memory
#define CUPY_SWAP_UNROLL 4       // 16-byte loads in flight per thread (benchmarks/NOTES.md, item 4)
#define CUPY_SWAP_MAX_THREADS 1024

struct SwapHeader {
    i64 n_pairs;
    i64 n_parts;
    u64 units_per_pair;
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

// Inline tiers (parts, pairs): the first that holds a swap is used.  The
// last one takes every part count the kernel allows (layers x K/V of the
// deepest models) with up to 1024 pairs.
// Parameters above 4 KiB need CUDA 12.1+ (compiler and driver): the largest
// tier exists only where the compiler has them, and the host falls back to
// the descriptor when a tier's kernel is missing.
#define CUPY_SWAP_TIERS(X) X(4, 16) X(16, 192) X(64, 1792) X(256, 1024)

template <int P, int N>
struct SwapInline {
    SwapHeader header;
    SwapPart parts[P];
    i64 pairs[2 * N];
};

static_assert(sizeof(SwapHeader) == 8 * CUPY_SWAP_HEADER_WORDS, "SwapHeader size");
static_assert(sizeof(SwapPart) == 8 * CUPY_SWAP_PART_WORDS, "SwapPart size");
static_assert(sizeof(SwapInline<4, 16>) == 8 * (CUPY_SWAP_HEADER_WORDS + 4 * CUPY_SWAP_PART_WORDS + 2 * 16),
              "SwapInline<4, 16> size");
static_assert(sizeof(SwapInline<64, 1792>) <= 32764, "inline tier 64 x 1792 exceeds the parameter limit");
static_assert(sizeof(SwapInline<256, 1024>) <= 32764, "inline tier 256 x 1024 exceeds the parameter limit");

// Mappings that live on the GPU (an int64 (N, 2) array in device memory):
// the host never reads them, so they are checked on the GPU.  A check
// kernel (one CTA) validates the rows and writes a SwapStatus into a slot of
// pinned memory; the copy kernel that follows on the stream reads that slot
// first and copies only when it holds this swap's `seq` and kind 0.  The
// copy kernel takes its header and part table as one parameter, a
// SwapByRef<P>, and its pairs by address.
#define CUPY_SWAP_CHECK_MAX_ROWS 4096  // the check sorts the rows in shared memory
#define CUPY_SWAP_CHECK_ROW_BITS 12    // sort keys: (dst_block << ROW_BITS) | row
#define CUPY_SWAP_STATUS_WORDS 8

// kind: 0 valid; 1 a source index out of range, 2 a destination index out
// of range (row, value: the first such row and its index); 3 a destination
// block twice (row, other: the two rows, value: the block).
struct SwapStatus {
    i64 seq;
    i64 kind;
    i64 row;
    i64 other;
    i64 value;
    i64 unused[3];
};

template <int P>
struct SwapByRef {
    SwapHeader header;
    const i64* pairs;           // device address of the (N, 2) rows the check validated
    const SwapStatus* status;   // device alias of this swap's status slot
    i64 seq;                    // the swap's number, as the check wrote it
    i64 unused;
    SwapPart parts[P];
};

#define CUPY_SWAP_BYREF_TIERS(X) X(16) X(256)

static_assert(sizeof(SwapStatus) == 8 * CUPY_SWAP_STATUS_WORDS, "SwapStatus size");
static_assert(sizeof(SwapByRef<16>) == 8 * (CUPY_SWAP_HEADER_WORDS + 4 + 16 * CUPY_SWAP_PART_WORDS), "SwapByRef<16> size");
static_assert(sizeof(SwapByRef<256>) <= 32764, "SwapByRef<256> exceeds the parameter limit");
