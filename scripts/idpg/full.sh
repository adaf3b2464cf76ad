#!/usr/bin/env bash
# IDPG full-data runs with the released hyperparameters (lr grid x 5 seeds); see protocols.py.
#   scripts/idpg/full.sh RTE --method m-idpg-phm --model roberta.large
exec "${PYTHON:-python3}" "$(dirname "$0")/protocols.py" full "$@"
