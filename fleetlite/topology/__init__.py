"""Who this process is in the job: the Topology value and the environment readers."""
