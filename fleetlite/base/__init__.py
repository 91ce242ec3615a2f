"""Fleet's `paddle.distributed.fleet.base` module path, so `from fleetlite.base.role_maker
import ...` works where a Fleet script imported from `paddle.distributed.fleet.base.role_maker`."""
