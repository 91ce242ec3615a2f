"""Every workaround for the installed Paddle, each gated on its version (version_gate).

version_check: refuse a Paddle older than 3 before anything imports it; quiet_warnings: two
start-up warnings held where they start, one glog line left out of fleetrun's console;
value_clip: the ClipGradByValue that Paddle 3.3 cannot build into a PIR program;
static_execution: a dygraph script's PIR program built and run (the LR scheduler's global scope,
the optimizer's eager parameter list); termination: SIGTERM without Paddle's crash report;
removed_names: the fix for a name Paddle 3 removed, added to the script's traceback;
ring_aware_collectives: sub-group collectives on CPU through communicators looked up by key.
"""
