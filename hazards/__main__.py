import sys

from hazards.cli import main

sys.exit(main())
