"""The main job: prepare a task, train a method on it with fairseq-train, score it with
fairseq-validate. ``scripts/run.sh`` is a thin wrapper.

    scripts/run.sh SST-2                          # the offline stand-in, data/glue/SST-2
    scripts/run.sh RTE --model roberta.large      # models/roberta.large (scripts/download.sh roberta large)
    scripts/run.sh RTE --method NAME --seed 2     # any method of fairseq_idpg/methods.py
    scripts/run.sh MNLI --method inducer-lora --model roberta.large --dry-run   # the command and budget

One run = one configuration. Its folder is
``checkpoints/<model>/<task>/<method>/lr<lr>.seed<seed>.<hash>``, the hash covering everything that
defines the run (the model file and its sha256, the prepared data's provenance, the task, the method
record, lr, seed, effective batch, updates, scheduler, warmup, clipping, weight decay, selection
split, and the extra fairseq-train flags); ``config.json`` beside the checkpoints holds all of it.
The same command again reports the finished result without training (``results.json`` exists), or
resumes an interrupted run from its ``checkpoint_last.pt``; ``--restart`` removes that one folder
and trains again. The per-device batch, gradient accumulation and number of devices are not part
of the hash: they keep the effective batch (``fairseq_idpg/launch.py``).

Every stage is the ordinary command a researcher would type (printed with ``+``):
``scripts/prepare_data.py`` -> ``fairseq-train`` (through ``fairseq_idpg.launch`` for N devices;
its output reaches the terminal as it comes, with an estimate of the time left, and ``train.log``)
-> ``fairseq-validate`` on ``checkpoint_best.pt`` (``validate.log``) -> ``results.json`` (the
scores as numbers, the seed, the configuration, the git commit, the timings, the command). The
first and the last run in this process (their entry points: ``processes.call_here`` and ``tee_here``),
an interpreter start fewer each.
Prepared data is reused while its provenance (``task.json``: raw files' and BPE files' sha256,
sampling) matches what would be prepared now, and prepared again otherwise, saying why.

Where the files come from:
- raw data: ``--raw DIR``, else ``$GLUE_DIR/<TASK>`` (GLUE) or ``$LMBFF_DIR/<task>`` (MR, CR,
  MPQA, SUBJ), else the checkout's ``data/{glue,lmbff}/...`` (where ``scripts/download.sh`` puts it;
  downloaded there when missing; offline, the stand-in job trains on a made-up sample, said as such:
  ``layout.raw_places``, ``prepared.fetch_raw``);
- model: ``standin`` (default): all-MiniLM-L6-v2 converted to fairseq RoBERTa format, the
  project's offline stand-in for roberta.large (``scripts/build_standin.sh``; it is a 6-layer
  BERT, not RoBERTa); ``roberta.base`` / ``roberta.large``: ``models/<name>/model.pt`` as
  unpacked by ``scripts/download.sh roberta {base,large}``; or any folder with model.pt + dict.txt.

Hyperparameters: the method's recipe (``Method.recipe.for_task(task)`` in
``fairseq_idpg/methods.py``: lr, effective batch, epochs or updates, scheduler and warmup,
clipping, weight decay, the dev split that selects checkpoint_best), with Adam (0.9, 0.98), eps
1e-6, the recipe's encoder dropout (0.1; 0 for the l = 100 prompts). With roberta.* or a model
folder the updates are the recipe's epochs over the prepared train set; the stand-in keeps a smoke
budget (300 updates; full fine-tuning at lr 5e-5).
Explicit flags (``--lr``, ``--max-update``, ``--total-batch``, ...) win and are checked first.

A pipeline, one module a step: the request is a ``RunConfig`` (``fairseq_idpg/run_config.py``: run.sh's
flags as typed fields; ``cli.py`` reads it); ``planning.check()`` refuses it in one line before anything is
prepared or written (every missing file, and the fairseq-train command it makes, parsed by fairseq and its
model built on the meta device) and returns its dry plan, which the run uses as it is when nothing is left to
build, fetch or prepare (``planning.planned``: one plan per request); ``planning.plan()`` resolves it into the
configuration (``identity.py`` names its folder), budget (``budget.py``) and commands (``command.py``), given its
backbone (``backbone.py``) and prepared data (``prepared.py``); ``execution.execute()`` trains and scores (the
commands' output: ``processes.py``) and ``record.py`` writes results.json. ``layout.py`` holds where
things are by default. This module is the public API other parts call (a sweep, check_gpu, interop, the
examples); the names below are all they use.

"""

from fairseq_idpg.errors import RunError
from fairseq_idpg.layout import REPO, bpe_args, model_dir, model_name, raw_dir, standin_lock
from fairseq_idpg.run.backbone import Backbone, backbone_at, find_backbone, model_dims
from fairseq_idpg.run.cli import main, parse_args, work_dir_refusal
from fairseq_idpg.run.execution import IN_USE_EXIT, execute
from fairseq_idpg.run.identity import config_hash, format_lr, model_settings, portable_hash, run_name
from fairseq_idpg.run.planning import Plan, check, hash_note, plan, quiet, warn_missing
from fairseq_idpg.run.prepared import Data, prepared
from fairseq_idpg.run.processes import child_process_options, format_duration
from fairseq_idpg.run.record import DamagedRecord, find_runs, read_run_file, read_run_folder

__all__ = [
    "RunError", "main", "parse_args", "work_dir_refusal", "check", "plan", "Plan", "quiet", "warn_missing", "hash_note",
    "execute", "IN_USE_EXIT",
    "Backbone", "backbone_at", "find_backbone", "model_dims", "Data", "prepared",
    "config_hash", "portable_hash", "format_lr", "run_name", "model_settings", "find_runs", "format_duration",
    "read_run_folder", "read_run_file", "DamagedRecord", "child_process_options",
    "REPO", "raw_dir", "model_dir", "model_name", "bpe_args", "standin_lock",
]  # fmt: skip
