"""Helpers the tests and their worker processes import (tests/ is on their sys.path)."""
