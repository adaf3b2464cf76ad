"""The device script: on a new GPU, one run of at most 8 minutes that takes the project's GPU figures and writes them
into one JSON file and docs/benchmarks.md's GPU tables (``scripts/gpu_proof.sh``, docs/gpu.md).

    scripts/gpu_proof.sh                        # on the GPU: docs/data/gpu_proof.json + docs/benchmarks.md
    scripts/gpu_proof.sh --out proof.json --doc none --budget fused=300
    scripts/gpu_proof.sh --render docs/data/gpu_proof.json     # the tables again from a file, nothing measured

Its parts, in order of value, each stopped at its own time budget (``--budget PART=SECONDS``; a part whose
budget runs out keeps what it measured and says ``cut``):

1. ``fused``: K runs trained together (``fused.train``) against lone fairseq-train runs, whole runs, at
   roberta.large's shape (random weights, RoBERTa's dictionary size), bf16, batch 16 x 128, one method per family:
   steady updates per second both ways (fewer lone runs timed and scaled to K, said so), the group's start, the
   peak device memory at K = 4 and K = 20;
2. ``updates``: one lone fairseq-train update against PEFT's plain step and the Hugging Face Trainer's update on
   the same backbone and batch, bf16 and fp16, each with its achieved TFLOP/s (the step's FLOPs counted by
   torch's ``FlopCounterMode``, over its time);
3. ``resume``: a fused group stopped after some updates and resumed from its checkpoints ends with the trained
   tensors of the same group run through, dropout on (each member's masks from the device's generator);
4. ``serving``: 16 tasks answered in one mixed batch (``hub.MultiTaskModel``) against their own models one after
   another (fewer models timed and scaled, said so).

Without CUDA the same code runs on the CPU at a tiny size (CI: tests/test_gpu_proof.py); the JSON says which
device measured each part. Nothing is downloaded: the backbone is random and its vocabulary synthetic
(``backbone.py``). The JSON is rewritten (atomically) after every measurement, so a run stopped at any point, by
its overall limit or a signal, leaves what it measured.
"""

from fairseq_idpg.run_config import REPO

DEFAULT_OUT = REPO / "docs" / "data" / "gpu_proof.json"  # what the GPU run writes and the docs' tables read
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"
CPU_OUT = REPO / "checkpoints" / "gpu_proof.cpu.json"  # the CPU mode's default: never the committed GPU figures
PARTS = ("fused", "updates", "resume", "serving")  # in order of value
