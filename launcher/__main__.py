import sys

from fleetlite.launcher.main import main

sys.exit(main())
