"""fleetrun, the launcher: one process per device on every host, supervised all-or-nothing.

    spec.py       flags + environment -> LaunchSpec (flag > environment > default)
    preflight.py  script, this host, devices, rank 0's store port: checked before any start
    plan.py       LaunchSpec -> WorkerSlots (pure: ranks, devices, endpoints, env, logs)
    transport.py  start processes: this host's workers, other hosts' fleetruns over ssh
    supervisor.py watch the group; on the first failure stop the rest (SIGTERM, grace, SIGKILL)
    failure_report.py  the root cause once, its victims, the ranks that were behind
    job.py        start -> supervise -> report -> restart, for this host's group
    bootstrap.py  inside each worker: die with fleetrun, record errors and progress
"""
