#!/usr/bin/env bash
# IDPG few-shot runs (section 4.4): K = 100, 500, 1000 x 5 seeds, 1,000-example dev; see protocols.py.
#   scripts/idpg/few_shot.sh SST-2 --method m-idpg-phm --model checkpoints/idpg-protocols/supplementary/<mnli-tuned folder>
exec "${PYTHON:-python3}" "$(dirname "$0")/protocols.py" few-shot "$@"
