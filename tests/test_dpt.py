"""Static soft prompts on a frozen RoBERTa (``--arch roberta_prompt``): prompt tuning, P-tuning v2,
DPT (DPT Eq. 3 and 5), residual prompts: the prompt parameterisations, the model, its build-time
checks, the rank probe's logging, the export of P and the counts. The tiny random backbone
(2 layers x 32, conftest); training on real data is in test_dpt_train.py."""

import argparse
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import build_tiny
from fairseq.logging import metrics

from fairseq_idpg.data.task_info import TaskInfo
from fairseq_idpg.methods import METHODS, Method
from fairseq_idpg.models.roberta_prompt import RANK_LOG_KEY, presets
from fairseq_idpg.modules.prompts.soft_prompts import (
    PROMPT_MATRICES,
    FullPrompt,
    LowRankPrompt,
    PromptMatrix,
    RankProbePrompt,
    ResidualPrompt,
    init_prompt_,
)

REPO = Path(__file__).resolve().parents[1]
DIM, LAYERS = 32, 2
ARCH = "roberta_prompt"
PRESETS = presets()  # every --prompt-preset: the roberta_prompt method records, then the export's
FACTORED = [name for name, p in PRESETS.items() if p["prompt_matrix"] != "full"]  # what the export turns into P


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)  # the prompts' and the head's random values


def tokens():
    """A right-padded batch: <s> w w w </s> and a shorter row."""
    return torch.tensor([[0, 2023, 3185, 2001, 2], [0, 7592, 2, 1, 1]])


def logits(model, src=None):
    with torch.no_grad():
        return model(tokens() if src is None else src, classification_head_name="head")[0]


# ---------------------------------------------------------------------- the parameterisations
def test_low_rank_prompt_is_the_product_of_its_factors():
    torch.manual_seed(0)
    prompt = LowRankPrompt(100, 64, 10).double()
    A, B = prompt.A, prompt.B
    # Eq. 5 term by term: P = sum_k A[:, k] B[k, :]
    by_definition = sum(torch.outer(A[:, k], B[k]) for k in range(10))
    P = prompt()
    assert P.shape == (100, 64)
    assert torch.allclose(P, by_definition, atol=1e-12)
    assert torch.linalg.matrix_rank(P).item() == 10  # low rank: b, not min(l, d) = 64

    stacked = LowRankPrompt(7, 16, 3, stack=4)
    assert stacked().shape == (4, 7, 16)
    for k in range(4):
        assert torch.allclose(stacked()[k], stacked.A[k] @ stacked.B[k], atol=1e-6)


def test_prompt_init_uniform_by_default_gaussian_as_option():
    torch.manual_seed(0)
    x = init_prompt_(torch.empty(200, 500))
    assert x.abs().max().item() <= 0.5 and x.abs().max().item() > 0.49  # U(-0.5, 0.5), authors' code
    assert abs(x.std().item() - 0.5 / math.sqrt(3)) < 0.005
    y = init_prompt_(torch.empty(200, 500), "normal", 0.1)
    assert abs(y.std().item() - 0.1) < 0.002 and y.abs().max().item() > 0.3  # unbounded tails
    with pytest.raises(ValueError, match="prompt init must be one of uniform, normal, vocab, zero, got 'xavier'"):
        init_prompt_(torch.empty(2), "xavier")


def test_rank_probe_is_U_relu_diag_s_V_and_counts_positive_entries():
    torch.manual_seed(0)
    probe = RankProbePrompt(8, 12, 6).double()
    assert torch.equal(probe.s, torch.full((6,), 0.02).double())  # s starts positive (fp32 0.02)
    assert probe.num_positive() == 6
    with torch.no_grad():
        probe.s.copy_(torch.tensor([1.5, -0.2, 0.0, 0.7, -3.0, 2.0]))  # hand-made: 3 positive
    expected = probe.U @ torch.diag(F.relu(probe.s)) @ probe.V  # Eq. 3 with the diagonal matrix
    assert torch.allclose(probe(), expected, atol=1e-12)
    assert probe.num_positive() == 3
    assert torch.linalg.matrix_rank(probe()).item() == 3  # the count bounds the rank (appendix A.1)
    with pytest.raises(ValueError, match="s must start positive"):
        RankProbePrompt(8, 12, 6, s_init=0.0)


