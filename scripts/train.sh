#!/usr/bin/env bash
# fairseq-train on N devices with the papers' effective batch (see fairseq_idpg/launch.py):
#   scripts/train.sh --nproc 4 --total-batch 32 -- data-bin/RTE --user-dir fairseq_idpg ...
#   scripts/train.sh --total-batch 32 --batch-size 8 -- ...      # a small GPU: update-freq 4 accumulates
exec "${PYTHON:-python3}" -m fairseq_idpg.launch "$@"
