"""Kernel sources: found, assembled, hashed, and compiled by NVRTC for the
architectures we support, all without a GPU."""

import shutil

import pytest

from cupy_swap import kernels

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")


def test_sources_are_found_and_includes_inlined():
    src = kernels.kernel_source()
    assert '#include "' not in src
    assert "CUPY_SWAP_MAX_PARTS" in src  # from swap_desc.cuh
    names = {kernels.kernel_name(w, u) for w in kernels.WIDTHS for u in kernels.UNROLLS}
    assert names == {f"cupy_swap_w{w}_u{u}" for w in (16, 8, 4, 2, 1) for u in (2, 4, 8)}
    for w in kernels.WIDTHS:  # each width is instantiated (test_compiles_with_nvrtc checks the cubin)
        assert f", {w})" in src


def test_kernel_name_rejects_unknown_shapes():
    assert kernels.kernel_name(16, 4) == "cupy_swap_w16_u4"
    with pytest.raises(ValueError, match="no kernel for width=3"):
        kernels.kernel_name(3, 4)


def test_descriptor_constants_match_python():
    from cupy_swap import descriptor

    text = (kernels.kernel_dir() / "swap_desc.cuh").read_text()
    assert f"#define CUPY_SWAP_HEADER_WORDS {descriptor.HEADER_WORDS}" in text
    assert f"#define CUPY_SWAP_PART_WORDS {descriptor.PART_WORDS}" in text
    assert f"#define CUPY_SWAP_MAX_PARTS {descriptor.MAX_PARTS}" in text


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiles_with_nvrtc(arch):
    cubin = kernels.compile_with_nvrtc(arch)
    assert cubin[:4] == b"\x7fELF"
    for w in kernels.WIDTHS:
        for u in kernels.UNROLLS:
            assert kernels.kernel_name(w, u).encode() in cubin


def test_cache_key_follows_included_files(tmp_path, monkeypatch):
    copy = tmp_path / "kernels_cu"
    shutil.copytree(kernels.kernel_dir(), copy)
    monkeypatch.setattr(kernels, "kernel_dir", lambda: copy)
    kernels.kernel_source.cache_clear()
    kernels.source_hash.cache_clear()
    try:
        before_src, before_hash = kernels.kernel_source(), kernels.source_hash()
        header = copy / "swap_desc.cuh"
        header.write_text(header.read_text() + "\n// an edit in an included file\n")
        kernels.kernel_source.cache_clear()
        kernels.source_hash.cache_clear()
        assert kernels.kernel_source() != before_src
        assert kernels.source_hash() != before_hash
        assert f"0x{kernels.source_hash()}ull" in " ".join(kernels.compile_options())
    finally:
        kernels.kernel_source.cache_clear()
        kernels.source_hash.cache_clear()


def test_unknown_kernel_rejected():
    with pytest.raises(ValueError, match="no kernel for width=3"):
        kernels.kernel_name(3, 4)
