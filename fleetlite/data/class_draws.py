"""Per-class draws for the class-aware samplers: which samples a class contributes, in what
order, so that every member is drawn equally often and no window (a step, a P×K group) holds
one sample twice when the class is large enough."""
import numpy as np

from fleetlite.errors import DataError


def class_members(labels):
    """(sorted classes, [dataset indices of each class]) from one label per sample."""
    array = np.asarray(labels)
    if array.ndim > 1:
        if array.size != len(array):
            raise DataError(f"labels of shape {array.shape}: give one label per sample")
        array = array.reshape(-1)
    if len(array) == 0:
        raise DataError("the labels are empty (0 samples): there is nothing to sample")
    classes, inverse = np.unique(array, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(classes))
    members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    return classes, members


def draw_stream(rng, members, total, window_starts):
    """`total` draws from `members`: consecutive passes, each a fresh permutation, so every
    member is drawn floor or ceil(total / n) times.

    `window_starts` (sorted, starting at 0) cuts the draws into windows. Where a window spans
    two passes, the later pass is reordered so that the window holds distinct samples; that is
    possible whenever the window is no longer than the class (the callers check it)."""
    n = len(members)
    passes = -(-total // n)
    stream = np.concatenate([rng.permutation(members) for _ in range(passes)])
    for boundary in range(n, total, n):
        i = np.searchsorted(window_starts, boundary, side="right") - 1
        start = window_starts[i]
        stop = window_starts[i + 1] if i + 1 < len(window_starts) else total
        if start == boundary or stop - start > n:
            continue
        following = stream[boundary:boundary + n]
        clash = np.isin(following, stream[start:boundary])
        if clash[:stop - boundary].any():
            stream[boundary:boundary + n] = np.concatenate([following[~clash], following[clash]])
    return stream[:total]
