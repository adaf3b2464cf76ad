"""``python -m fairseq_idpg.run``: what ``scripts/run.sh`` runs."""

import sys

from fairseq_idpg.logs import quiet_setup_logs

quiet_setup_logs()

from fairseq_idpg.run import main  # noqa: E402

sys.exit(main())
