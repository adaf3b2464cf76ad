#!/usr/bin/env bash
# The device script: on a new GPU, run this first (docs/gpu.md). In at most 8 minutes, model builds included, it
# measures fused runs against lone runs, a lone update against PEFT and the Hugging Face Trainer, a fused group
# stopped and resumed, and mixed-task serving, at roberta.large's shape with random weights (nothing downloaded);
# writes docs/data/gpu_proof.json and regenerates docs/benchmarks.md's GPU tables from it.
#   scripts/gpu_proof.sh
#   scripts/gpu_proof.sh --out proof.json --doc none --budget fused=300
# Without CUDA it runs every part on the CPU at a tiny size and says so. See fairseq_idpg/gpu_proof/.
exec "${PYTHON:-python3}" -m fairseq_idpg.gpu_proof "$@"
