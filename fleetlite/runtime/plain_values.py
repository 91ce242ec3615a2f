"""Values the ranks send each other, as bytes no peer can turn into code: never pickle.

`fleet.util.all_gather` and pto's sharded save exchange Python values between ranks. Paddle's
`all_gather_object` pickles them, and unpickling what arrives over the network runs whatever a
peer (or whoever took over its connection) put there. Here a value is a JSON tree for its
structure plus raw buffers for its arrays, each described by a dtype and a shape that decoding
checks before reading a byte of it:

    b"FLV1" | header length (8 bytes, little-endian) | header (JSON) | buffers, back to back

Values: None, bool, int, float, str, bytes, lists, tuples, dicts whose keys are such values,
and numpy arrays and scalars of boolean, integer, floating or complex dtypes. Anything else
is refused when sending; anything malformed when receiving raises a one-line error.
"""
import json
import re

import numpy as np

from fleetlite.errors import FleetliteError

MAGIC = b"FLV1"
HEADER_LENGTH_BYTES = 8
NUMERIC_DTYPE = re.compile(r"[<>|][biufc][0-9]{1,2}")   # numpy's dtype.str of a plain number type
MAX_DIMENSIONS = 32
ACCEPTED = ("None, bool, int, float, str, bytes, lists, tuples, dicts and numpy arrays or scalars "
            "of numbers")


class MalformedValue(FleetliteError):
    """Bytes from a peer that are not a value this module wrote."""


def encode(value):
    """`value` as bytes; FleetliteError naming the first part of it that cannot be sent."""
    buffers, headers = [], []
    tree = _tree(value, buffers, headers)
    header = json.dumps({"value": tree, "buffers": headers}, separators=(",", ":")).encode()
    return b"".join([MAGIC, len(header).to_bytes(HEADER_LENGTH_BYTES, "little"), header, *buffers])


def _tree(value, buffers, headers):
    if isinstance(value, (np.ndarray, np.generic)) and NUMERIC_DTYPE.fullmatch(value.dtype.str):
        kind = "array" if isinstance(value, np.ndarray) else "scalar"   # np.float64 is a float too
        return {kind: _buffer(np.asarray(value), buffers, headers)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_tree(item, buffers, headers) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [_tree(item, buffers, headers) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[_tree(k, buffers, headers), _tree(v, buffers, headers)] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"bytes": _buffer(np.frombuffer(value, np.uint8), buffers, headers)}
    raise FleetliteError(f"cannot send a {type(value).__name__} between ranks "
                         f"(sent as plain data, never pickled): send {ACCEPTED}")


def _buffer(array, buffers, headers):
    headers.append({"dtype": array.dtype.str, "shape": list(array.shape)})
    buffers.append(np.ascontiguousarray(array).tobytes())
    return len(headers) - 1


def decode(data):
    """The value `data` holds; MalformedValue, before anything is built, for bytes that are not
    exactly what `encode` writes."""
    data = memoryview(data)
    start = len(MAGIC) + HEADER_LENGTH_BYTES
    if len(data) < start or bytes(data[:len(MAGIC)]) != MAGIC:
        raise MalformedValue("a peer sent bytes that are not a fleetlite value (no FLV1 mark): "
                             "is every rank running the same fleetlite?")
    end = start + int.from_bytes(data[len(MAGIC):start], "little")
    if end > len(data):
        raise MalformedValue(f"a peer sent a value whose header claims {end - start} bytes of {len(data) - start}")
    try:
        header = json.loads(bytes(data[start:end]))
        arrays = _arrays(header["buffers"], data[end:])
        return _value(header["value"], arrays)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise MalformedValue(f"a peer sent a malformed value ({type(exc).__name__}: "
                             f"{str(exc)[:120]})") from None


def _arrays(headers, body):
    arrays, offset = [], 0
    for header in headers:
        dtype, shape = header["dtype"], header["shape"]
        if not (isinstance(dtype, str) and NUMERIC_DTYPE.fullmatch(dtype)):
            raise ValueError(f"dtype {dtype!r} is not a plain number type")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMENSIONS
                and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError(f"shape {shape!r} is not a list of at most {MAX_DIMENSIONS} sizes")
        dtype = np.dtype(dtype)
        size = dtype.itemsize * int(np.prod(shape, dtype=object))
        if offset + size > len(body):
            raise ValueError(f"an array of {size} bytes runs past the {len(body)} sent")
        arrays.append(np.frombuffer(body[offset:offset + size], dtype).reshape(shape).copy())
        offset += size
    if offset != len(body):
        raise ValueError(f"{len(body) - offset} bytes follow the last array")
    return arrays


def _value(tree, arrays):
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, list):
        return [_value(item, arrays) for item in tree]
    if not (isinstance(tree, dict) and len(tree) == 1):
        raise ValueError(f"unknown node {str(tree)[:40]}")
    (kind, content), = tree.items()
    if kind == "tuple":
        return tuple(_value(item, arrays) for item in content)
    if kind == "dict":
        return {_value(key, arrays): _value(item, arrays) for key, item in content}
    if kind in ("array", "scalar", "bytes") and type(content) is int and content >= 0:
        array = arrays[content]
        if kind == "array":
            return array
        if kind == "scalar" and array.ndim == 0:
            return array[()]
        if kind == "bytes" and array.dtype == np.uint8 and array.ndim == 1:
            return array.tobytes()
        raise ValueError(f"a {kind} node refers to an array of shape {array.shape}, {array.dtype}")
    raise ValueError(f"unknown node {kind!r}")