def test_residual_prompt_formula_and_paper_count():
    torch.manual_seed(0)
    res = ResidualPrompt(5, 16, bottleneck=8).double()
    with torch.no_grad():
        res.norm.weight.normal_(), res.norm.bias.normal_()  # not the identity init
    P = res.weight
    h = F.relu(P @ res.down.weight.T + res.down.bias) @ res.up.weight.T + res.up.bias
    mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    expected = P + (h - mean) / torch.sqrt(var + 1e-5) * res.norm.weight + res.norm.bias
    assert torch.allclose(res(), expected, atol=1e-10)
    # DPT Table 1: residual PT with l = 100, m = 400 on d = 1024: "925K"
    big = ResidualPrompt(100, 1024, bottleneck=400)
    assert sum(p.numel() for p in big.parameters()) == 100 * 1024 + 2 * 1024 * 400 + 400 + 3 * 1024 == 925_072


# ---------------------------------------------------------------------- the model
FORMULAS = {  # trainable count without the head (l, b, r, m, d, L): DPT section 3.1, IDPG appendix A.1.2
    "dpt": lambda l, b, r, m, d, L: l * b + b * d,
    "dpt-rank-probe": lambda l, b, r, m, d, L: l * r + r + r * d,
    "residual-prompt": lambda l, b, r, m, d, L: l * d + 2 * d * m + m + 3 * d,
    "deep-dpt": lambda l, b, r, m, d, L: L * (l * b + b * d),
    "prompt-tuning-100": lambda l, b, r, m, d, L: l * d,
    "deep-prompt-tuning-100": lambda l, b, r, m, d, L: L * l * d,
    "prompt-tuning-5": lambda l, b, r, m, d, L: l * d,
    "prompt-tuning-134": lambda l, b, r, m, d, L: l * d,
    "p-tuning-v2-5": lambda l, b, r, m, d, L: L * l * d,
}


def test_every_preset_has_a_formula_and_its_length_in_its_name():
    assert set(FORMULAS) == set(PRESETS), "every roberta_prompt method (fairseq_idpg/methods.py) has a formula here"
    assert all(name.endswith(str(p["prompt_length"])) for name, p in PRESETS.items() if "tuning" in name)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_only_prompt_and_head_train_and_counts_follow_the_formula(tiny, preset):
    l, b, m = 6, 2, 8
    options = dict(prompt_length=l, dpt_bottleneck=b, residual_prompt_bottleneck=m)
    model = build_tiny(tiny, ARCH, prompt_preset=preset, **options).eval()
    assert preset in FORMULAS, f"{preset}: add its count formula to FORMULAS"
    assert model.num_trainable_parameters() == FORMULAS[preset](l, b, min(l, DIM), m, DIM, LAYERS)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("prompt.", "classification_heads.head.")) for n in trainable)
    assert model.num_inserted_tokens == l
    model.train()
    model(tokens(), classification_head_name="head")[0].sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n in model.backbone_names)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.prompt.named_parameters())


def test_prompt_at_position_0_equals_stock_encoder_on_prompted_embeddings(tiny):
    """DPT on RoBERTa = fairseq's own encoder fed <s>, P = A B, then the input (ordinary positions)."""
    model = build_tiny(tiny, ARCH, prompt_preset="dpt", prompt_length=6, dpt_bottleneck=2).eval()
    src = tokens()
    enc = model.encoder.sentence_encoder
    P = (model.prompt.A @ model.prompt.B).unsqueeze(0).expand(2, -1, -1)
    filler = torch.full((2, 6), enc.dictionary.unk())
    ref_tokens = torch.cat([src[:, :1], filler, src[:, 1:]], dim=1)  # right padding stays at the end
    ref_embeddings = torch.cat([enc.embed_tokens(src[:, :1]), P, enc.embed_tokens(src[:, 1:])], dim=1)
    with torch.no_grad():
        out = enc(ref_tokens, token_embeddings=ref_embeddings)["encoder_out"][0].transpose(0, 1)
        expected = model.classification_heads["head"](out)
    assert torch.allclose(logits(model, src), expected, atol=1e-5)


def test_deep_prompts_are_added_after_each_layer(tiny):
    """With P_1..P_{L-1} = 0 the deep model is the shallow one; with them it differs."""
    deep = build_tiny(tiny, ARCH, prompt_preset="deep-prompt-tuning-100", prompt_length=6).eval()
    shallow = build_tiny(tiny, ARCH, prompt_preset="prompt-tuning-100", prompt_length=6).eval()
    shallow.classification_heads.load_state_dict(deep.classification_heads.state_dict())
    with torch.no_grad():
        shallow.prompt.weight.copy_(deep.prompt.weight[0])
        assert not torch.allclose(logits(deep), logits(shallow), atol=1e-4)
        deep.prompt.weight[1:].zero_()
    assert torch.allclose(logits(deep), logits(shallow), atol=1e-6)


