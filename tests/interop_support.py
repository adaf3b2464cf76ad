"""Shared by the interoperability tests (test_interop.py: PEFT; test_interop_adapters.py: adapters). No tests here.

Tolerances, and why:
- tiny RoBERTa backbones (random fairseq RoBERTa converted to transformers' RobertaModel): the same
  LayerNorm epsilon (1e-5), exact GELU and positions on both sides, so only float32 summation order
  differs: ``TINY_ATOL`` 1e-5 on logits;
- the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa) against the original BERT: BERT's
  LayerNorms use epsilon 1e-12, fairseq's 1e-5 (docs/standin.md: hidden states within 0.006 over 14
  LayerNorms); ``STANDIN_ATOL`` 2e-2 on logits of magnitude ~1 (measured: see the tests' assertion messages).

Fixtures in conftest.py: ``one_thread``, ``glue_texts`` (8 SST-2 dev sentences and 4 RTE dev pairs).

- ``trained_checkpoint``: a method's compact checkpoint with every trained tensor moved off its init;
- ``hub``, ``logits_both``: our logits and the other library's on the same tokens;
- ``export`` / ``import_``: scripts/export_peft.py and scripts/import_peft.py's ``main``;
- ``refused_in_one_line``: a script's refusal (exit status 2, one line, nothing written);
- ``trained_tensors``, ``tiny_backbone_of``;
- ``assert_same_as_peft``: one of our projections against PEFT's layer, outputs and gradients;
- ``peft_count_at_roberta_large``: PEFT's trainable count of a config on roberta-large.
"""

import torch
from conftest import REPO

TINY_ATOL = 1e-5
STANDIN_ATOL = 2e-2


def trained_checkpoint(tmp_path, method, backbone, data, scale=0.3, **overrides):
    """A checkpoint of ``method`` as if trained: every trained tensor moved off its initialisation."""
    from fairseq_idpg.interop.method_checkpoint import build_for_import, save_imported
    from fairseq_idpg.methods import METHODS

    torch.manual_seed(0)
    model, cfg = build_for_import(METHODS[method], backbone, data, overrides)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)
    return save_imported(model, cfg, tmp_path / f"{method}.pt", source="test")


def hub(checkpoint, data, vocab):
    from fairseq.models.roberta import RobertaModel

    return RobertaModel.from_pretrained(
        str(checkpoint.parent), checkpoint.name, data_name_or_path=str(data), user_dir=str(REPO / "fairseq_idpg"),
        bpe="wordpiece", wordpiece_vocab=str(vocab),
    ).eval()  # fmt: skip


def logits_both(ours, theirs, hf, examples):
    """(ours, theirs) logits [N, classes] on ``examples``, one padded batch: our hub, and the PEFT model on the
    same tokens in its vocabulary."""
    from fairseq.data.data_utils import collate_tokens

    tokens = collate_tokens([ours.encode(*texts) for texts in examples], pad_idx=1)
    with torch.no_grad():
        mine = ours.predict("sentence_classification_head", tokens, return_logits=True)
        ids = hf.hf_ids(tokens)
        other = theirs(input_ids=ids, attention_mask=tokens.ne(1).long()).logits
    return mine, other


def export(run, out, *extra):
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_peft", REPO / "scripts" / "export_peft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([str(run), str(out), *extra])


def import_(adapter, out, backbone, data):
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_peft", REPO / "scripts" / "import_peft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([str(adapter), str(out), "--backbone", str(backbone), "--data", str(data)])


def refused_in_one_line(capsys, script, main, written, reason=""):
    """Call ``main()`` (a script's entry point): it exits with status 2 and one line ``SCRIPT: error: ...``
    containing ``reason`` on stderr, and ``written`` (what it would have written) does not exist."""
    capsys.readouterr()  # what came before (the data preparation's warnings)
    assert main() == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{script}: error: ") and err.count("\n") == 1 and reason in err, err
    assert not written.exists()


def trained_tensors(checkpoint):
    state = torch.load(checkpoint, weights_only=False)["model"]
    return {k: v for k, v in state.items() if not k.startswith("_")}


def tiny_backbone_of(folder):
    """The conftest TinyBackbone view of a model folder (for ``tiny_sst2``'s WordPiece data)."""
    from conftest import TinyBackbone

    return TinyBackbone(folder, None)


def assert_same_as_peft(linear, ours, theirs, params, their_params, x):
    """Our projection of ``x`` (the slot's ``project(x, W x + b)``) and PEFT's layer give the same output and the
    same gradients of the trained tensors (``params``, ``their_params``: in the same order), in eval and in
    training mode (dropout drawn after the same seed on both sides)."""
    for mode in (False, True):
        ours.train(mode), theirs.train(mode)
        torch.manual_seed(3)
        mine = ours.project(x, linear(x))
        torch.manual_seed(3)
        other = theirs(x)
        assert torch.allclose(mine, other, atol=1e-5), (mode, (mine - other).abs().max())
        grads = torch.autograd.grad(mine.square().sum(), params)
        expected = torch.autograd.grad(other.square().sum(), their_params)
        for g, h in zip(grads, expected, strict=True):
            assert torch.allclose(g, h, atol=1e-4, rtol=1e-4), (mode, (g - h).abs().max())


def peft_count_at_roberta_large(config):
    """PEFT's trainable count (``get_nb_trainable_parameters``, what ``print_trainable_parameters`` prints) of the
    PEFT ``config`` on roberta-large's RobertaModel (no head), built on the meta device."""
    import peft
    import transformers

    roberta = transformers.RobertaConfig(
        vocab_size=50265, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        max_position_embeddings=514,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.RobertaModel(roberta, add_pooling_layer=False)
    trainable, _ = peft.get_peft_model(model, config).get_nb_trainable_parameters()
    return trainable
