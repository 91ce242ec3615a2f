"""What runs a compiled job: the dygraph train step and the state it shares with eager code."""
