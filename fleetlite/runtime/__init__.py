"""What runs in the worker: the training program, process group, fleet.util, saving, and the
dygraph train step with the state it shares with eager code."""
