"""Staged swaps: the copy engines move runs of host rows to or from a GPU
staging arena, and the kernel scatters or gathers the GPU blocks (the one way
to full duplex with host runs).

- :mod:`.plan`    the chunks, copies and kernel pairs of a staged swap, and
  the staging row ring (NumPy only, tested on the CPU);
- :mod:`.stager`  the arena, its copy stream and row ring on the GPU, and the
  enqueueing of a plan's chunks.

``mode="staged"`` asks for it (:mod:`cupy_swap.core.route` says when a layout
can take it).  Nothing is imported here, so the plan imports without CuPy.
"""
