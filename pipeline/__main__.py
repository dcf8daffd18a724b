import sys

from pipeline.commands.cli import main

sys.exit(main())
