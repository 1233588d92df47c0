import sys

from auditlib.cli import main

sys.exit(main())
