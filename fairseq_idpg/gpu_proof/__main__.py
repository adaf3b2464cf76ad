import sys

from fairseq_idpg.gpu_proof.cli import main

sys.exit(main())
