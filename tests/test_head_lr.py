"""The classification head at its own lr (``--optimizer adam_head_lr --head-lr``, fairseq_idpg/optim.py;
``scripts/run.sh --head-lr``, the recipe's ``head_lr``).

In process, on the tiny 2-layer backbone with the ``dpt`` model: both lrs follow the schedule; with the
head lr equal to the lr, training is bit-identical to fairseq's Adam (clipping included); a first step
moves the head by the head lr and the prompt by the lr; resuming restores both lrs and the moments;
fp16's fp32 master copy keeps the two groups (and a flat one is refused, naming the flag). Through
fairseq-train (tiny SST-2): compact checkpoints hold both groups and resume. The run's configuration, the
sweep's grid and the results table carry the head lr; bad values are one line naming the flag.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from checkpoint_support import TOKENS, assert_compact_and_resumable, fairseq_adam, fairseq_train, train_steps
from conftest import REPO, build_tiny, tiny_sst2
from records_support import write_record

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.methods import METHODS
from fairseq_idpg.optim import HEAD, AdamHeadLr, mark_head
from fairseq_idpg.run_config import RunConfig

LR, HEAD_LR, WARMUP, TOTAL = 0.3, 5e-3, 2, 10  # fairseq_adam's polynomial decay: 2 warmup updates of 10


@pytest.fixture
def dpt(tiny):
    """A fresh dpt model (prompt A B + head) on the tiny backbone, the same each time."""
    torch.manual_seed(0)
    return build_tiny(tiny, METHODS["dpt"])


def head_and_rest(model):
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    head = {n for n in trained if n.startswith("classification_heads.")}
    assert head and set(trained) - head
    return trained, head


def polynomial(update):
    """fairseq's polynomial_decay factor (power 1, end 0) after ``update`` updates, written out."""
    return update / WARMUP if update <= WARMUP else 1 - (update - WARMUP) / (TOTAL - WARMUP)


def test_both_lrs_follow_the_schedule(dpt):
    model = dpt
    optimizer, scheduler = fairseq_adam(model, lr=LR, head_lr=HEAD_LR, total=TOTAL)
    trained, head = head_and_rest(model)
    groups = [{id(p) for p in g["params"]} for g in optimizer.param_groups]
    assert groups == [{id(p) for n, p in trained.items() if n not in head}, {id(trained[n]) for n in head}]
    assert all(getattr(trained[n], "param_group", None) == HEAD for n in head)
    for update in range(1, 8):
        train_steps(model, optimizer, scheduler, [update - 1])  # steps, then sets the lr of ``update``
        lrs = [g["lr"] for g in optimizer.param_groups]
        assert lrs == pytest.approx([LR * polynomial(update), HEAD_LR * polynomial(update)], rel=1e-12)
        assert optimizer.get_lr() == lrs[0]  # what fairseq logs as lr: the method's own


def test_head_lr_equal_to_lr_trains_bit_identically_to_adam(tiny):
    """Two groups at one lr are fairseq's Adam exactly, with the gradient clipped (its norm sums the tensors
    in the model's order)."""
    runs = []
    for head_lr in (None, 1e-2):
        torch.manual_seed(0)
        model = build_tiny(tiny, METHODS["dpt"])
        optimizer, scheduler = fairseq_adam(model, lr=1e-2, head_lr=head_lr)
        for update in range(3):
            torch.manual_seed(update)
            optimizer.zero_grad()
            optimizer.backward(F.cross_entropy(model(TOKENS, classification_head_name="head")[0], torch.tensor([0, 1])))
            assert optimizer.clip_grad_norm(1e-3) > 1e-3  # clipping happens
            optimizer.step()
            scheduler.step_update(update + 1)
        runs.append(dict(model.named_parameters()))
    assert all(torch.equal(runs[0][n], runs[1][n]) for n in runs[0])


def test_a_first_step_moves_the_head_by_the_head_lr_and_the_prompt_by_the_lr(dpt):
    """Adam's first step is lr g / (|g| + eps / sqrt(1 - beta2)) per coordinate (no weight decay here), with
    the warmup's first lr: half the peak."""
    model = dpt
    optimizer, _ = fairseq_adam(model, lr=LR, head_lr=HEAD_LR, weight_decay=0.0)
    trained, head = head_and_rest(model)
    before = {n: p.detach().clone() for n, p in trained.items()}
    optimizer.backward(F.cross_entropy(model(TOKENS, classification_head_name="head")[0], torch.tensor([0, 1])))
    grads = {n: p.grad.abs() for n, p in trained.items()}
    optimizer.step()
    for name, p in trained.items():
        lr = (HEAD_LR if name in head else LR) / WARMUP
        expected = lr * grads[name] / (grads[name] + 1e-6 / math.sqrt(1 - 0.98))
        assert expected.max() > lr / 2, name  # most of a step somewhere: the lr shows
        assert torch.allclose((p.detach() - before[name]).abs(), expected, rtol=1e-4, atol=1e-9), name


