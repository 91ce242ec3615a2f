"""A GradScaler that can lower its loss scale under NumPy 2.4.

Paddle 3.3.1's `GradScaler._update` prints `float(self._scale)` when it lowers the scale after
a step with an inf or a NaN; the scale is a one-element 1-D tensor, whose float() NumPy 2.4 no
longer allows (TypeError: only 0-dimensional arrays can be converted to Python scalars), so the
first skipped step ends the script. `lowers_without_crashing(scaler)` runs the scaler's own
update on a 0-d view of the scale and gives the scale back its shape [1] (what the rest of
Paddle's scaler, its state_dict included, expects).
"""
import types

from fleetlite.paddle_compat.version_gate import needed


def lowers_without_crashing(scaler):
    """`scaler`, its `_update` fixed as above where the installed Paddle needs it."""
    if not needed("GradScaler float() of its scale"):
        return scaler
    update = scaler._update

    def update_on_a_scalar(self):
        self._scale = self._scale.reshape([])
        try:
            update()
        finally:
            self._scale = self._scale.reshape([1])

    scaler._update = types.MethodType(update_on_a_scalar, scaler)
    return scaler
