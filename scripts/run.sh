#!/usr/bin/env bash
# The main job: prepare TASK, fine-tune, print fairseq-validate's dev metrics.
#   scripts/run.sh SST-2                       # offline stand-in on ../shared/data
#   scripts/run.sh RTE --model roberta.large   # after scripts/download.sh roberta large
# See fairseq_idpg/run.py for the options.
exec "${PYTHON:-python3}" -m fairseq_idpg.run "$@"
