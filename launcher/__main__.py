"""`fleetrun` and `python -m fleetlite.launcher`: the launcher, handed the tuner for --tune."""
import sys

from fleetlite import tuning
from fleetlite.launcher import main as launcher


def main():
    return launcher.main(tune=tuning.tune)


if __name__ == "__main__":
    sys.exit(main())
