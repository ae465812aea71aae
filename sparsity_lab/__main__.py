import sys

from sparsity_lab.lab.cli import main

sys.exit(main())
