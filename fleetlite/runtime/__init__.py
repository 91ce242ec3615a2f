"""What runs in the worker: the training program, process group, fleet.util, saving."""
