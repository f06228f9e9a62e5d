"""Checks and decisions that need only NumPy: parts, layouts, mappings, the
one run detector, routing policy and staged planning.  Nothing here imports
CuPy or talks to a GPU; all of it is tested on the CPU."""
