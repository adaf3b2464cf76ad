"""Cross-checks against code written elsewhere: our trained methods exported to Hugging Face PEFT, loaded by
peft + transformers, give our logits on real sentences; imported back, the same tensors; what a format cannot
hold is refused in one line (fairseq_idpg/interop/, docs/using.md "PEFT and adapters").

Tolerances, and why:
- tiny RoBERTa backbones (random fairseq RoBERTa converted to transformers' RobertaModel): the same
  LayerNorm epsilon (1e-5), exact GELU and positions on both sides, so only float32 summation order
  differs: ``TINY_ATOL`` 1e-5 on logits;
- the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa) against the original BERT: BERT's
  LayerNorms use epsilon 1e-12, fairseq's 1e-5 (docs/standin.md: hidden states within 0.006 over 14
  LayerNorms); ``STANDIN_ATOL`` 2e-2 on logits of magnitude ~1 (measured: see the test's assertion message).
"""

import pytest
import torch
from conftest import REPO, tiny_sst2

TINY_ATOL = 1e-5
STANDIN_ATOL = 2e-2

peft = pytest.importorskip("peft", reason="the [interop] extra (pip install -e .[interop]) is not installed")
transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sentences(shared_data):
    """8 SST-2 dev sentences and 4 RTE dev pairs (real text)."""
    from fairseq_idpg.conversion.verify import glue_examples

    singles, pairs = glue_examples(str(shared_data / "glue"))
    return [(s,) for s in singles] + [tuple(p) for p in pairs]


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


def peft_model(base, adapter, num_labels=2):
    from peft import PeftModel

    auto = transformers.AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=num_labels)
    return PeftModel.from_pretrained(auto, str(adapter)).eval()


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


def trained_tensors(checkpoint):
    state = torch.load(checkpoint, weights_only=False)["model"]
    return {k: v for k, v in state.items() if not k.startswith("_")}


# ---------------------------------------------------------------------------------------------------- LoRA
def test_lora_round_trip_through_peft_on_a_tiny_roberta(tmp_path, tiny, sentences):
    """LoRA (r 16 on q and v, alpha 32) exported with a converted RobertaModel: PEFT's logits are ours within
    float rounding; imported back, every trained tensor is the same."""
    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint = trained_checkpoint(tmp_path, "lora", tiny.model_file, data)
    assert export(checkpoint, tmp_path / "peft") == 0
    ours = hub(checkpoint, data, tiny.folder / "vocab.txt")
    theirs = peft_model(tmp_path / "peft" / "base_model", tmp_path / "peft")
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    mine, other = logits_both(ours, theirs, hf_backbone_for(tiny.model_file), sentences)
    gap = (mine - other).abs().max().item()
    print(f"tiny RoBERTa LoRA: max |ours - PEFT| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - PEFT| = {gap:.2e}"
    assert import_(tmp_path / "peft", tmp_path / "back.pt", tiny.model_file, data) == 0
    before, after = trained_tensors(checkpoint), trained_tensors(tmp_path / "back.pt")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_lora_on_the_standin_loads_into_the_original_bert(tmp_path, standin_model, sentences):
    """On the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa) the export targets the original BERT
    (its pooler = our head's dense, its classifier = our out_proj): logits agree within the LayerNorm-epsilon
    tolerance; the imported checkpoint gives the hub the same predictions."""
    data, _ = tiny_sst2(tmp_path, tiny_backbone_of(standin_model))
    checkpoint = trained_checkpoint(tmp_path, "lora", standin_model / "model.pt", data, scale=0.05)
    assert export(checkpoint, tmp_path / "peft") == 0
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    hf = hf_backbone_for(standin_model / "model.pt")
    ours, theirs = hub(checkpoint, data, standin_model / "vocab.txt"), peft_model(hf.path, tmp_path / "peft")
    mine, other = logits_both(ours, theirs, hf, sentences)
    gap = (mine - other).abs().max().item()
    print(f"stand-in LoRA: max |ours - PEFT| = {gap:.2e}, logits up to {mine.abs().max():.2f}")
    assert gap <= STANDIN_ATOL, f"max |ours - PEFT| = {gap:.2e} (logits up to {mine.abs().max():.2f})"
    assert torch.equal(mine.argmax(-1), other.argmax(-1))
    assert import_(tmp_path / "peft", tmp_path / "back.pt", standin_model / "model.pt", data) == 0
    back = hub(tmp_path / "back.pt", data, standin_model / "vocab.txt")
    again, _ = logits_both(back, theirs, hf, sentences[:2])
    assert torch.allclose(again, mine[:2], atol=1e-6)


def tiny_backbone_of(folder):
    """The conftest TinyBackbone view of a model folder (for ``tiny_sst2``'s WordPiece data)."""
    from conftest import TinyBackbone

    return TinyBackbone(folder, None)


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "method, reason",
    [
        ("prompt-tuning-5", "before <s>"),
        ("p-tuning-v2-5", "static key/value prefixes"),
        ("prefix-tuning", "positions from l"),
        ("houlsby-adapter", "PEFT holds LoRA here"),
    ],
)
def test_what_peft_cannot_hold_is_refused_in_one_line(tmp_path, tiny, capsys, method, reason):
    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint = trained_checkpoint(tmp_path, method, tiny.model_file, data)
    capsys.readouterr()  # the data preparation's warnings
    assert export(checkpoint, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("export_peft.py: error: ") and err.count("\n") == 1 and reason in err
    assert not (tmp_path / "out").exists()
