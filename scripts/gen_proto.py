"""Regenerate the committed protobuf/gRPC stubs from protos/ (``make proto``).

``generate(out_dir)`` is also used by the drift test, which regenerates into a
temporary folder and compares byte for byte with what is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
PROTO_FILES = ("psproto/v1/ps.proto",)


def generate(out_dir: Path) -> list[Path]:
    """Write ps_pb2.py, ps_pb2.pyi and ps_pb2_grpc.py under ``out_dir/psproto/v1``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    # mypy-protobuf's plugins sit beside the interpreter, which need not be on PATH.
    plugins = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-mypy={plugins / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugins / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / "psproto" / "v1").glob("ps_pb2*"))


if __name__ == "__main__":
    written = generate(REPO_ROOT)
    sys.stdout.write("".join(f"wrote {p.relative_to(REPO_ROOT)}\n" for p in written))
