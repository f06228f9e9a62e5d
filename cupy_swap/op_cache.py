"""``swap()``'s cache of prepared ops, keyed by the memory the arrays describe
(owner, address, shape, strides, dtype, NumPy writeability), so fresh views
of the same memory, built per call as servers do, find the op their first
call built.  An entry holds the owners weakly and dies with any of them (a
reused address never finds an op built for the old memory); registering or
unregistering pinned memory invalidates every entry; the least recently
used goes first.  The ops of one key share one outcome channel
(:mod:`cupy_swap.cuda.outcomes`) that outlives evictions and rebuilds, so
the next ``swap()`` of the same arrays raises a failed check whatever the
cache did in between; it dies with the arrays.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
import threading
import weakref

import numpy as np

from .cuda import memory
from .cuda.outcomes import Channel


def _owner(obj):
    """The object that owns ``obj``'s memory (a view's base), so views of
    one pool share it."""
    if isinstance(obj, np.ndarray) or _is_cupy(obj):
        return obj if obj.base is None else obj.base
    base = getattr(obj, "_base", None)  # torch views
    return obj if base is None else base


def _is_cupy(obj) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and type(obj) is cupy.ndarray


def _memory_key(obj) -> tuple:
    if isinstance(obj, np.ndarray):  # subclasses (np.memmap) too
        base = obj.base
        owner = obj if base is None else base
        ptr = obj.__array_interface__["data"][0]
        return (id(owner), ptr, obj.shape, obj.strides, obj.dtype, obj.flags.writeable)
    if _is_cupy(obj):
        base = obj.base
        return (id(obj if base is None else base), obj.data.ptr, obj.shape, obj.strides, obj.dtype)
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride"):  # torch.Tensor
        base = obj._base
        return (id(obj if base is None else base), obj.data_ptr(), obj.shape, obj.stride(), obj.dtype)
    return (id(obj),)  # anything else DLPack or the array interfaces can read: by identity


# id(array) -> (weak reference, what can change in place, key): an array
# passed again costs a lookup and a look at its shape, strides, dtype and
# flags instead of its address (about a third of the time; fresh views pay
# for the entry instead: benchmarks/NOTES.md, item 34).  Torch tensors are not
# memoized: their address can change in place (``set_``), and reading it is
# the key's cost.
_memo: dict[int, tuple] = {}


def _mutable_state(obj):
    if isinstance(obj, np.ndarray):
        return (obj.shape, obj.strides, obj.dtype, obj.flags.writeable)
    if _is_cupy(obj):
        return (obj.shape, obj.strides, obj.dtype)
    return None


def array_key(obj) -> tuple:
    """Cache key of one ``src``/``dst`` array."""
    return _array_key(obj)[0]


def _array_key(obj) -> tuple[tuple, bool]:
    """(key, memoized before): the key of one array, and whether it came
    from an entry of an earlier call (the same object, unchanged)."""
    entry = _memo.get(id(obj))
    same = entry is not None and entry[0]() is obj
    if same and entry[1] == _mutable_state(obj):
        return entry[2], True
    key = _memory_key(obj)
    state = _mutable_state(obj)
    if state is not None:
        i = id(obj)
        try:
            _memo[i] = (weakref.ref(obj, lambda _ref, i=i: _forget_array(i)), state, key)
        except TypeError:  # cannot be referenced weakly: not memoized
            pass
    return key, False


def _forget_array(i: int) -> None:
    """An array died: its entry goes, and every side memo it was part of."""
    _memo.pop(i, None)
    with _sides_lock:
        for ids in _side_of.pop(i, ()):
            _forget_side(ids)


# A side (list or tuple of parts) passed again: the ids of its arrays ->
# (its key, the look at what can change in place, what the look saw).  Built
# the second time a side's arrays are all memoized; one look over the side
# replaces a call per array (64 NumPy parts: 9 against 25 µs on the CPU;
# benchmarks/NOTES.md, item 58).  Any of its arrays dying drops it.
_sides: dict[tuple, tuple] = {}
_side_of: dict[int, set] = {}  # id of a memoized array -> ids of the sides it is in
# Guards the two dicts' writes; reentrant: an array's death may run its
# callback inside this thread's own registration.
_sides_lock = threading.RLock()
_STATE_OF = {
    np.ndarray: operator.attrgetter("shape", "strides", "dtype", "flags.writeable"),
}


def _state_look(side):
    """The one look at a side's in-place state, or None (mixed or other
    types: arrays one by one)."""
    kind = type(side[0])
    if any(type(a) is not kind for a in side):
        return None
    look = _STATE_OF.get(kind)
    if look is None and _is_cupy(side[0]):
        look = _STATE_OF[kind] = operator.attrgetter("shape", "strides", "dtype")
    return look


def _forget_side(ids: tuple) -> None:
    """Under ``_sides_lock``: drop one side's memo."""
    _sides.pop(ids, None)
    for i in ids:
        sides = _side_of.get(i)
        if sides is not None:
            sides.discard(ids)
            if not sides:
                _side_of.pop(i, None)


