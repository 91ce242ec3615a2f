"""Raises from a nested call, with its argument in the message: the traceback fleetrun must show."""
import sys


def lookup(name):
    return {}[f"argument {name}"]


lookup(sys.argv[1])
