"""A first-run check of a researcher's GPUs, before a sweep: ``scripts/check_gpu.sh`` (docs/gpu.md).

    scripts/check_gpu.sh --model roberta.large           # on the GPU machine; writes DEFAULT_OUT
    scripts/check_gpu.sh --out gpu.json --families lora,idpg --precisions bf16
    scripts/sweep.sh SPEC --timings checkpoints/gpu_check.json --dry-run   # the sweep reads its timings

What it runs (``cli.py``), each line of its table a check that passes, fails or is skipped:

1. per family of ``fairseq_idpg.methods`` (``training.FAMILIES``: one record each), fp16 and bf16
   fairseq-train runs of a few updates, with run.sh's command line, on synthetic data of the model's
   dictionary: the loss finite and sane, the fp16 loss scale sane, the updates made;
2. with 2 or more GPUs visible, 1 GPU (update-freq 2) against 2 (NCCL, torchrun): the trained tensors
   equal within ``DISTRIBUTED_RTOL`` / ``DISTRIBUTED_ATOL``; without CUDA the same with 2 CPU
   processes over gloo;
3. on a GPU (``--cpu-timings``: on the CPU too, at the tiny size), seconds per step of LoRA, prompt
   tuning and prefix tuning against Hugging Face PEFT, and of M-IDPG-PHM against prompt tuning, printed
   as ratios (``timing.py``; informational: the project's goals are printed, not enforced).

Without CUDA the runs use ``--cpu`` (compat fix 11 gives fp16 / bf16 there) on a tiny random backbone
(or ``--model``, if given), and the output says so: it checks the code path, not a device. The JSON
file (``report.py``) holds the device, versions, every check and the seconds per update; the exit
status is 1 when a check that ran failed, else 0 (skips included).
"""

from fairseq_idpg.run_config import REPO

DEFAULT_OUT = REPO / "checkpoints" / "gpu_check.json"  # what a sweep's --timings reads by default
DISTRIBUTED_RTOL, DISTRIBUTED_ATOL = 1e-4, 1e-6  # fp32: only the order of the gradient sums may differ
