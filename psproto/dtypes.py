"""The wire dtypes and chunk sizes by name: what a command line or a config may ask for.

Kept apart from psproto.codec, which turns tensors into bytes, so that code that only names a
dtype or checks a chunk size (the admin commands, option parsing) does not import torch.
"""

from __future__ import annotations

from typing import TypeAlias

from psproto.v1 import ps_pb2

# A chunk and its copies fit a core's L2 cache on common hosts (1 MiB): on a 2-core host a
# ResNet-18-sized step was 1.04-1.18x faster than with 2 MiB, and slower again at 512 KiB (more
# messages) and 4 MiB (benchmarks/chunk_size.py; docs/performance.md, "Chunk size").
DEFAULT_CHUNK_BYTES = 1024 * 1024
# The largest message workers send and receive (and servers, by default: transport.max_message_bytes).
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Below this a ResNet-18-sized step is hundreds of messages, each with its Python and gRPC overhead.
MIN_CHUNK_BYTES = 64 * 1024


def chunk_bytes_problem(chunk_bytes: int, max_message_bytes: int | None = None) -> str | None:
    """Why ``chunk_bytes`` cannot be a chunk size (None when it can): at least ``MIN_CHUNK_BYTES``,
    and at most half the largest message, so a chunk and its header always fit."""
    if chunk_bytes < MIN_CHUNK_BYTES:
        return f"a chunk of {chunk_bytes} bytes is below the smallest, {MIN_CHUNK_BYTES} (64KiB)"
    if max_message_bytes is not None and chunk_bytes > max_message_bytes // 2:
        return (
            f"a chunk of {chunk_bytes} bytes is above half the largest message ({max_message_bytes} bytes); "
            "give a smaller chunk or a larger message limit"
        )
    return None


DTypeValue: TypeAlias = ps_pb2.DType.ValueType

# The wire dtypes by name, so code that never touches a message needs no generated module.
UNSPECIFIED: DTypeValue = ps_pb2.DTYPE_UNSPECIFIED
FLOAT32: DTypeValue = ps_pb2.DTYPE_FLOAT32
BFLOAT16: DTypeValue = ps_pb2.DTYPE_BFLOAT16
FLOAT16: DTypeValue = ps_pb2.DTYPE_FLOAT16
INT8_BLOCK: DTypeValue = ps_pb2.DTYPE_INT8_BLOCK

WIRE_DTYPE_NAMES: dict[str, DTypeValue] = {
    "fp32": ps_pb2.DTYPE_FLOAT32,
    "bf16": ps_pb2.DTYPE_BFLOAT16,
    "fp16": ps_pb2.DTYPE_FLOAT16,
}
# What a push may be sent in: the pull dtypes and the 8-bit block codec.
PUSH_DTYPE_NAMES: dict[str, DTypeValue] = {**WIRE_DTYPE_NAMES, "int8": ps_pb2.DTYPE_INT8_BLOCK}


def pull_dtype_problem(name: str) -> str:
    """Why ``name`` cannot be a pull (or Init) dtype, for a user's error message."""
    if name in PUSH_DTYPE_NAMES:
        return (
            f"{name} (the 8-bit block codec) is for pushes only: the parameters are never sent below 16 bits; "
            f"pull in {', '.join(WIRE_DTYPE_NAMES)} (e.g. --push-dtype {name} --pull-dtype bf16)"
        )
    return f"pull dtype {name!r} is not one of {', '.join(WIRE_DTYPE_NAMES)}"