def test_resume_restores_both_lrs_and_the_moments(tiny, tmp_path):
    from checkpoint_support import resume_matches_uninterrupted

    def build(seed):
        torch.manual_seed(seed)
        return build_tiny(tiny, METHODS["dpt"])

    resume_matches_uninterrupted(build, tmp_path / "checkpoint.pt", lr=LR, head_lr=HEAD_LR)


def test_fp16_keeps_the_head_apart_and_a_flat_master_copy_is_refused(dpt):
    from fairseq import optim, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import open_dict

    argv = ["data", "--task", "sentence_prediction", "--num-classes", "2", "--arch", "roberta_base", "--cpu"]
    argv += ["--criterion", "sentence_prediction", "--optimizer", "adam_head_lr", "--lr", str(LR)]
    argv += ["--head-lr", str(HEAD_LR), "--fp16"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    model = mark_head(dpt.half())  # as the task marks it
    trained, head = head_and_rest(model)
    with pytest.raises(ConfigError, match="--head-lr: .*give --fp16-no-flatten-grads"):
        optim.FP16Optimizer.build_optimizer(cfg, list(trained.values()))
    with open_dict(cfg):
        cfg.common.fp16_no_flatten_grads = True
    optimizer = optim.FP16Optimizer.build_optimizer(cfg, list(trained.values()))
    assert isinstance(optimizer.fp32_optimizer, AdamHeadLr)
    optimizer.set_lr(LR / 2)  # what a scheduler does
    groups = optimizer.fp32_optimizer.param_groups
    assert [g["lr"] for g in groups] == pytest.approx([LR / 2, HEAD_LR / 2])
    assert [len(g["params"]) for g in groups] == [len(trained) - len(head), len(head)]
    assert all(p.dtype == torch.float32 for g in groups for p in g["params"])
    before = {n: p.detach().clone() for n, p in trained.items()}
    optimizer.backward(F.cross_entropy(model(TOKENS, classification_head_name="head")[0].float(), torch.tensor([0, 1])))
    optimizer.clip_grad_norm(0)
    optimizer.step()
    steps = {n: (p.detach().float() - before[n].float()).abs().max().item() for n, p in trained.items()}
    assert all(0 < steps[n] <= HEAD_LR * 1.01 for n in head), steps  # fp16 rounding of a 0.0025 step: within 1%
    assert max(steps[n] for n in trained if n not in head) > 10 * HEAD_LR


@pytest.mark.parametrize(
    "head_lr, marked, message",
    [
        (None, True, "--optimizer adam_head_lr needs --head-lr (the classification head's learning rate)"),
        (-1.0, True, "--head-lr must be > 0 (the classification head's learning rate), got -1.0"),
        (1e-3, False, "--head-lr: none of the 3 trained tensors is the classification head's"),
    ],
)
def test_bad_head_lrs_name_the_flag(head_lr, marked, message):
    import types

    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    if marked:
        params[-1].param_group = HEAD
    cfg = types.SimpleNamespace(lr=[1e-2], head_lr=head_lr, weight_decay=0.0, adam_betas="(0.9, 0.98)",
                                adam_eps=1e-6, tpu=False, fp16_adam_stats=False)  # fmt: skip
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AdamHeadLr(cfg, params)


def test_run_sh_refuses_a_bad_head_lr_in_one_line(capsys):
    from fairseq_idpg import run

    assert run.main(["RTE", "--method", "dpt", "--head-lr", "-1", "--dry-run"]) == 2
    assert capsys.readouterr().err == "run.sh: error: --head-lr must be > 0, got -1.0\n"


def test_fairseq_train_with_a_head_lr_writes_compact_checkpoints_that_resume(tiny, tmp_path):
    """dpt through fairseq-train (the task marks the head): checkpoint_last.pt's Adam state has the two
    groups at the scheduled lrs, it loads into the optimizer a resume builds, and the run resumes."""
    data, dims = tiny_sst2(tmp_path, tiny)
    save = tmp_path / "save"

    def train(updates):
        # fmt: off
        fairseq_train([
            str(data), "--user-dir", str(REPO / "fairseq_idpg"), "--task", "peft_sentence_prediction",
            *METHODS["dpt"].model_args(), *dims, "--backbone", str(tiny.model_file), "--num-classes", "2",
            "--criterion", "sentence_prediction", "--init-token", "0", "--separator-token", "2",
            "--optimizer", "adam_head_lr", "--lr", str(LR), "--head-lr", str(HEAD_LR),
            "--lr-scheduler", "polynomial_decay", "--total-num-update", str(TOTAL), "--warmup-updates", str(WARMUP),
            "--batch-size", "8", "--max-update", str(updates), "--cpu", "--save-dir", str(save),
            "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
        ])
        # fmt: on

    train(4)
    assert_compact_and_resumable(save, 4)
    saved = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)["last_optimizer_state"]
    assert [g["lr"] for g in saved["param_groups"]] == pytest.approx([LR * polynomial(4), HEAD_LR * polynomial(4)])
    train(6)  # resumes from checkpoint_last.pt
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 6
    lrs = [g["lr"] for g in state["last_optimizer_state"]["param_groups"]]
    assert lrs == pytest.approx([LR * polynomial(6), HEAD_LR * polynomial(6)])


