"""Prints what the launcher told this process, for the --explain test."""
import os

print(f"explain={os.environ.get('FLEETLITE_EXPLAIN_ONLY')} rank={os.environ['PADDLE_TRAINER_ID']} "
      f"world={os.environ['PADDLE_TRAINERS_NUM']} pid={os.getpid()}", flush=True)
