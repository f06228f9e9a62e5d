"""Where a host pool's pages go: the NUMA node of the GPU that uses it.

**Invariant.**  The decision (:func:`decide`) is pure: it reads only the
nodes it is given, so it is tested with a stand-in sysfs tree
(:func:`gpu_node` and :func:`online_nodes` take the sysfs root).  A policy is
applied to memory before its pages are first touched (:func:`bind_range` on
a fresh mapping, :func:`thread_policy` around a shared pool's allocation);
failing to apply it never fails the pool: the placement then says why it was
not applied.  On a machine with one node, or where the GPU's node is unknown,
nothing is applied and the reason is given.

Policies: a private pool *prefers* its GPU's node (``MPOL_PREFERRED``: pages
land there while it has free memory, elsewhere rather than failing); a shared
pool used by GPUs of several nodes is *interleaved* over them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from dataclasses import dataclass, field

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE = 0, 1, 2, 3
# (mbind, set_mempolicy, get_mempolicy) per machine.
_SYSCALLS = {"x86_64": (237, 238, 239), "aarch64": (235, 237, 236)}
_MASK_LONGS = 16  # 1024 nodes
_MAXNODE = _MASK_LONGS * 64 + 1  # the kernel counts one bit fewer than it is given


@dataclass(frozen=True)
class Placement:
    """A pool's NUMA placement.

    Attributes
    ----------
    policy : {"none", "preferred", "interleave"}
        What is (to be) applied.
    nodes : tuple of int
        The nodes of the policy (empty for ``"none"``).
    reason : str
        Why, in words (the GPUs and their nodes, or why nothing is done).
    applied : bool or None
        None before it is applied; False when applying failed (``reason``
        then says why).
    """

    policy: str
    nodes: tuple = ()
    reason: str = ""
    applied: bool | None = field(default=None, compare=False)

    def describe(self) -> str:
        if self.policy == "none":
            return f"not placed: {self.reason}"
        where = f"node {self.nodes[0]}" if self.policy == "preferred" else f"nodes {list(self.nodes)}"
        state = {None: "", True: "", False: " (NOT applied)"}[self.applied]
        return f"{self.policy} {where}{state}: {self.reason}"


def sysfs_bus_id(bus_id: str) -> str:
    """CUDA's PCI bus id (``"0000:1A:00.0"``, or NVML's 8-digit domain) as
    sysfs names it (``"0000:1a:00.0"``)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"bus_id: expected a PCI address like '0000:1a:00.0', got {bus_id!r}")
    if len(domain) > 4 and set(domain[:-4]) <= {"0"}:
        domain = domain[-4:]
    return f"{domain.zfill(4)}:{rest}"