def test_rank_probe_count_is_logged_in_eval_only(tiny):
    model = build_tiny(tiny, ARCH, prompt_preset="dpt-rank-probe", prompt_length=6).eval()
    with torch.no_grad():
        model.prompt.s.copy_(torch.tensor([0.4, -0.1, 2.0, -0.3, 0.0, 1.0]))  # hand-made: 3 positive
    with metrics.aggregate(new_root=True) as agg:  # what fairseq-train's validation opens
        logits(model), logits(model)
    assert agg.get_smoothed_values()[RANK_LOG_KEY] == 3
    model.train()
    with metrics.aggregate(new_root=True) as agg:
        model(tokens(), classification_head_name="head")
    assert RANK_LOG_KEY not in agg.get_smoothed_values()


SINGLE_SENTENCES = TaskInfo(task="SST-2", num_classes=2, regression=False, pair=False, metric="accuracy", splits={})


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            {"prompt_length": 6, "dpt_bottleneck": 6},
            r"--dpt-bottleneck 6 must be in \[1, 5\]: a low-rank prompt needs b < "
            r"min\(--prompt-length 6, encoder dim 32\)",
        ),
        ({"prompt_length": 40, "dpt_bottleneck": 32}, r"--dpt-bottleneck 32 must be in \[1, 31\]"),
        (
            {"prompt_preset": "deep-dpt", "prompt_length": 6, "dpt_bottleneck": 0},
            r"--dpt-bottleneck 0 must be in \[1, 5\]",
        ),
        (
            {"prompt_length": 509, "max_positions": 512},
            r"--prompt-length 509: the prompt plus the shortest input .* must fit --max-positions 512: use 1 to 508",
        ),
        (
            {"prompt_preset": "dpt-rank-probe", "prompt_length": 6, "dpt_probe_rank": 7},
            r"--dpt-probe-rank 7 must be in \[1, 6\]",
        ),
        ({"prompt_preset": "dpt-rank-probe", "dpt_probe_s_init": -1.0}, r"--dpt-probe-s-init must be > 0"),
        (
            {"prompt_preset": "residual-prompt", "prompt_deep": True},
            r"--prompt-deep needs --prompt-matrix full or low-rank, got residual",
        ),
        (
            {"prompt_preset": "residual-prompt", "residual_prompt_bottleneck": 0},
            r"--residual-prompt-bottleneck must be >= 1",
        ),
        ({"prompt_position": 5}, r"--prompt-position must be one of 0-4, got 5"),
        ({"prompt_init": "xavier"}, r"--prompt-init must be one of uniform, normal, vocab, zero, got 'xavier'"),
        pytest.param(
            {"prompt_matrix": "sparse"},
            rf"--prompt-matrix must be one of {', '.join(PROMPT_MATRICES)}, got 'sparse'",  # the built-ins first
            id="unknown-matrix",
        ),
        (
            {"prompt_preset": "p-tuning"},
            r"--prompt-preset must be one of prompt-tuning-5, .*, dpt, dpt-rank-probe, .*, got 'p-tuning'",
        ),
    ],
)
def test_bad_settings_fail_at_build_time(tiny, flags, message):
    with pytest.raises(ValueError, match=message):
        build_tiny(tiny, ARCH, **flags)


def test_the_built_in_matrices_come_first():
    assert list(PROMPT_MATRICES)[:4] == ["full", "low-rank", "rank-probe", "residual"]
    assert [name for name, matrix in PROMPT_MATRICES.items() if matrix.deep][:2] == ["full", "low-rank"]


def test_a_matrix_registered_after_import_is_a_choice_of_the_parser_and_the_build(tiny, tmp_path, monkeypatch):
    """docs/architecture.md's worked example: the registry is read when used, not copied at import."""
    twice = PromptMatrix(lambda a, dim, stack: FullPrompt(2 * a.prompt_length, dim, stack=stack), deep=True)
    monkeypatch.setitem(PROMPT_MATRICES, "twice", twice)
    args = parse_train_args(tmp_path, "--arch", "roberta_prompt", "--prompt-matrix", "twice", "--prompt-deep")
    assert (args.prompt_matrix, args.prompt_deep) == ("twice", True)
    model = build_tiny(tiny, ARCH, prompt_matrix="twice", prompt_length=3, prompt_deep=True)
    assert model.prompt().shape == (LAYERS, 6, DIM)


