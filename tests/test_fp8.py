"""llmc/kernels/fp8.h's float -> E4M3 / E5M2 conversion (through tests/fp8_tool) bit for bit against ml_dtypes, an
independent implementation of the OCP FP8 formats: every code's value, every midpoint between neighbouring codes
and the floats just beside it, and a million random floats, all within the finite range. (Beyond it ml_dtypes
gives NaN or infinity where fp8.h saturates, as cuBLASLt does; tests/test_fp8.c checks that part.)"""
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tests", "fp8_tool")
FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 0), "e5m2": (ml_dtypes.float8_e5m2, 1)}


def ours(x):
    out = subprocess.run([TOOL], input=x.astype("<f4").tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, np.uint8).reshape(-1, 2)


def inputs(dtype):
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    finite = np.sort(np.unique(np.abs(codes[np.isfinite(codes)])))
    mids = (finite[:-1] + finite[1:]) / 2  # exact in float32
    beside = np.concatenate([np.nextafter(mids, 0), np.nextafter(mids, np.inf)]).astype(np.float32)
    rng = np.random.default_rng(7)
    top = float(finite[-1])
    rand = (rng.uniform(0, 1, 1_000_000) ** 8 * top).astype(np.float32)  # dense near zero, reaching the top
    x = np.concatenate([finite, mids, beside, rand])
    x = x[x < top]
    return np.concatenate([x, -x])


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_matches_ml_dtypes(name):
    dtype, column = FORMATS[name]
    x = inputs(dtype)
    got = ours(x)[:, column]
    want = x.astype(dtype).view(np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{name}: {bad.size} of {x.size} differ, e.g. {x[bad[0]]!r}: fp8.h 0x{got[bad[0]]:02x}, "
                           f"ml_dtypes 0x{want[bad[0]]:02x}")
