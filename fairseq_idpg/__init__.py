"""fairseq-idpg: a fairseq user dir (``--user-dir fairseq_idpg``).

Importing the package registers its BPEs, tasks, criterions, models and optimizer with fairseq.
The fixes fairseq 0.12.2 needs on Python 3.11 / torch >= 2.6 are applied at interpreter
start by ``fairseq_idpg_compat`` (see that module); importing it here too covers a process
that put the checkout on ``sys.path`` without installing the project.
"""

import fairseq_idpg_compat  # noqa: F401  (idempotent)

from . import criterions, encoders, models, optim, tasks  # noqa: F401,E402
