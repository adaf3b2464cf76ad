#!/usr/bin/env bash
# Thin wrapper: bash scripts/download.sh {glue [--tasks ...],lmbff,glove,roberta {base,large},bpe,all} [--out DIR]
exec "${PYTHON:-python3}" "$(dirname "$0")/download.py" "$@"
