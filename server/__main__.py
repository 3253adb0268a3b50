import sys

from pymq_server.cli import main

sys.exit(main())