def test_a_record_registered_after_import_is_a_preset_of_the_parser_and_the_build(tiny, tmp_path, monkeypatch):
    """A method has one name: its record's ``preset`` is what ``--prompt-preset NAME`` sets."""
    preset = dict(prompt_matrix="low-rank", prompt_length=8, prompt_deep=False)
    record = Method("dpt-8", arch=ARCH, options={"prompt_preset": "dpt-8"}, preset=preset)
    monkeypatch.setitem(METHODS, record.name, record)
    args = parse_train_args(tmp_path, "--arch", ARCH, "--prompt-preset", "dpt-8")
    assert (args.prompt_matrix, args.prompt_length, args.prompt_deep) == ("low-rank", 8, False)
    assert build_tiny(tiny, record, dpt_bottleneck=2).num_inserted_tokens == 8


def test_pair_positions_need_a_pair_task(tiny):
    with pytest.raises(ValueError, match="--prompt-position 2 needs sentence pairs"):
        build_tiny(tiny, ARCH, info=SINGLE_SENTENCES, prompt_position=2)
    build_tiny(tiny, ARCH, info=SINGLE_SENTENCES, prompt_position=4)  # valid for single sentences


def test_inputs_longer_than_max_positions_minus_the_prompt_are_refused(tiny):
    model = build_tiny(tiny, ARCH, prompt_preset="prompt-tuning-100", prompt_length=500, max_positions=512).eval()
    assert model.max_positions() == 12
    fits = torch.cat([tokens(), torch.full((2, 7), 1)], dim=1)  # 12 tokens + 500 prompt vectors = 512
    assert logits(model, fits).shape == (2, 2)
    message = "13 input tokens \\+ 500 prompt vectors \\(--prompt-length\\) exceed --max-positions 512"
    with pytest.raises(ValueError, match=message):
        logits(model, torch.cat([fits, torch.ones(2, 1, dtype=torch.long)], dim=1))
    with pytest.raises(ValueError, match="keeps the last layer only: return_all_hiddens is not supported"):
        model(tokens(), return_all_hiddens=True)


def parse_train_args(data, *flags):
    """fairseq-train's parse of ``flags`` (with the user dir and a two-class task on ``data``)."""
    from fairseq import options

    argv = [str(data), "--user-dir", str(REPO / "fairseq_idpg"), "--task", "peft_sentence_prediction"]
    return options.parse_args_and_arch(options.get_training_parser(), [*argv, "--num-classes", "2", *flags])


def test_flags_and_presets_through_fairseq_parser(tmp_path):
    def parse(*flags):
        return parse_train_args(tmp_path, *flags)

    args = parse("--arch", "roberta_prompt_large", "--prompt-preset", "deep-dpt", "--dpt-bottleneck", "4")
    assert (args.prompt_matrix, args.prompt_deep, args.dpt_bottleneck, args.prompt_length) == ("low-rank", True, 4, 100)
    assert (args.encoder_embed_dim, args.encoder_layers) == (1024, 24)
    rank_probe = ("--prompt-preset", "dpt-rank-probe")
    args = parse("--arch", "roberta_prompt", *rank_probe, "--prompt-matrix", "full", "--prompt-length", "20")
    assert (args.prompt_preset, args.prompt_matrix, args.prompt_deep) == (
        "dpt-rank-probe",
        "full",
        False,
    )  # explicit wins
    assert args.dpt_probe_rank == 20 and args.encoder_embed_dim == 768  # roberta-base sizes by default
    args = parse("--arch", "roberta_prompt")
    assert (args.prompt_preset, args.prompt_matrix, args.dpt_bottleneck, args.prompt_init) == (
        "dpt",
        "low-rank",
        10,
        "uniform",
    )
    args = parse("--arch", "roberta_prompt", "--prompt-preset", "p-tuning-v2-5")
    assert (args.prompt_matrix, args.prompt_length, args.prompt_deep, args.prompt_position) == ("full", 5, True, 0)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_and_its_matrix_through_fairseq_parser(tmp_path, preset):
    settings = PRESETS[preset]
    args = parse_train_args(
        tmp_path, "--arch", "roberta_prompt", "--prompt-preset", preset, "--prompt-matrix", settings["prompt_matrix"]
    )
    assert (args.prompt_preset, args.prompt_length, args.prompt_deep) == (
        preset,
        settings["prompt_length"],
        settings["prompt_deep"],
    )


