"""Values ranks exchange through fleet.util.all_gather and pto's sharded save, and a strict
comparison (types, dtypes, shapes and values) for checking that they arrive unchanged."""
from pathlib import Path

import numpy as np


def rank_values(rank):
    """What rank `rank` sends: every kind of value the plain encoding carries."""
    rng = np.random.default_rng(rank)
    return {
        "rank": rank,
        "fleet_surface": {"rank": rank, "r2": rank ** 2},
        "metrics": [rank * 0.5, float("inf"), -0.0, 10 ** 30, "text é", None, True, b"\x00raw\xff"],
        "tuple_and_int_keys": ((rank, "a"), {1: "one", (2, 3): [4], None: False, 2.5: ()}),
        "sharded_state": {"fc_0.w_0_moment1_0": rng.standard_normal((3, 4)).astype(np.float32),
                          "fc_0.b_0_beta1_pow_acc_0": np.array([0.9 ** rank], np.float32),
                          "learning_rate_0": np.array(0.01, np.float64)},
        "dtypes": [(np.arange(6) % 3).astype(dtype).reshape(2, 3) for dtype in
                   (np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.complex64)],
        "odd_arrays": [np.zeros((0, 5), np.float32), np.arange(12.0).reshape(3, 4)[:, ::2],
                       np.arange(4, dtype=">i4")],
        "numpy_scalars": [np.float64(rank), np.float32(1.5), np.int64(-rank), np.bool_(True)],
    }


def differences(got, expected, where="value"):
    """Where `got` differs from `expected` in type, dtype, shape or value ([] when none)."""
    if type(got) is not type(expected):
        return [f"{where}: {type(got).__name__} != {type(expected).__name__}"]
    if isinstance(expected, np.ndarray):
        same = got.dtype == expected.dtype and got.shape == expected.shape and np.array_equal(got, expected)
        return [] if same else [f"{where}: {got!r} != {expected!r}"]
    if isinstance(expected, (list, tuple)):
        if len(got) != len(expected):
            return [f"{where}: {len(got)} items != {len(expected)}"]
        return [d for i, (g, e) in enumerate(zip(got, expected)) for d in differences(g, e, f"{where}[{i}]")]
    if isinstance(expected, dict):
        if list(got) != list(expected):
            return [f"{where}: keys {list(got)} != {list(expected)}"]
        return [d for k in expected for d in differences(got[k], expected[k], f"{where}[{k!r}]")]
    if isinstance(expected, np.generic):
        return [] if got.dtype == expected.dtype and got == expected else [f"{where}: {got!r} != {expected!r}"]
    return [] if got == expected else [f"{where}: {got!r} != {expected!r}"]


class Planted:
    """A pickle that, once loaded, writes the file it names: what a hostile peer would send."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "ran"))
