"""The 8-bit block codec loads numba only to encode (checked in a fresh interpreter)."""

from __future__ import annotations


def test_decoding_and_checking_blocks_do_not_load_numba() -> None:
    """A server decodes 8-bit pushes; only a worker that encodes them pays numba's ~150 MB."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from psproto import blocks, codec\n"
        "scales = torch.ones(1)\n"
        "blocks.check_scales(scales, 10)\n"
        "blocks.decode(torch.ones(10, dtype=torch.int8), scales, torch.empty(10))\n"
        "assert 'numba' not in sys.modules, 'numba loaded by decoding'\n"
        "blocks.encode(torch.ones(10))\n"
        "assert 'numba' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
