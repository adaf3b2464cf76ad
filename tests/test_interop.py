"""Cross-checks against code written elsewhere: our trained methods exported to Hugging Face PEFT, loaded by
peft + transformers, give our logits on real sentences; imported back, the same tensors; what a format cannot
hold is refused in one line (fairseq_idpg/interop/, docs/using.md "PEFT and adapters").

Tolerances (TINY_ATOL, STANDIN_ATOL) and why: tests/interop_support.py.
"""

import pytest
import torch
from conftest import tiny_sst2
from interop_support import (
    STANDIN_ATOL,
    TINY_ATOL,
    export,
    hub,
    import_,
    logits_both,
    refused_in_one_line,
    tiny_backbone_of,
    trained_checkpoint,
    trained_tensors,
)

from fairseq_idpg.methods import methods_where

peft = pytest.importorskip("peft", reason="the [interop] extra (pip install -e .[interop]) is not installed")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def peft_model(base, adapter, num_labels=2):
    from peft import PeftModel

    auto = transformers.AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=num_labels)
    return PeftModel.from_pretrained(auto, str(adapter)).eval()


# ---------------------------------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("method", methods_where(exports_to=lambda formats: "peft" in formats))
def test_lora_round_trip_through_peft_on_a_tiny_roberta(tmp_path, tiny, glue_texts, method):
    """LoRA (r 16 on q and v, alpha 32) and its variants (DoRA: use_dora; PiSSA: init_lora_weights "pissa", the
    residual recomputed by PEFT from the original base), and VeRA (VeraConfig r 256, the shared A and B saved)
    exported with a converted RobertaModel: PEFT's logits are ours within float rounding; imported back, the same
    record and every trained tensor the same."""
    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint = trained_checkpoint(tmp_path, method, tiny.model_file, data)
    assert export(checkpoint, tmp_path / "peft") == 0
    ours = hub(checkpoint, data, tiny.folder / "vocab.txt")
    theirs = peft_model(tmp_path / "peft" / "base_model", tmp_path / "peft")
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    mine, other = logits_both(ours, theirs, hf_backbone_for(tiny.model_file), glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"tiny RoBERTa {method}: max |ours - PEFT| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - PEFT| = {gap:.2e}"
    assert import_(tmp_path / "peft", tmp_path / "back.pt", tiny.model_file, data) == 0
    stored = torch.load(tmp_path / "back.pt", weights_only=False)["cfg"]["model"]
    assert stored.blocks_preset == method
    before, after = trained_tensors(checkpoint), trained_tensors(tmp_path / "back.pt")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_lora_on_the_standin_loads_into_the_original_bert(tmp_path, standin_model, glue_texts):
    """On the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa) the export targets the original BERT
    (its pooler = our head's dense, its classifier = our out_proj): logits agree within the LayerNorm-epsilon
    tolerance; the imported checkpoint gives the hub the same predictions."""
    data, _ = tiny_sst2(tmp_path, tiny_backbone_of(standin_model))
    checkpoint = trained_checkpoint(tmp_path, "lora", standin_model / "model.pt", data, scale=0.05)
    assert export(checkpoint, tmp_path / "peft") == 0
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    hf = hf_backbone_for(standin_model / "model.pt")
    ours, theirs = hub(checkpoint, data, standin_model / "vocab.txt"), peft_model(hf.path, tmp_path / "peft")
    mine, other = logits_both(ours, theirs, hf, glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"stand-in LoRA: max |ours - PEFT| = {gap:.2e}, logits up to {mine.abs().max():.2f}")
    assert gap <= STANDIN_ATOL, f"max |ours - PEFT| = {gap:.2e} (logits up to {mine.abs().max():.2f})"
    assert torch.equal(mine.argmax(-1), other.argmax(-1))
    assert import_(tmp_path / "peft", tmp_path / "back.pt", standin_model / "model.pt", data) == 0
    back = hub(tmp_path / "back.pt", data, standin_model / "vocab.txt")
    again, _ = logits_both(back, theirs, hf, glue_texts[:2])
    assert torch.allclose(again, mine[:2], atol=1e-6)


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "method, reason",
    [
        ("prompt-tuning-5", "before <s>"),
        ("p-tuning-v2-5", "static key/value prefixes"),
        ("prefix-tuning", "positions from l"),
        ("houlsby-adapter", "PEFT holds LoRA and VeRA here"),
        ("loreft", "PEFT holds LoRA and VeRA here"),  # PEFT has no LoReFT (its reference is pyreft)
    ],
)
def test_what_peft_cannot_hold_is_refused_in_one_line(tmp_path, tiny, capsys, method, reason):
    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint, out = trained_checkpoint(tmp_path, method, tiny.model_file, data), tmp_path / "out"
    refused_in_one_line(capsys, "export_peft.py", lambda: export(checkpoint, out), out, reason)
