"""``python -m fairseq_idpg.run``: what ``scripts/run.sh`` runs."""

import logging
import sys

# run.sh's own process builds the model only to check and plan it: fairseq's INFO lines (the backbone
# loaded, the parameter counts) belong to fairseq-train's output, not before the run's header
for name in ("fairseq", "fairseq_idpg"):
    logging.getLogger(name).setLevel(logging.WARNING)

from fairseq_idpg.run import main  # noqa: E402

sys.exit(main())
