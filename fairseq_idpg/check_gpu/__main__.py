import sys

from fairseq_idpg.check_gpu.cli import main

sys.exit(main())
