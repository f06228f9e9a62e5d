"""Pieces of the swapper that need no GPU."""

import warnings

import pytest

from cupy_swap.core.route import check_mode
from cupy_swap.swapper import _positive_int


def test_argument_checks():
    assert check_mode("dma") == "dma"
    with pytest.raises(ValueError, match="mode: expected one of"):
        check_mode("turbo")
    assert _positive_int(3, "x") == 3
    with pytest.raises(TypeError, match="x: expected a positive int, got bool"):
        _positive_int(True, "x")


def test_op_cache_holds_memory_owners_weakly():
    import gc
    import weakref

    import numpy as np

    from cupy_swap.op_cache import OpCache

    cache = OpCache()
    pool, other = np.zeros((8, 4), np.uint8), np.zeros((8, 4), np.uint8)
    key = cache.key([pool[:, :2]], other)
    cache.put(key, "op", [pool[:, :2]], other)
    assert cache.get(key) == "op"
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is None  # the cache did not keep the dropped pool alive
    assert cache.get(key) is None  # and a recycled address or id never finds its op


def test_op_cache_fresh_views_hit_and_in_place_changes_miss():
    import numpy as np

    from cupy_swap.op_cache import OpCache

    cache = OpCache()
    pool, gpu = np.zeros((8, 3, 4), np.uint8), np.zeros((8, 4), np.uint8)
    key = cache.key([pool[:, 1]], gpu)
    cache.put(key, "op", [pool[:, 1]], gpu)
    assert cache.get(cache.key([pool[:, 1]], gpu)) == "op"  # a fresh view of the same memory
    assert cache.get(cache.key([pool[:, 2]], gpu)) is None  # the next layer: other memory
    gpu.flags.writeable = False  # a destination made read-only after its first swap
    assert cache.get(cache.key([pool[:, 1]], gpu)) is None
    gpu.flags.writeable = True
    assert cache.get(cache.key([pool[:, 1]], gpu)) == "op"
    with warnings.catch_warnings():  # NumPy 2.5 deprecates it; older ones allow it silently
        warnings.simplefilter("ignore", DeprecationWarning)
        gpu.shape = (4, 8)  # reshaped in place
    assert cache.get(cache.key([pool[:, 1]], gpu)) is None


def test_array_keys_are_memoized_until_the_array_changes_or_dies():
    import gc

    import numpy as np

    from cupy_swap import op_cache

    a = np.zeros((8, 4), np.uint8)
    first = op_cache.array_key(a)
    assert op_cache.array_key(a) is first  # memoized
    a.flags.writeable = False
    assert op_cache.array_key(a) != first  # changed in place: computed again
    i = id(a)
    del a
    gc.collect()
    assert i not in op_cache._memo  # the entry went with the array


def test_array_keys_see_subclasses_and_dtype_changes():
    import numpy as np

    from cupy_swap import op_cache

    class Sub(np.ndarray):
        pass

    a = np.zeros((8, 4), np.int16).view(Sub)
    first = op_cache.array_key(a)
    assert len(first) > 1  # keyed by memory, not by identity
    with warnings.catch_warnings():  # deprecated in-place changes NumPy still allows
        warnings.simplefilter("ignore", DeprecationWarning)
        a.dtype = np.float16
    assert op_cache.array_key(a) != first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        a.shape = (4, 8)
    assert op_cache.array_key(a)[2] == (4, 8)


def test_op_cache_evicts_the_least_recently_used():
    import numpy as np

    from cupy_swap.op_cache import OpCache

    cache = OpCache(size=2)
    arrays = [np.zeros((2, 2), np.uint8) for _ in range(3)]
    keys = [cache.key(a, a) for a in arrays]
    cache.put(keys[0], 0, arrays[0], arrays[0])
    cache.put(keys[1], 1, arrays[1], arrays[1])
    assert cache.get(keys[0]) == 0  # used: the other one is now the least recent
    cache.put(keys[2], 2, arrays[2], arrays[2])
    assert cache.get(keys[1]) is None and cache.get(keys[0]) == 0 and cache.get(keys[2]) == 2


