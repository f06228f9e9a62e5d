"""Block layouts of registered pools: what a peer must know to address a
block, and what two pools must share to be paired.

A *pool* is one or more *parts* (arrays) with blocks along axis 0, as in
``swap()``: ``part[i]`` must be C-contiguous, the axis-0 stride may be
anything.  Block ``b`` of part ``p`` is the byte range
``[address_p + b * stride_p, address_p + b * stride_p + block_bytes_p)``.
Host arrays (NumPy, CPU torch tensors) are NIXL ``DRAM``; CuPy arrays and
CUDA torch tensors are ``VRAM`` on their device.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

from .errors import LayoutMismatchError

__all__ = [
    "PartLayout",
    "PoolLayout",
    "describe_part",
    "pool_layout",
    "check_pairable",
    "check_pool_parts",
    "merged_spans",
]


@dataclass(frozen=True)
class PartLayout:
    """One part of a pool.

    Attributes
    ----------
    address : int
        Address of block 0.
    stride : int
        Bytes from block ``b`` to block ``b + 1`` (>= ``block_bytes``).
    block_bytes : int
        Bytes of one block (``part[0].nbytes``).
    num_blocks : int
        ``part.shape[0]``.
    """

    address: int
    stride: int
    block_bytes: int
    num_blocks: int

    def span(self) -> tuple[int, int]:
        """``(address, length)`` of the bytes the part's blocks cover (for registration)."""
        return self.address, (self.num_blocks - 1) * self.stride + self.block_bytes


@dataclass(frozen=True)
class PoolLayout:
    """A named pool: its memory kind and its parts.

    Attributes
    ----------
    name : str
    mem : str
        ``"DRAM"`` or ``"VRAM"``.
    device : int
        CUDA device of a VRAM pool; 0 for DRAM (NIXL's convention).
    parts : tuple of PartLayout
    staging : tuple of PartLayout
        The pool's staging runs in host memory (one per part,
        ``staging[p].num_blocks`` contiguous slots), or ``()`` when the pool
        has none.
    uid : int
        Which registration of this name it is (an agent numbers its
        registrations): a staged write's request names it, so a pool
        dropped and registered again under the same name never grants
        what was asked of its predecessor.
    """

    name: str
    mem: str
    device: int
    parts: tuple
    staging: tuple = ()
    uid: int = 0

    @cached_property
    def num_blocks(self) -> int:
        """Blocks addressable in every part (the fewest)."""
        return min(p.num_blocks for p in self.parts)

    @cached_property
    def block_bytes(self) -> tuple:
        """Bytes of one block, per part."""
        return tuple(p.block_bytes for p in self.parts)

    @cached_property
    def staging_blocks(self) -> int:
        return min((p.num_blocks for p in self.staging), default=0)

    def block_descs(self, staging: bool = False) -> np.ndarray:
        """NIXL descriptors of every block (or staging slot), part-major.

        Returns
        -------
        numpy.ndarray of shape (P * B, 3), uint64
            Rows ``(address, block_bytes, device)``; block ``b`` of part ``p``
            is row ``p * B + b``, with ``B`` = :attr:`num_blocks` (or
            :attr:`staging_blocks`).
        """
        parts = self.staging if staging else self.parts
        count = self.staging_blocks if staging else self.num_blocks
        rows = []
        for p in parts:
            r = np.empty((count, 3), dtype=np.uint64)
            r[:, 0] = p.address + np.arange(count, dtype=np.uint64) * np.uint64(p.stride)
            r[:, 1] = p.block_bytes
            r[:, 2] = 0 if staging else self.device  # staging runs are host memory (DRAM)
            rows.append(r)
        return np.concatenate(rows)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PoolLayout:
        return cls(
            name=str(d["name"]),
            mem=str(d["mem"]),
            device=int(d["device"]),
            parts=tuple(PartLayout(**p) for p in d["parts"]),
            staging=tuple(PartLayout(**p) for p in d.get("staging", ())),
            uid=int(d.get("uid", 0)),
        )


