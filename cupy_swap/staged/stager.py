"""The staged path on the GPU: a staging arena per direction, its copy
stream and row ring, and the enqueueing of a staged swap's chunks (copy
engines between host runs and the arena, the kernel between the arena and
the GPU blocks).  The plan itself is :mod:`.plan`."""

from __future__ import annotations

import functools
import threading

from ..core.layout import IN, Layout, layout_from_parts
from ..core.parts import CopyGroup
from ..cuda import capture, release
from ..cuda.resolve import resolve_layout
from .plan import (
    RowRing,
    StagedPlan,
    chunk_copies,
    group_regions,
    kernel_pairs,
    staging_parts,
)

_H2D, _D2H = 1, 2


class _ArenaUsers:
    """What may still touch the arena: the row ring and the copy stream (apart
    from the Stager, so its finalizer's gate does not keep it alive)."""

    __slots__ = ("ring", "stream")

    def __init__(self):
        self.ring: RowRing | None = None
        self.stream = None


def _wait_for_users(users: _ArenaUsers) -> None:
    """Block until no queued work touches the arena (event and stream waits:
    unlike a device synchronize, they leave another thread's capture valid)."""
    if users.ring is not None:
        for event in users.ring.events():
            event.synchronize()
    if users.stream is not None:
        users.stream.synchronize()


