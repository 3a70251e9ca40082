import sys

from oscarkv.cli.main import main

sys.exit(main())