def describe_part(array) -> tuple[PartLayout, str, int, np.dtype, tuple]:
    """Read one part's layout from a NumPy/CuPy array or a torch tensor.

    Returns
    -------
    tuple
        ``(PartLayout, mem, device, dtype, block_shape)``.

    Raises
    ------
    TypeError
        Not an array this module knows.
    ValueError
        No blocks, a negative or too small axis-0 stride, or blocks that are
        not C-contiguous.
    """
    if isinstance(array, np.ndarray):
        addr, mem, device = array.__array_interface__["data"][0], "DRAM", 0
        shape, strides, dtype = array.shape, array.strides, array.dtype
    elif hasattr(array, "__cuda_array_interface__") and not hasattr(array, "data_ptr"):  # CuPy
        cai = array.__cuda_array_interface__
        addr, mem, device = cai["data"][0], "VRAM", int(array.device.id)
        shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
        strides = cai.get("strides") or _c_strides(shape, dtype.itemsize)
    elif hasattr(array, "data_ptr") and hasattr(array, "stride"):  # torch
        item = array.element_size()
        addr, shape = array.data_ptr(), tuple(array.shape)
        strides = tuple(s * item for s in array.stride())
        mem, device = ("VRAM", array.get_device()) if array.is_cuda else ("DRAM", 0)
        dtype = np.dtype(f"V{item}")  # only the size matters here
    else:
        raise TypeError(
            f"pool part: expected a numpy array, a cupy array or a torch tensor, got {type(array).__name__}"
        )
    if len(shape) < 1 or shape[0] < 1:
        raise ValueError(f"pool part: expected at least one block along axis 0, got shape {shape}")
    block_shape = tuple(shape[1:])
    block_bytes = math.prod(block_shape) * dtype.itemsize
    c_strides = _c_strides(block_shape, dtype.itemsize)
    if any(n > 1 and s != c for n, s, c in zip(block_shape, strides[1:], c_strides)):
        raise ValueError(f"pool part: each block part[i] must be C-contiguous, got strides {strides}")
    stride = int(strides[0]) if shape[0] > 1 else block_bytes
    if block_bytes == 0 or stride < block_bytes:
        raise ValueError(
            f"pool part: expected blocks of at least one byte that do not overlap, got "
            f"{block_bytes} bytes a block with an axis-0 stride of {stride}"
        )
    return PartLayout(int(addr), stride, block_bytes, int(shape[0])), mem, device, dtype, block_shape


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    out, acc = [], itemsize
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def pool_layout(name: str, parts, staging=()) -> PoolLayout:
    """The :class:`PoolLayout` of ``parts`` (one array or a sequence), with
    ``staging`` arrays (one per part, or empty).

    Raises
    ------
    ValueError
        Parts in different memory kinds or devices, or staging that does not
        match the parts' block bytes.
    """
    parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
    if not parts:
        raise ValueError(f"pool {name!r}: expected at least one part")
    described = [describe_part(a) for a in parts]
    kinds = {(mem, dev) for _, mem, dev, _, _ in described}
    if len(kinds) != 1:
        raise ValueError(
            f"pool {name!r}: all parts must live in one memory (host, or one GPU), got {sorted(kinds)}"
        )
    ((mem, device),) = kinds
    staged = tuple(describe_part(s)[0] for s in staging)
    if staged and [s.block_bytes for s in staged] != [d[0].block_bytes for d in described]:
        raise ValueError(f"pool {name!r}: staging block bytes must match the parts'")
    return PoolLayout(name, mem, device, tuple(d[0] for d in described), staged)


def check_pairable(local: PoolLayout, remote: PoolLayout, peer: str) -> None:
    """Refuse to pair two pools whose blocks differ.

    Raises
    ------
    LayoutMismatchError
        Different part counts or block bytes of some part.
    """
    where = f"local pool {local.name!r} and pool {remote.name!r} of peer {peer!r}"
    if len(local.parts) != len(remote.parts):
        raise LayoutMismatchError(
            f"{where} cannot be paired: {len(local.parts)} parts here, {len(remote.parts)} there "
            "(part i is copied to part i)"
        )
    for i, (a, b) in enumerate(zip(local.block_bytes, remote.block_bytes)):
        if a != b:
            raise LayoutMismatchError(
                f"{where} cannot be paired: part {i} has {a}-byte blocks here, {b}-byte blocks there"
            )


def check_pool_parts(name: str, parts) -> None:
    """Refuse parts a peer could not write as it is told: read-only memory,
    or two parts sharing bytes (a block written through one would change a
    block of the other, and NIXL would register the memory twice).  The
    messages are ``swap()``'s.

    Raises
    ------
    ValueError
    """
    parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
    described = []
    for i, a in enumerate(parts):
        if isinstance(a, np.ndarray) and not a.flags.writeable:
            raise ValueError(
                f"pool {name!r}: parts[{i}]: expected a writeable destination, got a read-only array"
            )
        described.append(describe_part(a)[0])
    for i, a in enumerate(described):
        for j in range(i):
            b = described[j]
            a0, a1 = a.address, a.address + a.span()[1]
            b0, b1 = b.address, b.address + b.span()[1]
            if a0 < b1 and b0 < a1 and not _interleaved(a, b):
                raise ValueError(
                    f"pool {name!r}: parts[{j}] and parts[{i}] share bytes (blocks of {b.block_bytes} and "
                    f"{a.block_bytes} bytes at 0x{b.address:x} and 0x{a.address:x}, strides {b.stride} and "
                    f"{a.stride}): a block written through one would change the other; copy through a "
                    "separate buffer or register distinct memory (views of one block-first cache, "
                    "cache[:, i], are fine)"
                )


def _interleaved(a: PartLayout, b: PartLayout) -> bool:
    """Two parts of one stride whose blocks sit in disjoint bytes of every
    stride period (``cache[:, 0]`` and ``cache[:, 1]``): they share no byte."""
    stride = a.stride
    if a.num_blocks == 1 and b.num_blocks == 1:  # spans are the blocks: they meet, so they share
        return False
    if stride != b.stride or stride < a.block_bytes + b.block_bytes:
        return False
    gap_ab, gap_ba = (b.address - a.address) % stride, (a.address - b.address) % stride
    return gap_ab >= a.block_bytes and gap_ba >= b.block_bytes


def merged_spans(spans) -> list:
    """``(address, length)`` ranges with overlapping or touching ones merged
    (interleaved parts of one cache are registered with NIXL once)."""
    out: list = []
    for addr, length in sorted(spans):
        if out and addr <= out[-1][0] + out[-1][1]:
            end = max(out[-1][0] + out[-1][1], addr + length)
            out[-1] = (out[-1][0], end - out[-1][0])
        else:
            out.append((addr, length))
    return out
