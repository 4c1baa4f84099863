"""Element sizes of the dtypes a manifest may name, without importing torch.

Names are torch's own (``str(torch.bfloat16)`` without the ``torch.`` prefix), so the
mapping to torch lives in one place (``tensorhub.io.tensors``) and the cores stay pure.
"""

from __future__ import annotations

from .errors import ManifestError

ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "uint32": 4,
    "int32": 4,
    "uint64": 8,
    "int64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    # Two 4-bit values packed per element; torch counts it as one 1-byte element.
    "float4_e2m1fn_x2": 1,
}


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype``; a clear error for anything we cannot move as bytes."""
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise ManifestError(
            f"unsupported dtype {dtype!r}; supported: {', '.join(sorted(ITEMSIZE))}"
        ) from None