# ---------------------------------------------------------------------------------------- run.sh, sweeps, tables
def test_the_dpt_paper_lr_record_plans_both_lrs_and_a_new_folder(shared_data, tmp_path):
    """The recipe's head lr reaches fairseq-train (with --fp16, beside --fp16-no-flatten-grads), config.json
    holds it (so the run has its own folder) and reads back as the same request; dpt's plan is unchanged."""
    from fairseq_idpg.run import plan, quiet

    def planned(argv):
        return plan(RunConfig.from_argv([*argv, "--work-dir", str(tmp_path), "--dry-run"]), log=quiet)

    paper = planned(["RTE", "--method", "dpt-paper-lr", "--fp16"])
    command = " ".join(paper.train)
    assert "--optimizer adam_head_lr --head-lr 0.005 --fp16-no-flatten-grads" in command and "--lr 0.3 " in command
    assert (paper.config["lr"], paper.config["head_lr"]) == (0.3, 5e-3)
    assert RunConfig.from_config(paper.config).head_lr == 5e-3
    flags = planned(["RTE", "--method", "dpt", "--lr", "0.3", "--head-lr", "1e-3"])
    assert flags.config["head_lr"] == 1e-3 and flags.folder.name.startswith("lr3e-1.seed1.")
    plain = planned(["RTE", "--method", "dpt"])
    assert "head_lr" not in plain.config and "--optimizer adam --adam-betas" in " ".join(plain.train)


def test_a_sweep_grids_over_head_lrs_or_keeps_one(tmp_path):
    from fairseq_idpg.sweep_spec import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: t\ntasks: [RTE]\nseeds: [1]\nmethods:\n"
        "  - {label: grid, method: dpt, lrs: [0.3], head_lrs: [5.0e-3, 1.0e-3]}\n"
        "  - {label: fixed, method: dpt, lrs: [0.3, 0.1], args: [--head-lr, 5.0e-3]}\n"
        "  - dpt-paper-lr\n"
    )
    runs = load_spec(spec).runs
    assert [(r.label, r.lr, r.head_lr) for r in runs] == [
        ("grid", 0.3, 5e-3), ("grid", 0.3, 1e-3), ("fixed", 0.3, 5e-3), ("fixed", 0.1, 5e-3),
        ("dpt-paper-lr", None, None),  # the recipe's 0.3 and 5e-3, as run.py plans them
    ]  # fmt: skip
    assert runs[0].name == "RTE.grid.lr3e-1.headlr5e-3.seed1" and len({r.name for r in runs}) == len(runs)


def test_the_table_selects_over_head_lrs_and_shows_the_chosen_one(tmp_path, capsys):
    from fairseq_idpg.results.__main__ import main

    for head_lr, devs in ((5e-3, (70.0, 72.0)), (1e-3, (60.0, 90.0))):  # means 71 and 75
        for seed, dev in enumerate(devs, 1):
            write_record(tmp_path, task="RTE", method="dpt", lr=0.3, head_lr=head_lr, seed=seed, dev=dev)
    write_record(tmp_path, task="RTE", method="prompt-tuning-5", lr=5e-3, seed=1, dev=65.0)
    assert main([str(tmp_path)]) == 0  # Markdown on stdout
    text = capsys.readouterr().out
    assert "| dpt | 0.3, head 0.001 (n 2) |" in text and "| prompt-tuning-5 | 0.005 (n 1) |" in text
    assert "| dpt | 75.0 ± 21.2 |" in text
    capsys.readouterr()
    assert main([str(tmp_path), "--select", "best-per-seed"]) == 0  # seed 1: 5e-3 (70 > 60), seed 2: 1e-3
    assert "| dpt | 0.3, head 0.005 x1; 0.3, head 0.001 x1 (n 2) |" in capsys.readouterr().out
