import sys

from launcher.jobs.command import main

sys.exit(main())
