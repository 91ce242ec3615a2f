"""Whether a process still exists: how files named by their writer's pid (a killed save's partial
directory, a killed cache copy) are told apart from live writers' files."""
import os


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # alive, owned by another user
        return True
    return True
