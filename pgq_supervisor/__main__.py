import sys

from pgq_supervisor.cli import main

sys.exit(main())
