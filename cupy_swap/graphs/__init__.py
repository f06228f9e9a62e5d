"""Swaps inside CUDA graphs.

- :mod:`.captured`         the swap captured into your own graph
  (``op.captured()``, :class:`~.captured.CapturedSwap`): each replay copies
  the rows your kernels wrote in it, checked on the GPU;
- :mod:`.replay_verdicts`  its failures, one per bad replay, in a pinned ring;
- :mod:`.graph_swap`       :class:`~.graph_swap.GraphSwap`
  (``sw.graph_swap()``, ``cupy_swap.GraphSwap``): a swap to capture whose
  mapping is set between replays.

Nothing is imported here: the swapper imports these modules when it needs them.
"""