# ---------------------------------------------------------------------- export
@pytest.mark.parametrize("preset", FACTORED)
def test_exported_prompt_gives_the_same_logits(tiny, preset):
    export_state = load_script("export_dpt_prompt").export_state
    options = dict(prompt_length=6, dpt_bottleneck=2, residual_prompt_bottleneck=8, save_trainable_only=True)
    model = build_tiny(tiny, ARCH, prompt_preset=preset, **options).eval()
    if preset == "dpt-rank-probe":
        with torch.no_grad():
            model.prompt.s.copy_(torch.tensor([0.4, -0.1, 2.0, -0.3, 0.0, 1.0]))
    state = {"cfg": {"model": model.args}, "model": model.state_dict(), "last_optimizer_state": {}}
    exported, P = export_state(state)

    args = exported["cfg"]["model"]
    assert args.prompt_matrix == "full" and model.args.prompt_matrix != "full"  # the original cfg is untouched
    deep = PRESETS[preset]["prompt_deep"]
    assert args.prompt_preset == ("deep-prompt-tuning-100" if deep else "prompt-tuning-100")
    assert P.shape == ((LAYERS,) if deep else ()) + (6, DIM)
    assert torch.allclose(P, model.prompt().detach(), atol=1e-6)
    assert not any(k.startswith("prompt.") and k != "prompt.weight" for k in exported["model"])
    assert "last_optimizer_state" not in exported

    plain = build_tiny(tiny, ARCH, **{k: v for k, v in vars(args).items() if k.startswith(("dpt_", "prompt_"))}).eval()
    plain.load_state_dict(exported["model"])  # compact: fingerprint checked, backbone from --backbone
    assert plain.num_trainable_parameters() == P.numel()
    assert torch.allclose(logits(plain), logits(model), atol=1e-5)


def test_export_refuses_other_models():
    export_state = load_script("export_dpt_prompt").export_state
    with pytest.raises(ValueError, match="not a roberta_prompt checkpoint \\(--arch roberta\\)"):
        export_state({"cfg": {"model": argparse.Namespace(arch="roberta")}, "model": {}})


# ---------------------------------------------------------------------- counts and plot
def test_count_tables_follow_the_formulas_at_every_size():
    from fairseq_idpg.counts.prompts import BOTTLENECK, DPT_TABLES, L_PROMPT, RESIDUAL_M

    sizes = {"RoBERTa-large": (1024, 24), "RoBERTa-base": (768, 12), "stand-in": (384, 6)}
    # the rows of each DPT table (fairseq_idpg/counts/prompts.py), not every preset
    order = ["dpt", "prompt-tuning-100", "residual-prompt", "dpt-rank-probe", "deep-dpt", "deep-prompt-tuning-100"]
    assert len(DPT_TABLES) == 3
    for title, rows_fn in DPT_TABLES:
        ((d, L),) = [v for k, v in sizes.items() if k in title]
        ours = [row[1] for row in rows_fn()]
        l, b = L_PROMPT, BOTTLENECK
        assert ours == [FORMULAS[p](l, b, l, RESIDUAL_M, d, L) for p in order], title
    assert ours[0] == 4_840  # the stand-in (d = 384): 100 x 10 + 10 x 384


def test_plot_reads_validations_of_a_fairseq_log(tmp_path):
    plot = load_script("plot_rank_probe")
    read_log, main = plot.read_log, plot.main
    valid = "2026 | INFO | valid | epoch 001 | valid on"
    log = "\n".join(
        [
            "2026 | INFO | fairseq_cli.train | {'model': Namespace(arch='roberta_prompt', dpt_probe_rank=100, "
            "prompt_length=100)}",
            f"{valid} 'valid' subset | loss 0.69 | accuracy 52 | prompt_rank 97 | wps 1 | num_updates 20",
            "2026 | INFO | train_inner | epoch 001:     40 / 99 loss=0.6, num_updates=40",
            f"{valid} 'valid1' subset | loss 0.7 | prompt_rank 97 | num_updates 20",
            f"{valid} 'valid' subset | loss 0.61 | accuracy 60 | prompt_rank 88 | wps 1 | num_updates 40",
        ]
    )
    assert read_log(log) == (100, [(20, 97), (40, 88)])
    (tmp_path / "train.log").write_text(log)
    pytest.importorskip("matplotlib")
    assert main([str(tmp_path / "train.log"), "--out", str(tmp_path / "probe.png")]) == 0
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty.log").write_text(log.replace("prompt_rank", "other"))
    assert main([str(tmp_path / "empty.log"), "--out", str(tmp_path / "x.png")]) == 2


@pytest.mark.parametrize("preset", FACTORED)
def test_runs_in_bfloat16_close_to_float32(tiny, preset):
    options = dict(prompt_length=6, dpt_bottleneck=2, residual_prompt_bottleneck=8)
    model = build_tiny(tiny, ARCH, prompt_preset=preset, **options).eval()
    reference = logits(model)
    half = model.to(torch.bfloat16)
    out = logits(half)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), reference, atol=0.1 * reference.abs().max().item() + 0.02)
