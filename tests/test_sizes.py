"""roberta.base's size, for real: one method of each family on a randomly initialised 12 x 768 backbone (12
heads, ffn 3072) with RoBERTa's real 50,265-entry dictionary goes through what ``scripts/run.sh`` runs: the
data prepared with the GPT-2 BPE, fairseq-train's own ``main`` on the command run.sh composes (1 update),
the checkpoint reloaded as fairseq-validate loads it and validated, then exported compact.

Checked per method: the trained parameters are the count ``fairseq_idpg.models.build`` gives at roberta-base
(fairseq_idpg/counts), every frozen tensor is bit-identical to the backbone file's, the reloaded model's dev
loss is the one fairseq-train logged, and the compact checkpoint holds the trained tensors only.
scripts/benchmark_sizes.py times every method at roberta.base and roberta.large (docs/benchmarks.md).

Slow: the random roberta.base folder (500 MB) is written once for the module and the 8 trainings share one
interpreter (2 SST-2 train rows, one update of batch 2 that ends the epoch, 2 dev rows: what is checked is
sizes, counts, bit-identity and the reload, not learning, so each training is one forward and backward step).
"""

import math
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_support import FINGERPRINT_KEY, fairseq_train, load_trained

from fairseq_idpg.methods import FAMILIES, METHODS

pytestmark = pytest.mark.slow

