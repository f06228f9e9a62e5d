"""Kernel sources: found, assembled, hashed, and compiled by NVRTC for the
architectures we support, all without a GPU."""

import shutil

import pytest

from cupy_swap.cuda import abi, kernels

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")

ALL_NAMES = abi.kernel_names()  # what a launcher loads (kernels.load_all): the compile test finds each


def test_sources_are_found_and_includes_inlined():
    src = kernels.kernel_source()
    assert '#include "' not in src
    assert "CUPY_SWAP_MAX_PARTS" in src  # from swap_abi.cuh
    # Product kernels only: the tuning variants (cache hints, work orders,
    # other unrolls) left the source (benchmarks/NOTES.md, item 27).
    for gone in ("CUPY_SWAP_LOAD", "CUPY_SWAP_STORE", "CUPY_SWAP_WARP_RUNS", "_u2", "_u8"):
        assert gone not in src


def test_kernel_names():
    assert abi.byref_kernel(4, 64) == "cupy_swap_w4_ref64"
    with pytest.raises(ValueError, match="width: expected one of"):
        abi.byref_kernel(3, 16)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiles_with_nvrtc(arch):
    cubin = kernels.compile_with_nvrtc(arch)
    assert cubin[:4] == b"\x7fELF"
    for name in ALL_NAMES:  # every kernel the host may look up is in the binary
        assert name.encode() + b"\0" in cubin, name


def test_cache_key_follows_included_files(tmp_path, monkeypatch):
    copy = tmp_path / "kernels_cu"
    shutil.copytree(kernels.kernel_dir(), copy)
    monkeypatch.setattr(kernels, "kernel_dir", lambda: copy)
    kernels.kernel_source.cache_clear()
    kernels.source_hash.cache_clear()
    try:
        before_src, before_hash = kernels.kernel_source(), kernels.source_hash()
        header = copy / "swap_abi.cuh"
        header.write_text(header.read_text() + "\n// an edit in an included file\n")
        kernels.kernel_source.cache_clear()
        kernels.source_hash.cache_clear()
        assert kernels.kernel_source() != before_src
        assert kernels.source_hash() != before_hash
        assert f"0x{kernels.source_hash()}ull" in " ".join(kernels.compile_options())
    finally:
        kernels.kernel_source.cache_clear()
        kernels.source_hash.cache_clear()


def test_a_launcher_loads_every_kernel_once_so_no_swap_loads_one(monkeypatch):
    """NOTES 74: CUDA loads kernels lazily, and a load may wait for the whole
    GPU; the first swap of a fresh process queued behind a gate hung."""
    pytest.importorskip("cupy")
    from cupy.cuda import driver as cupy_driver

    from cupy_swap.cuda import abi, driver, kernels

    loaded, attrs = [], []
    missing = abi.byref_kernel(16, abi.BYREF_PARTS[-1])  # as older compilers leave it out
    monkeypatch.setattr(kernels, "_all_loaded", set())
    monkeypatch.setattr(kernels, "has_function", lambda device, name: name != missing)
    monkeypatch.setattr(kernels, "get_function", lambda device, name: (device, name))
    monkeypatch.setattr(driver, "load_function", loaded.append)
    monkeypatch.setattr(
        cupy_driver, "funcSetAttribute", lambda fn, attr, value: attrs.append((fn, attr, value))
    )
    kernels.load_all(1, 4096)
    kernels.load_all(1, 4096)  # once per GPU
    names = [n for n in abi.kernel_names() if n != missing]
    assert loaded == [(1, n) for n in names]
    assert attrs == [((1, n), 8, 4096) for n in names if n != abi.FETCH_KERNEL]
