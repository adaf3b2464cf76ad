#!/usr/bin/env bash
# A first-run check of this machine's GPUs before a sweep (docs/gpu.md): per method family, fp16 and bf16
# fairseq-train runs; 1 GPU against 2; seconds per step against Hugging Face PEFT. Writes a JSON file
# that a sweep reads (default checkpoints/gpu_check.json); exit status 1 when a check fails.
#   scripts/check_gpu.sh --model roberta.large
#   scripts/check_gpu.sh --out gpu.json --families lora,idpg --precisions bf16
# Without CUDA it runs on the CPU at a tiny size and says what it skipped. See fairseq_idpg/check_gpu/.
exec "${PYTHON:-python3}" -m fairseq_idpg.check_gpu "$@"
