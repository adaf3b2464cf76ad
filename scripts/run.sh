#!/usr/bin/env bash
# The main job: prepare TASK, train a method with its paper's recipe, print fairseq-validate's dev metrics.
#   scripts/run.sh SST-2                                  # the offline stand-in on data/glue/SST-2
#   scripts/run.sh RTE --method lora --model roberta.large --seed 2   # after scripts/download.sh roberta large
#   scripts/run.sh MNLI --method inducer-lora --model roberta.large --dry-run   # budget + command only
# One folder per configuration (checkpoints/<model>/<task>/<method>/lr<lr>.seed<seed>.<hash>): the same
# command again reports its result or resumes it; --restart retrains. See fairseq_idpg/run/, docs/training.md.
exec "${PYTHON:-python3}" -m fairseq_idpg.run "$@"
