"""fleetlite's version, kept apart so packaging can read it without importing Paddle."""
__version__ = "0.1.0"