# one method of each family (fairseq_idpg.methods.FAMILIES; the factored ones where a family has them: DPT,
# Compacter) and EFL for its own task: the ones trained here. The test below keeps them covering the records.
TRAINED = ("dpt", "m-idpg-phm", "inducer", "compacter", "lora", "bitfit", "finetune", "efl")
BASE = dict(layers=12, dim=768, heads=12, ffn=3072)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread, as the benchmarks measure: on a loaded machine, idle threads spin on CPU time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory, shared_data, roberta_bpe):
    """(work dir, roberta.base folder, raw SST-2 slice, backbone state): written once."""
    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    work = tmp_path_factory.mktemp("sizes")
    folder = Path(write_tiny_roberta(work / "roberta.base", **BASE, bpe_dir=roberta_bpe))
    raw = work / "raw" / "SST-2"
    raw.mkdir(parents=True)
    for name, rows in (("train.tsv", 2), ("dev.tsv", 2)):
        lines = (shared_data / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    state = torch.load(f"{folder}/model.pt", map_location="cpu", weights_only=False)["model"]
    return work, folder, raw, state


def run_plan(work, folder, raw, name):
    """run.py's plan of ``scripts/run.sh SST-2 --method NAME --model FOLDER`` at 1 update of batch 2."""
    from fairseq_idpg.run import plan, quiet
    from fairseq_idpg.run_config import RunConfig

    argv = ["SST-2", "--method", name, "--model", str(folder), "--raw", str(raw), "--work-dir", str(work)]
    return plan(RunConfig.from_argv(argv + ["--max-update", "1", "--total-batch", "2"]), log=quiet)


def valid_loss(model, task, criterion):
    """The dev loss as fairseq-validate computes it (base 2, over the dev set's one batch)."""
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        loss, sample_size, _ = task.valid_step(batch, model, criterion)
    return loss.item() / sample_size / math.log(2)


def test_every_family_has_its_representative():
    assert all(METHODS[name] for name in TRAINED)
    assert {METHODS[n].family for n in TRAINED} == set(FAMILIES)
    assert {METHODS[n].arch for n in TRAINED} == {m.arch for m in METHODS.values()}
    assert {METHODS[n].task for n in TRAINED} == {m.task for m in METHODS.values()}


@pytest.mark.parametrize("name", TRAINED)
def test_roberta_base_trains_saves_reloads_validates_and_exports(base, name):
    from fairseq_idpg.models.build import ROBERTA_BASE, build_method, count_trainable
    from fairseq_idpg.models.frozen_roberta import export_checkpoint

    work, folder, raw, backbone = base
    method = METHODS[name]
    p = run_plan(work, folder, raw, name)
    args = p.train[p.train.index("--") + 1 :]
    # select on the dev loss (3 logged decimals), which the reload must give again, not the accuracy of 2 rows
    args[args.index("--best-checkpoint-metric") + 1] = "loss"
    args.remove("--maximize-best-checkpoint-metric")
    # checkpoint_best.pt only, without Adam's moments: fine-tuning's would be 1.5 GB written twice
    fairseq_train(args + ["--batch-size", "2", "--update-freq", "1", "--cpu", "--no-last-checkpoints"]
                  + ["--no-save-optimizer-state"])  # fmt: skip

    best = p.folder / "checkpoint_best.pt"
    saved = torch.load(best, map_location="cpu", weights_only=False)
    assert saved["optimizer_history"][-1]["num_updates"] == 1
    overrides = {"backbone": str(folder / "model.pt")} if method.frozen_backbone else {}
    model, cfg, task = load_trained(best, **overrides)
    assert cfg.model.encoder_layers == 12 and cfg.model.encoder_embed_dim == 768 and len(task.dictionary) == 50265

    # the trained parameters: the counts' roberta-base model of the record (classification heads apart)
    trained = {n: t for n, t in model.named_parameters() if t.requires_grad}
    body = sum(t.numel() for n, t in trained.items() if ".classification_heads." not in f".{n}")
    meta = build_method(method, task.source_dictionary, meta=True, **ROBERTA_BASE)
    counted = getattr(meta, "num_trainable_parameters", lambda: sum(t.numel() for t in meta.parameters()))()
    assert body == counted
    if method.frozen_backbone:  # the vocabulary changes no trained count (fairseq_idpg/counts)
        assert body == count_trainable(method, ROBERTA_BASE)
        now = {**dict(model.named_parameters()), **dict(model.named_buffers())}  # state_dict() holds trained only
        frozen = [n for n in model.backbone_names if n not in trained and n in backbone and n in now]
        # at least every projection and FFN weight of the 12 layers (BitFit trains the biases)
        assert {f"encoder.sentence_encoder.layers.{i}.fc1.weight" for i in range(12)} <= set(frozen)
        assert all(torch.equal(now[n], backbone[n]) for n in frozen), "a frozen tensor changed"
    else:
        assert body == sum(t.numel() for n, t in model.named_parameters() if ".classification_heads." not in f".{n}")
        moved = model.state_dict()["encoder.sentence_encoder.layers.0.fc1.weight"]
        assert not torch.equal(moved, backbone["encoder.sentence_encoder.layers.0.fc1.weight"])

    # the reloaded model validates to the loss fairseq-train logged (and selected checkpoint_best by)
    logged = saved["extra_state"]["val_loss"]
    assert valid_loss(model, task, task.build_criterion(cfg.criterion)) == pytest.approx(logged, abs=5e-4)

    # the compact checkpoint: the trained tensors (and the method's buffers), nothing of the frozen backbone
    compact = p.folder / "compact.pt"
    values = export_checkpoint(str(best), str(compact))
    state = torch.load(compact, map_location="cpu", weights_only=False)
    assert state["last_optimizer_state"] is None
    if method.frozen_backbone:
        buffers = {n for n, _ in model.named_buffers() if n not in model.backbone_names}
        assert set(state["model"]) == set(trained) | buffers | {FINGERPRINT_KEY}
        assert values == sum(t.numel() for t in trained.values()) + sum(state["model"][b].numel() for b in buffers)
        assert compact.stat().st_size < 20 * 2**20
    else:
        assert set(state["model"]) == set(model.state_dict())
    print(f"{name}: {body:,} trained at roberta-base, compact {compact.stat().st_size / 2**20:.1f} MB", file=sys.stderr)


def test_meta_builds_draw_nothing_and_never_import_the_compiler():
    """Every record built at roberta.large size on the meta device (counts, run.sh's check before training) in a
    fresh interpreter: no random fill runs (a meta tensor has no values), so torch._dynamo, which torch's meta
    fills import on their first call (4-7 s of CPU in each such process), is never imported."""
    import subprocess

    code = (
        "import sys\n"
        "from fairseq_idpg.errors import ConfigError\n"
        "from fairseq_idpg.methods import METHODS\n"
        "from fairseq_idpg.models.build import ROBERTA_LARGE, build_method\n"
        "from fairseq.data import Dictionary\n"
        "built = 0\n"
        "for name, method in METHODS.items():\n"
        "    try:\n"
        "        build_method(method, Dictionary(), meta=True, **ROBERTA_LARGE); built += 1\n"
        "    except ConfigError:\n"
        "        pass  # a record that needs files (GloVe vectors)\n"
        "print(built, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    built, imported = out.stdout.split()[-2:]
    assert int(built) >= len(METHODS) - 2 and imported == "False", out.stdout[-500:]
