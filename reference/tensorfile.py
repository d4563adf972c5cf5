"""Reader and writer of the .llmt tensor file format (docs/tensor_file_format.md).

Depends on numpy only, so data tools and tests can use it without torch.
"""
import os
import struct

import numpy as np

MAGIC = b"LLMTENS\x00"
VERSION = 1
ALIGN = 64
DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<i4")}  # bfloat16 (3) has no numpy dtype
DTYPE_CODES = {np.dtype("<f4"): 1, np.dtype("<i4"): 2}


class TensorFileError(ValueError):
    pass


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write(path, meta, tensors):
    """Write {str: str} meta and [(name, ndarray)] tensors atomically to path."""
    index = bytearray()
    for key, value in meta.items():
        k, v = key.encode(), str(value).encode()
        index += struct.pack("<I", len(k)) + k + struct.pack("<I", len(v)) + v
    offset = 0
    arrays = []
    for name, array in tensors:
        array = np.ascontiguousarray(array)
        dtype = array.dtype.newbyteorder("<")
        if dtype not in DTYPE_CODES:
            raise TensorFileError(f"{name}: dtype {array.dtype} is not float32 or int32")
        array = array.astype(dtype, copy=False)
        n = name.encode()
        index += struct.pack("<I", len(n)) + n
        index += struct.pack("<II", DTYPE_CODES[dtype], array.ndim)
        index += struct.pack(f"<{array.ndim}Q", *array.shape)
        index += struct.pack("<QQ", offset, array.nbytes)
        arrays.append((offset, array))
        offset = _align(offset + array.nbytes)
    data_offset = _align(64 + len(index))
    data_bytes = arrays[-1][0] + arrays[-1][1].nbytes if arrays else 0
    header = MAGIC + struct.pack("<IIII", VERSION, len(meta), len(tensors), 0)
    header += struct.pack("<QQQ", len(index), data_offset, data_bytes) + bytes(16)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(index)
        f.write(bytes(data_offset - 64 - len(index)))
        for off, array in arrays:
            f.write(bytes(data_offset + off - f.tell()))
            f.write(array.tobytes())
    os.replace(tmp, path)


def read(path):
    """Return (meta dict, {name: ndarray}); raise TensorFileError naming path on bad input."""
    with open(path, "rb") as f:
        blob = f.read()

    def bad(msg):
        raise TensorFileError(f"{path}: {msg}")

    if len(blob) < 64 or blob[:8] != MAGIC:
        bad("not a .llmt tensor file (bad magic)")
    version, n_meta, n_tensors, _ = struct.unpack_from("<IIII", blob, 8)
    if version != VERSION:
        bad(f"unsupported version {version} (this reader knows {VERSION})")
    index_bytes, data_offset, data_bytes = struct.unpack_from("<QQQ", blob, 24)
    if len(blob) != data_offset + data_bytes:
        bad(f"file is {len(blob)} bytes, header says {data_offset + data_bytes} (truncated or corrupt)")
    pos, end = 64, 64 + index_bytes

    def take(fmt):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > end:
            bad("index runs past its declared size")
        values = struct.unpack_from(fmt, blob, pos)
        pos += size
        return values

    def take_str():
        nonlocal pos
        (n,) = take("<I")
        if pos + n > end:
            bad("index runs past its declared size")
        s = blob[pos:pos + n].decode()
        pos += n
        return s

    meta = {}
    for _ in range(n_meta):
        key = take_str()
        meta[key] = take_str()
    tensors = {}
    for _ in range(n_tensors):
        name = take_str()
        code, ndim = take("<II")
        if code not in DTYPES or ndim > 8:
            bad(f"tensor {name}: unknown dtype {code} or ndim {ndim}")
        shape = take(f"<{ndim}Q")
        offset, nbytes = take("<QQ")
        if nbytes != int(np.prod(shape, dtype=np.int64)) * DTYPES[code].itemsize or offset + nbytes > data_bytes:
            bad(f"tensor {name}: size or offset out of range")
        start = data_offset + offset
        tensors[name] = np.frombuffer(blob, DTYPES[code], int(np.prod(shape, dtype=np.int64)), start).reshape(shape)
    return meta, tensors
