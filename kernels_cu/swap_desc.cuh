// Layout of the swap descriptor that the host writes and the kernel reads.
//
// One descriptor describes one swap: a header, a table of parts and the
// block mapping, packed back to back as 64-bit little-endian words.  The
// Python side (cupy_swap/descriptor.py) writes exactly this layout; keep the
// two in step.
//
//   header  : HEADER_WORDS words
//             [0] number of (src_block, dst_block) pairs N
//             [1] number of parts P (also a kernel argument)
//             [2] units per pair: sum over parts of units per block (also an argument)
//   parts   : P entries of PART_WORDS words
//             [0] source base address (device address or host alias)
//             [1] destination base address
//             [2] source block stride in bytes (signed)
//             [3] destination block stride in bytes (signed)
//             [4] units (vectors of the launch's width) per block
//             [5] first unit of this part within one pair
//   pairs   : N entries of 2 signed words, (src_block, dst_block)
//
// Work is the flat range [0, N * units_per_pair): pair-major, so the parts of
// one block sit next to each other, which keeps a block-first host layout
// contiguous and lets the pair count change (graph replay) without touching
// the part table.
#pragma once

#define CUPY_SWAP_HEADER_WORDS 8
#define CUPY_SWAP_PART_WORDS 6
#define CUPY_SWAP_MAX_PARTS 256
