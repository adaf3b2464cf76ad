#!/usr/bin/env bash
# A paper's table in one command: every run of a sweep specification (examples/*/*.yaml), in parallel.
#   scripts/sweep.sh examples/idpg/table1.yaml --model roberta.large --dry-run   # the plan, its run count and hours
#   scripts/sweep.sh SPEC --dry-run --timings checkpoints/gpu_check.json        # hours from scripts/check_gpu.sh's file
#   scripts/sweep.sh examples/idpg/smoke.yaml --jobs 2                          # the stand-in, 2 CPU runs at a time
#   scripts/sweep.sh examples/idpg/table1.yaml --model roberta.large --runs-per-gpu 2
#   scripts/sweep.sh SPEC --executor slurm --partition P --gpus-per-run 1 --time 240 --mem 32
# Finished runs are skipped, interrupted ones resume. See fairseq_idpg/sweep.py, docs/sweeps.md.
exec "${PYTHON:-python3}" -m fairseq_idpg.sweep "$@"