def test_a_per_layer_loop_of_256_layouts_hits_after_its_first_pass():
    """Finding 10 of issue 32: insertion-order eviction, and get() that did
    not refresh, made a loop over 128 layouts miss on every call."""
    import numpy as np

    from cupy_swap.op_cache import OpCache
    from cupy_swap.swapper import _OP_CACHE_SIZE

    cache = OpCache(_OP_CACHE_SIZE)
    arrays = [np.zeros((2, 2), np.uint8) for _ in range(257)]
    built = 0
    for _pass in range(3):
        for a in arrays[:256]:
            key = cache.key(a, a)
            if cache.get(key) is None:
                cache.put(key, id(a), a, a)
                built += 1
    assert built == 256


def test_staged_refusals_name_the_real_reason():
    import numpy as np

    from cupy_swap.core.parts import as_parts, copy_groups, groups_problem

    pool = np.zeros((10, 2, 16), np.uint8)
    reversed_view = as_parts(pool[::-1].reshape(10, 32), "dst")
    assert copy_groups(reversed_view) is None
    assert "negative block stride" in groups_problem(reversed_view)
    half = as_parts(pool[:, 0], "dst")  # the other half of each row is not in the swap
    assert copy_groups(half) is None
    assert "bytes of arrays that are not in this swap" in groups_problem(half)


def test_event_pool_recycles_only_events_nobody_holds(monkeypatch):
    """Swap events are recorded again only once the caller and every ring
    slot have dropped them; the free reference count is measured for the
    running interpreter."""
    from cupy_swap.cuda import streams

    class FakeEvent:
        def __init__(self, disable_timing=True):
            self.timed = not disable_timing

    monkeypatch.setattr(streams, "swap_event_class", lambda: FakeEvent)
    made = [0]

    class CountedEvent(FakeEvent):
        def __init__(self, disable_timing=True):
            super().__init__(disable_timing)
            made[0] += 1

    monkeypatch.setattr(streams, "swap_event_class", lambda: CountedEvent)
    ready = streams.EventPool(size=8)  # made up front: a call never creates one (NOTES 77)
    assert made[0] == 4
    held = [ready.take("kernel", 0) for _ in range(3)]  # the caller keeps its last three events
    assert made[0] == 4 and len({id(e) for e in held}) == 3
    monkeypatch.setattr(streams, "swap_event_class", lambda: FakeEvent)
    pool = streams.EventPool(size=8, ready=1)
    first = pool.take("kernel", 0)
    first_id = id(first)
    slot_holds = [pool.take("kernel", 0)]  # a descriptor slot gating on the second
    assert pool.take("kernel", 0) is not first  # the caller still holds the first
    del first
    again = pool.take("kernel", 0)
    assert id(again) == first_id  # dropped: recorded again instead of a new event
    assert pool.take("kernel", 0) is not slot_holds[0]  # the slot's event stays untouched
    timed = pool.take("kernel", 0, True)
    assert timed.timed and timed not in list(pool._issued)  # timed events are never pooled


