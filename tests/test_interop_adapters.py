"""Cross-checks against AdapterHub's ``adapters``: the Houlsby adapter, Compacter and the MAM adapter exported
(scripts/export_peft.py --format adapters), loaded by adapters + transformers (``AutoAdapterModel`` and
``load_adapter``), give our logits on real sentences; imported back (scripts/import_peft.py), the same
tensors; an adapter that adapters itself built imports to the same logits; what the format cannot hold is
refused in one line (fairseq_idpg/interop/adapters_format.py, docs/using.md "PEFT and adapters"), prompt tuning
with the three differences from adapters' prefix_after_bos prompt tuning shown to be the whole difference.

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

adapters = pytest.importorskip("adapters", reason="the [interop] extra (pip install -e .[interop]) is not installed")
pytestmark = pytest.mark.usefixtures("one_thread")


def adapter_model(base, folder):
    """``AutoAdapterModel`` of ``base`` with the adapter (and its head) at ``folder`` active, in eval mode."""
    model = adapters.AutoAdapterModel.from_pretrained(str(base))
    model.load_adapter(str(folder), set_active=True)
    return model.eval()


def hf_of(backbone):
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    return hf_backbone_for(backbone)


@pytest.mark.parametrize(
    "method, overrides",
    [("houlsby-adapter", {}), ("houlsby-adapter", {"--adapter-activation": "gelu"}), ("compacter", {}),
     ("mam-adapter", {})],
    ids=["houlsby-adapter", "houlsby-adapter-gelu", "compacter", "mam-adapter"],
)  # fmt: skip
def test_round_trip_through_adapters_on_a_tiny_roberta(tmp_path, tiny, glue_texts, method, overrides):
    """Exported with a converted RobertaModel, adapters' logits are ours within float rounding; imported back,
    every trained tensor is the same (Compacter's A set: ours shared by down and up, adapters' copied) and so
    are the logits (the Houlsby adapter's nonlinearity, ReLU or GELU, travels as ``non_linearity``)."""
    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint = trained_checkpoint(tmp_path, method, tiny.model_file, data, **overrides)
    assert export(checkpoint, tmp_path / "out", "--format", "adapters") == 0
    ours, theirs = (
        hub(checkpoint, data, tiny.folder / "vocab.txt"),
        adapter_model(tmp_path / "out" / "base_model", tmp_path / "out"),
    )
    mine, other = logits_both(ours, theirs, hf_of(tiny.model_file), glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"tiny RoBERTa {method}: max |ours - adapters| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - adapters| = {gap:.2e}"
    assert import_(tmp_path / "out", tmp_path / "back.pt", tiny.model_file, data) == 0
    before, after = trained_tensors(checkpoint), trained_tensors(tmp_path / "back.pt")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    back, _ = logits_both(hub(tmp_path / "back.pt", data, tiny.folder / "vocab.txt"), theirs, hf_of(tiny.model_file),
                          glue_texts)  # fmt: skip
    assert torch.equal(back, mine)


def test_mam_adapter_on_the_standin_loads_into_the_original_bert(tmp_path, standin_model, glue_texts):
    """On the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa) the MAM adapter (prefixes and the
    parallel adapter) goes to ``BertAdapterModel`` of the original BERT: logits agree within the
    LayerNorm-epsilon tolerance, and with the adapter switched off they do not (it is in the comparison)."""
    data, _ = tiny_sst2(tmp_path, tiny_backbone_of(standin_model))
    checkpoint = trained_checkpoint(tmp_path, "mam-adapter", standin_model / "model.pt", data, scale=0.05)
    assert export(checkpoint, tmp_path / "out", "--format", "adapters") == 0
    hf = hf_of(standin_model / "model.pt")
    ours, theirs = hub(checkpoint, data, standin_model / "vocab.txt"), adapter_model(hf.path, tmp_path / "out")
    mine, other = logits_both(ours, theirs, hf, glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"stand-in MAM adapter: max |ours - adapters| = {gap:.2e}, logits up to {mine.abs().max():.2f}")
    assert gap <= STANDIN_ATOL, f"max |ours - adapters| = {gap:.2e} (logits up to {mine.abs().max():.2f})"
    assert torch.equal(mine.argmax(-1), other.argmax(-1))
    theirs.set_active_adapters(None)
    theirs.active_head = "mam-adapter"
    _, without = logits_both(ours, theirs, hf, glue_texts)
    assert (mine - without).abs().max() > 10 * STANDIN_ATOL


def built_by_adapters(tmp_path, tiny, name, config):
    """(hf, the AutoAdapterModel, its saved folder): an adapter that ``adapters`` built with ``config`` on
    ``tiny``'s RobertaModel, every trained tensor moved off its initialisation, saved with its head."""
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    hf = hf_backbone_for(tiny.model_file, tmp_path / "base")._replace(path=str(tmp_path / "base"))
    torch.manual_seed(0)
    theirs = adapters.AutoAdapterModel.from_pretrained(hf.path)
    theirs.add_adapter(name, config=config)
    theirs.add_classification_head(name, num_labels=2, layers=2, activation_function="tanh", use_pooler=False)
    theirs.train_adapter(name)
    with torch.no_grad():
        for p in theirs.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.3)
    theirs.set_active_adapters(name)
    theirs.save_adapter(str(tmp_path / name), name, with_head=True)
    return hf, theirs, tmp_path / name


def test_an_adapter_built_by_adapters_imports_to_the_same_logits(tmp_path, tiny, glue_texts, capsys):
    """A Compacter that adapters built (its own CompacterConfig: one A set shared by every layer, which ours
    copies into each adapter) and saved becomes our compacter record: the hub's logits are adapters'. The same
    folder with a gate is refused in one line, nothing written."""
    import json

    data, _ = tiny_sst2(tmp_path, tiny)
    hf, theirs, _ = built_by_adapters(tmp_path, tiny, "c", adapters.CompacterConfig(reduction_factor=2, phm_rank=2))
    assert import_(tmp_path / "c", tmp_path / "c.pt", tiny.model_file, data) == 0
    mine, other = logits_both(hub(tmp_path / "c.pt", data, tiny.folder / "vocab.txt"), theirs.eval(), hf, glue_texts)
    gap = (mine - other).abs().max().item()
    with capsys.disabled():
        print(f"tiny RoBERTa, adapters' own Compacter imported: max |ours - adapters| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - adapters| = {gap:.2e}"

    config = json.loads((tmp_path / "c" / "adapter_config.json").read_text())
    config["config"]["use_gating"] = True
    (tmp_path / "c" / "adapter_config.json").write_text(json.dumps(config))
    gated, why = tmp_path / "gated.pt", "use_gating True"
    refused_in_one_line(
        capsys, "import_peft.py", lambda: import_(tmp_path / "c", gated, tiny.model_file, data), gated, why
    )


def test_a_parallel_adapter_alone_imports_to_the_same_logits(tmp_path, tiny, glue_texts, capsys):
    """adapters' parallel adapter without prefixes (``ParBnConfig``: He et al.'s parallel FFN adapter) becomes our
    parallel FFN adapter alone (its flags, no record's preset, whose prefixes cannot be turned off): the hub loads
    the checkpoint and its logits are adapters'; exported again, it is the same adapter."""
    data, _ = tiny_sst2(tmp_path, tiny)
    hf, theirs, _ = built_by_adapters(tmp_path, tiny, "p", adapters.ParBnConfig(reduction_factor=4, scaling=2.0))
    capsys.readouterr()
    assert import_(tmp_path / "p", tmp_path / "p.pt", tiny.model_file, data) == 0
    assert "parallel adapter (--ffn-adapter-dim/--ffn-adapter-scale, no --blocks-preset)" in capsys.readouterr().out
    ours = hub(tmp_path / "p.pt", data, tiny.folder / "vocab.txt")
    mine, other = logits_both(ours, theirs.eval(), hf, glue_texts)
    gap = (mine - other).abs().max().item()
    with capsys.disabled():
        print(f"tiny RoBERTa, adapters' parallel adapter alone imported: max |ours - adapters| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - adapters| = {gap:.2e}"
    from fairseq_idpg.interop.peft_format import active_blocks

    assert active_blocks(ours.model) == ["ffn_adapter"]
    assert export(tmp_path / "p.pt", tmp_path / "again", "--format", "adapters") == 0
    again = adapter_model(tmp_path / "again" / "base_model", tmp_path / "again")
    _, back = logits_both(ours, again, hf, glue_texts)
    assert (mine - back).abs().max() <= TINY_ATOL


def test_an_adapters_folder_of_another_base_or_size_is_refused(tmp_path, tiny, tiny_backbones, capsys):
    """The export names its base portably (model_name: the backbone's name, no local path); imported onto another
    backbone of the same shape it is refused by the weights digest beside it, then by model_name; onto a backbone
    of other sizes, saying that the sizes differ; nothing written."""
    import json

    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint, folder = trained_checkpoint(tmp_path, "houlsby-adapter", tiny.model_file, data), tmp_path / "out"
    assert export(checkpoint, folder, "--format", "adapters") == 0
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["model_name"] == tiny.folder.name
    other, out = tiny_backbones(seed=1), tmp_path / "x.pt"
    why = f"exported from the backbone '{tiny.folder.name}'"
    refused_in_one_line(capsys, "import_peft.py", lambda: import_(folder, out, other.model_file, data), out, why)
    (folder / "fairseq_backbone.json").unlink()
    (folder / "adapter_config.json").write_text(json.dumps({**config, "model_name": "bert-base-uncased"}))
    why = f"was trained on 'bert-base-uncased' (model_name), --backbone {tiny.model_file} is '{tiny.folder.name}'"
    refused_in_one_line(capsys, "import_peft.py", lambda: import_(folder, out, tiny.model_file, data), out, why)
    bigger = tiny_backbones(layers=4)
    why = "made for a roberta model with 2 layers and hidden size 32; --backbone is a roberta model with 4 layers"
    refused_in_one_line(capsys, "import_peft.py", lambda: import_(folder, out, bigger.model_file, data), out, why)


@pytest.mark.parametrize(
    "method, reason", [("lora", "LoRA goes to --format peft"), ("p-tuning-v2-5", "one prompt at the input")]
)
def test_what_adapters_cannot_hold_is_refused_in_one_line(tmp_path, tiny, capsys, method, reason):
    """Refused in one line, nothing written (prompt tuning: the next test, with the evidence)."""
    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint, out = trained_checkpoint(tmp_path, method, tiny.model_file, data), tmp_path / "out"
    refused_in_one_line(capsys, "export_peft.py", lambda: export(checkpoint, out, "--format", "adapters"), out, reason)


def test_prompt_tuning_is_refused_and_the_difference_is_the_documented_one(tmp_path, tiny, glue_texts, capsys):
    """adapters' ``PromptTuningConfig(combine="prefix_after_bos")`` puts the prompt after ``<s>`` and reads ``<s>``,
    as ours, but is not our function, so prompt tuning is refused both ways in one line. Its three reasons
    (adapters_format's docstring) are the whole difference: with its prompt set to ours after the embedding layer,
    Q = LN(P + E_pos[3..t+2] + E_type[0]), our positions for the real tokens (shifted by t) and eager attention,
    adapters gives our logits; with its own positions, or under sdpa on a padded batch, it does not."""
    from fairseq.data.data_utils import collate_tokens

    from fairseq_idpg.interop.adapters_format import FLEX_HEAD
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    data, _ = tiny_sst2(tmp_path, tiny)
    checkpoint, out = trained_checkpoint(tmp_path, "prompt-tuning-5", tiny.model_file, data), tmp_path / "out"
    why = "prefix_after_bos"
    refused_in_one_line(capsys, "export_peft.py", lambda: export(checkpoint, out, "--format", "adapters"), out, why)

    ours = hub(checkpoint, data, tiny.folder / "vocab.txt")
    P = trained_tensors(checkpoint)["prompt.weight"]
    t = P.size(0)
    head = ours.model.classification_heads["sentence_classification_head"]
    tokens = collate_tokens([ours.encode(*texts) for texts in glue_texts], pad_idx=1)
    mask = tokens.ne(1).long()
    # ours: <s> at 2, the real tokens after it at 2 + t + i (insert_prompts); padding at padding_idx 1
    positions = (mask.cumsum(1) + 1 + t * (torch.arange(tokens.size(1)) > 0)).masked_fill(mask.eq(0), 1)
    hf = hf_backbone_for(tiny.model_file, tmp_path / "base")._replace(path=str(tmp_path / "base"))
    gaps = {}
    with torch.no_grad():
        mine = ours.predict("sentence_classification_head", tokens, return_logits=True)
        for attention in ("eager", "sdpa"):
            theirs = adapters.AutoAdapterModel.from_pretrained(hf.path, attn_implementation=attention)
            theirs.add_adapter("p", config=adapters.PromptTuningConfig(prompt_length=t, combine="prefix_after_bos"))
            theirs.add_classification_head("p", num_labels=2, layers=2, activation_function="tanh", use_pooler=False)
            theirs.set_active_adapters("p")
            emb = theirs.roberta.embeddings
            Q = emb.LayerNorm(P + emb.position_embeddings.weight[3 : 3 + t] + emb.token_type_embeddings.weight[0])
            theirs.roberta.prompt_tuning.prompt_tunings["p"].prompt_embedding.weight.copy_(Q)
            for part, name in FLEX_HEAD.items():
                theirs.get_submodule(name.format(name="p")).load_state_dict(getattr(head, part).state_dict())
            for own in (False, True) if attention == "eager" else (False,):
                logits = theirs.eval()(input_ids=tokens, attention_mask=mask, position_ids=None if own else positions)
                gaps[attention, own] = (mine - logits.logits).abs().max().item()
    with capsys.disabled():
        print(f"tiny RoBERTa prompt tuning vs adapters prefix_after_bos, max |ours - adapters|: {gaps}")
    assert gaps["eager", False] <= TINY_ATOL, gaps
    assert gaps["eager", True] > 100 * TINY_ATOL and gaps["sdpa", False] > 100 * TINY_ATOL, gaps

    theirs.save_adapter(str(tmp_path / "p"), "p", with_head=True)
    back = tmp_path / "p.pt"
    refused_in_one_line(
        capsys, "import_peft.py", lambda: import_(tmp_path / "p", back, tiny.model_file, data), back, why
    )
