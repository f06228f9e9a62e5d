"""Tools built on the library (benchmarks, the CLI, calibration); nothing in
``core`` or ``cuda`` imports them."""
