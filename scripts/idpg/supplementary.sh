#!/usr/bin/env bash
# IDPG supplementary training (appendix A.4): MNLI (--double: doubled by swapping), then TASK; see protocols.py.
#   scripts/idpg/supplementary.sh MRPC --method s-idpg-phm --double --model roberta.large
exec "${PYTHON:-python3}" "$(dirname "$0")/protocols.py" supplementary "$@"