def gpu_node(bus_id: str, sysfs: str = "/sys") -> int | None:
    """NUMA node of the PCI device ``bus_id`` (None: unknown, -1 in sysfs, or
    no such file)."""
    path = os.path.join(sysfs, "bus", "pci", "devices", sysfs_bus_id(bus_id), "numa_node")
    try:
        node = int(open(path).read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def parse_node_list(text: str) -> list[int]:
    """``"0-1,3"`` -> ``[0, 1, 3]`` (sysfs node lists)."""
    nodes: list[int] = []
    for item in text.strip().split(","):
        if not item:
            continue
        lo, _, hi = item.partition("-")
        nodes.extend(range(int(lo), int(hi or lo) + 1))
    return nodes


def online_nodes(sysfs: str = "/sys") -> list[int]:
    """The online NUMA nodes (``[0]`` where the kernel has no NUMA support)."""
    try:
        return parse_node_list(open(os.path.join(sysfs, "devices", "system", "node", "online")).read())
    except (OSError, ValueError):
        return [0]


def decide(gpu_nodes: dict, online: list[int], shared: bool = False) -> Placement:
    """The placement of a pool used by the GPUs of ``gpu_nodes``.

    Parameters
    ----------
    gpu_nodes : dict of {int: (str, int or None)}
        GPU index -> (PCI bus id, its NUMA node or None when unknown).
    online : list of int
        The online nodes.
    shared : bool
        True for a pool several GPUs use (interleaved over their nodes).
    """
    if len(online) <= 1:
        return Placement("none", (), f"one NUMA node online ({online[0] if online else 0}): nothing to place")
    known = {g: n for g, (_, n) in gpu_nodes.items() if n is not None and n in online}
    where = ", ".join(
        f"GPU {g} ({bus}) on node {n if n is not None else 'unknown'}"
        for g, (bus, n) in sorted(gpu_nodes.items())
    )
    if not known:
        return Placement(
            "none", (), f"NUMA node of the GPU unknown ({where or 'no GPU'}; sysfs numa_node -1)"
        )
    nodes = tuple(sorted(set(known.values())))
    if len(nodes) == 1 or not shared:
        first = known[min(known)]
        return Placement("preferred", (first,), where)
    return Placement("interleave", nodes, where)


def placement_for(devices, shared: bool = False, numa="auto", sysfs: str = "/sys", bus_ids=None) -> Placement:
    """The placement of a pool for GPUs ``devices`` (``numa``: ``"auto"``,
    ``"off"``, or a node number / list of nodes to force).  ``bus_ids``:
    GPU -> PCI bus id (asked from CUDA when None)."""
    if numa == "off" or numa is False:
        return Placement("none", (), "numa='off'")
    online = online_nodes(sysfs)
    if numa != "auto":
        nodes = [numa] if isinstance(numa, int) and not isinstance(numa, bool) else numa
        if (
            not isinstance(nodes, (list, tuple))
            or not nodes
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes)
        ):
            raise TypeError(f"numa: expected 'auto', 'off', a node number or a list of them, got {numa!r}")
        bad = [n for n in nodes if n not in online]
        if bad:
            raise ValueError(f"numa: expected online nodes {online}, got {nodes} ({bad} not online)")
        nodes = tuple(sorted(set(nodes)))
        return Placement("preferred" if len(nodes) == 1 else "interleave", nodes, "asked for (numa=...)")
    if len(online) <= 1:
        return decide({}, online, shared)  # nothing to place: CUDA is not even asked
    if bus_ids is None:
        bus_ids = {d: pci_bus_id(d) for d in devices}
    return decide({d: (bus_ids[d], gpu_node(bus_ids[d], sysfs)) for d in devices}, online, shared)


def pci_bus_id(device: int) -> str:
    """GPU ``device``'s PCI bus id (``cudaDeviceGetPCIBusId``)."""
    from ..cuda import memory

    return memory._runtime().deviceGetPCIBusId(device)


def _mask(nodes) -> ctypes.Array:
    mask = (ctypes.c_ulong * _MASK_LONGS)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    return mask


def _syscall(index: int, *args) -> None:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(f"NUMA system calls not known on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(numbers[index]), *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_MODES = {"preferred": MPOL_PREFERRED, "interleave": MPOL_INTERLEAVE}


def bind_range(addr: int, nbytes: int, placement: Placement) -> Placement:
    """Apply ``placement`` to the untouched mapping ``[addr, addr + nbytes)``
    (``mbind``; ``addr`` page-aligned).  Returns the placement with
    ``applied`` set (and the error in ``reason`` when it failed)."""
    if placement.policy == "none":
        return placement
    try:
        mask = _mask(placement.nodes)
        _syscall(
            0,
            ctypes.c_void_p(addr),
            ctypes.c_ulong(nbytes),
            ctypes.c_int(_MODES[placement.policy]),
            mask,
            ctypes.c_ulong(_MAXNODE),
            ctypes.c_uint(0),
        )
    except OSError as e:
        return Placement(placement.policy, placement.nodes, f"{placement.reason}; mbind failed: {e}", False)
    return Placement(placement.policy, placement.nodes, placement.reason, True)


@contextlib.contextmanager
def thread_policy(placement: Placement):
    """This thread's memory policy set to ``placement`` inside the block (for
    memory a system call allocates, such as a shared pool's
    ``posix_fallocate``), the previous one restored after.  Yields the
    placement with ``applied`` set."""
    if placement.policy == "none":
        yield placement
        return
    old_mode, old_mask = ctypes.c_int(0), _mask(())
    try:
        _syscall(2, ctypes.byref(old_mode), old_mask, ctypes.c_ulong(_MAXNODE), None, ctypes.c_ulong(0))
        _syscall(1, ctypes.c_int(_MODES[placement.policy]), _mask(placement.nodes), ctypes.c_ulong(_MAXNODE))
    except OSError as e:
        yield Placement(
            placement.policy, placement.nodes, f"{placement.reason}; set_mempolicy failed: {e}", False
        )
        return
    try:
        yield Placement(placement.policy, placement.nodes, placement.reason, True)
    finally:
        mask = old_mask if old_mode.value != MPOL_DEFAULT else None
        _syscall(1, old_mode, mask, ctypes.c_ulong(_MAXNODE if mask is not None else 0))
