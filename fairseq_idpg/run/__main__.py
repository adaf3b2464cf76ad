"""``python -m fairseq_idpg.run``: what ``scripts/run.sh`` runs."""

import sys

from fairseq_idpg.run import main

sys.exit(main())
