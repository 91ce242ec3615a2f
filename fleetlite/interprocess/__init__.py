"""Small helpers by which the processes of one node take turns (file locks, liveness)."""