class Stager:
    """A staging arena of ``staging_bytes`` on ``device`` (allocated on first
    use), the stream its copies run on, the row ring, and a pool of events."""

    def __init__(self, device: int, staging_bytes: int):
        self.device = device
        self.staging_bytes = staging_bytes // 256 * 256
        self.lock = threading.Lock()
        self.base = None  # the arena's address, once allocated
        self._closed = False
        self._users = _ArenaUsers()
        self.geometry = None  # row sizes of the groups the ring is laid out for
        self._events: list = []

    def rows(self, bytes_per_pair: int) -> int:
        """Rows of ``bytes_per_pair`` bytes the arena holds."""
        return self.staging_bytes // bytes_per_pair if bytes_per_pair else 0

    def ensure(self) -> None:
        """Allocate the arena and the copy stream (once, ``lock`` held)."""
        if self._closed:
            raise RuntimeError("swap: the BlockSwapper that made this stager is closed")
        if self.base is not None:
            return
        import cupy

        # Relaxed: a first staged swap may come while a stream captures (this
        # thread's, refused after the allocation, or another thread's).
        with capture.relaxed():
            ptr = release.device_malloc(self.staging_bytes, self.device)  # not CuPy's stream-ordered pool
            self._finalizer = release.when_dropped(
                self,
                functools.partial(release.device_free, ptr, self.device),
                functools.partial(_wait_for_users, self._users),
                f"staging arena of GPU {self.device}",
            )
            with cupy.cuda.Device(self.device):
                self.stream = cupy.cuda.Stream(non_blocking=True)
                self.start = capture.new_event()
        self.base = ptr  # last: it marks the stager ready

    # The row ring and the copy stream live in ``_users`` (see _ArenaUsers).
    ring = property(lambda self: self._users.ring, lambda self, r: setattr(self._users, "ring", r))
    stream = property(lambda self: self._users.stream, lambda self, s: setattr(self._users, "stream", s))

    def close(self) -> None:
        """Hand the arena to the releaser (freed once its users are done)."""
        with self.lock:  # after any staged swap being enqueued
            self._closed = True
            if self.base is not None:
                self._finalizer()

    def layout_for(self, groups: list[CopyGroup], bytes_per_pair: int) -> None:
        """Lay the ring out for ``groups`` (work under another layout stays a
        barrier for every row)."""
        geometry = tuple(g.row_bytes for g in groups)
        if geometry != self.geometry:
            barriers = self.ring.events() if self.ring is not None else []
            self.ring = RowRing(self.rows(bytes_per_pair), barriers)
            self.geometry = geometry

    def event(self):
        """An event from the pool (a new one when none is free)."""
        if self._events:
            return self._events.pop()
        import cupy

        with cupy.cuda.Device(self.device):
            return capture.new_event()

    def release(self, events) -> None:
        """Pool events whose waits are enqueued (a wait keeps the record it saw),
        unless busy rows still wait for them."""
        held = self.ring.holds() if self.ring is not None else set()
        pooled = {id(e) for e in self._events}
        for event in events:
            if id(event) not in held and id(event) not in pooled:
                self._events.append(event)
                pooled.add(id(event))

    def enqueue(self, layout: Layout, plan: StagedPlan, handle: int, launcher, dma) -> None:
        """Enqueue a staged swap.

        A swap-in, per chunk: on the copy stream, waits for the work that last
        read the chunk's rows, its copies and an event; on ``handle``, a wait
        for that event, the scatter over the chunk's pairs (one launch over a
        slot of the row ring holding them: :meth:`_launch_chunk`), and an
        event that frees the rows.  A swap-out mirrors it, and ``handle``
        finally waits for the last copy."""
        with self.lock:
            self.ensure()
            try:
                self._enqueue(layout, plan, handle, launcher, dma)
            except BaseException:
                self._fence_after_failure(handle)
                raise

    def _enqueue(self, layout: Layout, plan: StagedPlan, handle: int, launcher, dma) -> None:
        from cupy.cuda import runtime as rt

        st = self
        groups, bpp = layout.host_groups, layout.bytes_per_pair
        rows = st.rows(bpp)
        half = self._staging_kernel(layout, rows, launcher)
        k, swap_in = plan.num_chunks, layout.direction == IN
        copier = st.stream.ptr
        writer = copier if swap_in else handle  # the stream that fills staging rows
        if swap_in:
            rt.eventRecord(st.start.ptr, handle)  # after the caller's waits
            rt.streamWaitEvent(copier, st.start.ptr, 0)
        st.layout_for(groups, bpp)
        places = [st.ring.place(size, c) for c, size in enumerate(plan.sizes)]
        chunk_rows = [p[0] for p in places]
        copies = chunk_copies(plan, groups, group_regions(groups, rows), st.base, chunk_rows)
        freed = [None] * k

        def free_rows(c: int) -> None:
            # The rows chunk c lands in: free once their last reader is done.
            _, events, chunks = places[c]
            self._wait_all(writer, events + [freed[d] for d in chunks])

        def settle(c: int, stream: int) -> None:
            freed[c] = st.event()
            rt.eventRecord(freed[c].ptr, stream)
            st.ring.settle(c, freed[c])

        pairs = kernel_pairs(plan, chunk_rows, gpu_first=not swap_in)

        def launch(c: int) -> None:
            start = plan.starts[c]
            self._launch_chunk(launcher.slots, half, pairs[start : start + plan.sizes[c]], handle)

        if swap_in:
            copied = [None] * k

            def copy_in(c: int) -> None:
                free_rows(c)
                dma.issue(*copies[c], copier, _H2D)
                copied[c] = st.event()
                rt.eventRecord(copied[c].ptr, copier)

            # Copies that wait for no scatter of this swap go out first: the copy
            # engines then never idle while the host enqueues a chunk's launch.
            ahead = next((c for c, p in enumerate(places) if p[2]), k)
            for c in range(ahead):
                copy_in(c)
            for c in range(k):
                if c >= ahead:
                    copy_in(c)
                self._wait_all(handle, [copied[c]])
                launch(c)
                settle(c, handle)
        else:
            for c in range(k):
                free_rows(c)
                launch(c)
                gathered = st.event()
                rt.eventRecord(gathered.ptr, handle)
                self._wait_all(copier, [gathered])
                dsts, srcs, sizes = copies[c]  # (staging, host) addresses
                dma.issue(srcs, dsts, sizes, copier, _D2H)
                settle(c, copier)
            rt.streamWaitEvent(handle, freed[-1].ptr, 0)  # the swap ends when its last copy has landed

    @staticmethod
    def _launch_chunk(ring, kernel, rows, handle: int) -> None:
        """One chunk's kernel launch on ``handle``: its rows (made here, not
        checked) into a slot of the row ring ``ring``, the slot's launch."""
        i = ring.take()
        try:
            seq = ring.write_unchecked(i, rows, rows.shape[0])
            kernel.launch_slot(i, handle)
        except BaseException:
            ring.give_back(i)
            raise
        ring.pending[i] = seq

    def _fence_after_failure(self, handle: int) -> None:
        """A staged swap failed halfway: fence every row it placed behind all it
        may have queued on either stream.  If no event can be recorded, wait
        on the host and start the ring afresh; if even that fails (a broken
        context), drop this swap's unsettled rows, keeping other barriers."""
        from cupy.cuda import runtime as rt

        st = self
        if st.ring is None:
            return  # failed before placing anything
        try:
            on_caller, fence = st.event(), st.event()
            rt.eventRecord(on_caller.ptr, handle)
            rt.streamWaitEvent(st.stream.ptr, on_caller.ptr, 0)
            rt.eventRecord(fence.ptr, st.stream.ptr)
            st.ring.settle_all(fence)
            st.release([on_caller])
            return
        except Exception:
            pass
        try:
            with capture.relaxed():
                rt.streamSynchronize(handle)
                rt.streamSynchronize(st.stream.ptr)
                for event in st.ring.events():
                    event.synchronize()
            st.ring, st.geometry = None, None
        except Exception:
            st.ring.drop_unsettled()

    def _wait_all(self, stream: int, events: list) -> None:
        """Make ``stream`` wait for ``events``, then pool them."""
        from cupy.cuda import runtime

        for ev in events:
            runtime.streamWaitEvent(stream, ev.ptr, 0)
        self.release(events)

    def _staging_kernel(self, layout: Layout, arena_rows: int, launcher):
        """The kernel half of a staged swap (arena -> GPU or GPU -> arena),
        resolved and bound once, cached on the layout: the arena never moves."""
        kernel = layout.staging_kernel
        if kernel is None:
            host = layout.src if layout.direction == IN else layout.dst
            parts = staging_parts(host, layout.host_groups, self.base, arena_rows, self.device)
            pair = (parts, layout.dst) if layout.direction == IN else (layout.src, parts)
            kernel = layout.staging_kernel = launcher.bind(
                resolve_layout(layout_from_parts(*pair), self.device)
            )
        return kernel