@pytest.mark.parametrize("ring", [16, 128, 300])
def test_a_swappers_event_pool_outlasts_its_rings(monkeypatch, ring):
    """A ring slot holds its launch's event until a call takes the slot
    again: with fewer pooled events than the rings hold, calls made new
    events (one a call with SGLang's 128-slot swapper, NOTES 82). Sized by
    event_pool_size, a warm swapper's calls make none, kernel calls (``k``,
    slot ring) mixed with copy-engine calls (``x``, no ring) and staged or
    descriptor calls (``d``, the other ring), down to one call in four on a
    ring."""
    import collections

    from cupy_swap.cuda import streams

    made = [0]

    class CountedEvent:
        def __init__(self, disable_timing=True):
            made[0] += 1

    monkeypatch.setattr(streams, "swap_event_class", lambda: CountedEvent)

    def calls_that_made_an_event(pool_size, pattern):
        pool = streams.EventPool(size=pool_size)
        rings = {"k": collections.deque([None] * ring), "d": collections.deque([None] * ring)}
        caller = []  # the caller keeps its last events (SGLang's last_events())
        counts = []
        for step in range(12 * ring):
            before = made[0]
            event = pool.take("kernel", 0)  # a call takes its event, then its slot
            slots = rings.get(pattern[step % len(pattern)])
            if slots is not None:
                slots.popleft()  # the slot's last launch's event is let go
                slots.append(event)
            caller = (caller + [event])[-3:]
            del event
            counts.append(made[0] - before)
        return sum(counts[8 * ring :])

    for pattern in ("k", "kx", "kd", "kxd", "kxxx"):
        assert calls_that_made_an_event(streams.event_pool_size(ring), pattern) == 0, pattern
    if ring > 64:
        assert calls_that_made_an_event(64, "k") == 4 * ring  # the old fixed size: one a call


def test_the_capture_query_is_bound_once_and_translates_a_refusal(monkeypatch):
    """Every call asks whether its stream captures: CuPy's query is bound at
    the first ask (an import statement per call cost 0.25 µs), and a refusal
    (the legacy stream while another stream captures) is a RuntimeError
    that says what to do."""
    from cupy_swap.cuda import streams

    class Refused(Exception):
        pass

    def query(handle):
        if handle == 0:
            raise Refused("cudaErrorStreamCaptureImplicit")
        return handle == 7

    monkeypatch.setattr(streams, "_capture_query", (query, Refused))
    assert streams.stream_is_capturing(7) and not streams.stream_is_capturing(5)
    with pytest.raises(RuntimeError, match="legacy default stream .*pass that stream instead"):
        streams.stream_is_capturing(0)
    monkeypatch.setattr(streams, "_capture_query", ())
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed here")
    bound = streams._bind_capture_query()
    assert bound == (cupy.cuda.runtime.streamIsCapturing, cupy.cuda.runtime.CUDARuntimeError)
    assert streams._capture_query is bound


def test_a_side_passed_again_is_looked_at_once_and_still_notices_changes():
    """Issue 34, item 3: a list of parts seen before costs one look over the
    side (no call per array), which still sees a part changed in place; the
    side's memo goes with any of its arrays."""
    import gc

    import numpy as np

    from cupy_swap import op_cache

    parts = [np.zeros((8, 4), np.uint8) for _ in range(3)]
    first = op_cache.side_key(parts)
    assert op_cache.side_key(parts) == first  # the second sight builds the side's memo
    ids = tuple(map(id, parts))
    assert ids in op_cache._sides
    assert op_cache.side_key(parts) == first  # served by it
    parts[1].flags.writeable = False  # changed in place: seen by the side's look
    changed = op_cache.side_key(parts)
    assert changed != first and changed[1] == op_cache._memory_key(parts[1])
    assert op_cache.side_key(parts) == changed
    del parts[2]
    gc.collect()
    assert ids not in op_cache._sides and not any(ids in s for s in op_cache._side_of.values())


def test_side_memos_never_outlive_their_arrays_across_threads():
    """Arrays made and dropped in four threads, their ids reused all the
    time: every side's key is the key of the memory it describes now, and
    no memo of a dead side is left."""
    import gc
    import threading

    import numpy as np

    from cupy_swap import op_cache

    before, wrong = len(op_cache._sides), []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            parts = [np.zeros((4, int(rng.integers(1, 5))), np.uint8) for _ in range(3)]
            for _ in range(3):
                if op_cache.side_key(parts) != tuple(op_cache._memory_key(p) for p in parts):
                    wrong.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not wrong
    assert len(op_cache._sides) <= before