def side_key(side) -> tuple:
    """Cache key of one side given as a list or tuple of arrays."""
    ids = tuple(map(id, side))
    entry = _sides.get(ids)
    if entry is not None and list(map(entry[1], side)) == entry[2]:
        return entry[0]
    keys, all_memoized = [], True
    for a in side:
        key, memoized = _array_key(a)
        keys.append(key)
        all_memoized &= memoized
    key = tuple(keys)
    look = _state_look(side) if all_memoized and side else None
    if look is not None:
        with _sides_lock:
            _sides[ids] = (key, look, list(map(look, side)))
            for i in ids:
                _side_of.setdefault(i, set()).add(ids)
            if any(i not in _memo for i in ids):  # one died meanwhile (another thread): no memo of this side
                _forget_side(ids)
    return key


def listed(side):
    """``side`` as a sequence: one array, or a list or tuple of them."""
    return side if isinstance(side, (list, tuple)) else (side,)


def arrays_of(src, dst) -> list:
    """Every array of a ``(src, dst)`` argument pair."""
    return [*listed(src), *listed(dst)]


class _Entry:
    __slots__ = ("__weakref__", "op", "refs", "dead", "generation", "used")

    def __init__(self, op, owners: list):
        decided = getattr(op, "_decided", None)  # its generation was read before its layout resolved
        self.op, self.dead = op, False
        self.generation = memory.generation() if decided is None else decided.generation
        entry = weakref.ref(self)

        def died(_ref, entry=entry):
            alive = entry()
            if alive is not None:
                alive.dead = True

        self.refs = [_weak(o, died) for o in owners]


def _forget(channels_ref, key, channel_ref, _dead) -> None:
    channels, channel = channels_ref(), channel_ref()
    if channels is not None and channel is not None and channels.get(key) is channel:
        del channels[key]


def _weak(obj, callback):
    """A weak reference calling ``callback`` on death, or a strong one for the
    rare owner that cannot be referenced weakly (held until eviction)."""
    try:
        return weakref.ref(obj, callback)
    except TypeError:
        return lambda: obj


class OpCache:
    """Ops by the key of their arrays; at most ``size`` entries, the least
    recently used evicted first."""

    def __init__(self, size: int = 256):
        self._entries: dict[tuple, _Entry] = {}
        self._ticks = itertools.count()  # next() is atomic under the GIL
        self._size = size
        self._lock = threading.Lock()
        self._channels: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def channel(self, key: tuple, src, dst) -> Channel:
        """The outcome channel of ``key``'s ops (made on first use; the key
        forgets it when an owner of ``src``/``dst`` dies, so new memory at a
        reused address never inherits an old failure)."""
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = Channel()
                forget = functools.partial(_forget, weakref.ref(self._channels), key, weakref.ref(channel))
                channel.owners = [_weak(_owner(o), forget) for o in arrays_of(src, dst)]
            return channel

    @staticmethod
    def key(src, dst) -> tuple:
        """The key of a ``(src, dst)`` argument pair (one array or a list or
        tuple of arrays per side)."""
        s = side_key(src) if isinstance(src, (list, tuple)) else (array_key(src),)
        d = side_key(dst) if isinstance(dst, (list, tuple)) else (array_key(dst),)
        return s, d

    def get(self, key: tuple):
        """The op stored under ``key`` while its owners live and no pinned
        range changed since, else None."""
        entries = self._entries
        entry = entries.get(key)
        if entry is None or entry.dead or entry.generation != memory.generation():
            return None
        entry.used = next(self._ticks)  # no second hash of the key (64 parts: 128 tuples)
        return entry.op

    def put(self, key: tuple, op, src, dst) -> None:
        entry = _Entry(op, [_owner(o) for o in arrays_of(src, dst)])
        entry.used = next(self._ticks)
        with self._lock:
            entries = self._entries
            entries.pop(key, None)
            if len(entries) >= self._size:  # the least recently used goes (a scan: puts are rare)
                del entries[min(entries, key=lambda k: entries[k].used)]
            entries[key] = entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
