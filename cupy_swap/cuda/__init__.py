"""Everything that talks to CUDA: the kernel ABI and launches, the copy
engines, the stager, pinned memory, streams and events."""
