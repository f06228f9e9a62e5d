// The kernel ABI: what the host passes and how it is laid out.  The Python
// side defines the same thing once, in cupy_swap/cuda/abi.py, and a CPU test
// (tests/test_abi.py) reads this file to check that the two agree.
//
// Every kernel swap is a slot launch: a SwapByRef<P> parameter holds the header and
// part table, fixed for a prepared op, and the addresses of a SwapControl
// record and of the rows.  The control record holds what changes per call
// (row count, status address, swap number) and where the rows are: a ring
// slot's pinned words read through their device alias (host rows), the
// caller's GPU arrays (a mapping on the GPU), or device memory the caller's
// kernels wrote (a swap captured into the caller's graph).  So the launch's
// parameters never change per call.  The kernel's last CTA writes the swap number
// into the record's `done` word: the host reuses the slot when it reads it
// there, with no driver call.
//
// Work is the flat range [0, n_pairs * units_per_pair) of units (vectors of
// the launch's width), pair-major, so the parts of one block sit next to each
// other, which keeps a block-first host layout contiguous and lets the pair
// count change without touching the part table.
//
// Checks inside the launch: when the status address is not 0, every CTA first
// checks every row (0 <= src < src_limit, 0 <= dst < dst_limit, no
// destination block twice: an open-addressing table in dynamic shared
// memory; a row count out of [0, capacity]), so all CTAs reach the same
// verdict and a bad mapping writes no byte.  CTA 0 then writes the verdict
// into the SwapStatus at that address (pinned host memory, through its device
// alias), seq last; a failed check then writes seq into the board's alarm
// word too (SwapStatus::alarm).
#pragma once

typedef unsigned long long u64;
typedef long long i64;

#define CUPY_SWAP_HEADER_WORDS 8
#define CUPY_SWAP_PART_WORDS 6
#define CUPY_SWAP_STATUS_WORDS 8
#define CUPY_SWAP_CONTROL_WORDS 8
#define CUPY_SWAP_MAX_PARTS 256  // the largest slot kernel's part table
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
    u64 arrivals;   // device address of a u32 count of CTAs done (slot launches), or 0
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
// range, 3 a destination block seen in an earlier row, 4 a row count out of
// [0, capacity] (row 0, value: the count).  row: the first bad row; value: its
// offending block index.  alarm: device address of the
// swapper's alarm word, written by the host once (0: none).
struct SwapStatus {
    i64 seq;
    i64 kind;
    i64 row;
    i64 value;
    u64 alarm;
    i64 unused[3];
};

// What a slot launch reads when it runs.  n_pairs: rows to copy, 0 to the
// header's n_pairs (the rows readable at the parameter's src_index), else
// the launch reports kind 4 and copies nothing.  src_index 0: the rows are
// at the parameter's addresses; else at src_index / dst_index, index_step
// words apart (a mapping on the GPU).  done: the kernel's last CTA writes seq
// here after every CTA has stopped reading the record and the rows.
//
// replays > 0: a swap captured into the caller's CUDA graph, its record in
// device memory at a fixed address, its count (and rows) written there by
// the caller's kernels before each replay.  Replay k (k = seq + 1 when it
// starts) writes a failed check's verdict into a ring of `replays` SwapStatus
// records at status (record f % replays for its f-th failure; the count of
// failures in the word after the ring; good replays write nothing), skips
// rows whose source or destination
// is -1 (padding), and its last CTA writes k into seq and done: a stream
// outside the graph can wait for done >= k (cuStreamWaitValue64).
struct SwapControl {
    i64 n_pairs;
    u64 status;
    i64 seq;
    i64 done;
    u64 src_index;
    u64 dst_index;
    i64 index_step;
    i64 replays;
};

template <int P>
struct SwapByRef {
    SwapHeader header;
    const i64* src_index;  // device address of the first source block index
    const i64* dst_index;
    i64 index_step;        // words from one row's index to the next (2: (N, 2) rows, 1: two 1-D arrays)
    u64 control;           // device address of a SwapControl, or 0: count, status and seq from the header
    SwapPart parts[P];
};

#define CUPY_SWAP_BYREF_TIERS(X) X(16) X(64) X(256)

static_assert(sizeof(SwapHeader) == 8 * CUPY_SWAP_HEADER_WORDS, "SwapHeader size");
static_assert(sizeof(SwapPart) == 8 * CUPY_SWAP_PART_WORDS, "SwapPart size");
static_assert(sizeof(SwapStatus) == 8 * CUPY_SWAP_STATUS_WORDS, "SwapStatus size");
static_assert(sizeof(SwapControl) == 8 * CUPY_SWAP_CONTROL_WORDS, "SwapControl size");
static_assert(sizeof(SwapByRef<16>) == 8 * (CUPY_SWAP_HEADER_WORDS + 4 + 16 * CUPY_SWAP_PART_WORDS), "SwapByRef<16> size");
static_assert(sizeof(SwapByRef<64>) <= 4096, "SwapByRef<64> exceeds the classic parameter limit");
static_assert(sizeof(SwapByRef<256>) <= 32764, "SwapByRef<256> exceeds the parameter limit");
