"""Kernel sources: found, assembled, hashed, and compiled by NVRTC for the
architectures we support, all without a GPU."""

import shutil

import pytest

from cupy_swap.cuda import abi, kernels

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")

ALL_NAMES = [abi.descriptor_kernel(w) for w in abi.WIDTHS]
ALL_NAMES += [abi.byref_kernel(w, p) for w in abi.WIDTHS for p in abi.BYREF_PARTS]
ALL_NAMES += [abi.FETCH_KERNEL]


def test_sources_are_found_and_includes_inlined():
    src = kernels.kernel_source()
    assert '#include "' not in src
    assert "CUPY_SWAP_MAX_PARTS" in src  # from swap_abi.cuh
    # Product kernels only: the tuning variants (cache hints, work orders,
    # other unrolls) left the source (benchmarks/NOTES.md, item 27).
    for gone in ("CUPY_SWAP_LOAD", "CUPY_SWAP_STORE", "CUPY_SWAP_WARP_RUNS", "_u2", "_u8"):
        assert gone not in src


def test_kernel_names():
    assert abi.descriptor_kernel(16) == "cupy_swap_w16"
    assert abi.byref_kernel(4, 64) == "cupy_swap_w4_ref64"
    with pytest.raises(ValueError, match="width: expected one of"):
        abi.descriptor_kernel(3)


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
