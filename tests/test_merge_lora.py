"""scripts/merge_lora.py: LoRA and BitFit folded into the frozen weights give a plain fairseq ``roberta``
checkpoint that fairseq-validate scores as it scores the trained run (fairseq_idpg/interop/merge.py)."""

import importlib.util
import subprocess

import pytest
import torch
from conftest import REPO, tiny_sst2
from interop_support import refused_in_one_line
from interop_support import trained_checkpoint as trained

from fairseq_idpg.methods import methods_where


def merge(run, out):
    spec = importlib.util.spec_from_file_location("merge_lora", REPO / "scripts" / "merge_lora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([str(run), str(out)])


def validate(data, checkpoint):
    """fairseq-validate's (loss, accuracy) of ``checkpoint`` on the dev split."""
    argv = ["fairseq-validate", str(data), "--user-dir", str(REPO / "fairseq_idpg"), "--cpu", "--path"]
    argv += [str(checkpoint), "--batch-size", "8", "--num-workers", "0", "--valid-subset", "valid"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    line = (out.stdout + out.stderr).split("valid on 'valid' subset")[1].splitlines()[0]
    return float(line.split("| loss ")[1].split()[0]), float(line.split("| accuracy ")[1].split()[0])


def test_merged_lora_and_bitfit_score_the_same_in_fairseq_validate(tmp_path, tiny):
    data, _ = tiny_sst2(tmp_path, tiny)
    run = trained(tmp_path, "lora", tiny.model_file, data, **{"--bitfit": True})
    assert merge(run, tmp_path / "merged.pt") == 0
    merged = torch.load(tmp_path / "merged.pt", weights_only=False)
    assert merged["cfg"]["model"].arch == "roberta" and not any("lora" in k for k in merged["model"])
    assert validate(data, run) == validate(data, tmp_path / "merged.pt")


@pytest.mark.parametrize("method", methods_where(family="lora", merges_into_backbone=True))
def test_logits_of_the_merged_model_are_the_runs(tmp_path, tiny, method):
    """Tighter than fairseq-validate's rounded loss: the plain model's logits equal the run's within float
    rounding (the merged product B A is summed in another order than the two small products), for LoRA and its
    variants (DoRA's W' = m (W_0 + s B A) / ||W_0 + s B A||_c; PiSSA's W - s B_0 A_0 + s B A) and VeRA
    (W + Lambda_b B Lambda_d A)."""
    from fairseq import checkpoint_utils

    data, _ = tiny_sst2(tmp_path, tiny)
    run = trained(tmp_path, method, tiny.model_file, data)
    assert merge(run, tmp_path / "merged.pt") == 0
    tokens = torch.tensor([[0, 2000, 2100, 2200, 2], [0, 3000, 3100, 2, 1]])
    logits = []
    for checkpoint in (run, tmp_path / "merged.pt"):
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
        with torch.no_grad():
            logits.append(models[0].eval()(tokens, classification_head_name="sentence_classification_head")[0])
    assert type(models[0]).__name__ == "StockRobertaModel"  # --arch roberta: fairseq's model, no LoRA
    assert torch.allclose(logits[0], logits[1], atol=1e-5)


@pytest.mark.parametrize("method", ["houlsby-adapter", "prompt-tuning-5"])
def test_what_does_not_fold_into_the_weights_is_refused(tmp_path, tiny, capsys, method):
    data, _ = tiny_sst2(tmp_path, tiny)
    run, merged = trained(tmp_path, method, tiny.model_file, data), tmp_path / "merged.pt"
    refused_in_one_line(capsys, "merge_lora.py", lambda: merge(run, merged), merged)


def test_the_reported_size_counts_the_tied_lm_head_once(tmp_path, tiny, capsys):
    """The LM head's weight is the token embeddings' (one tensor under two names): the values merge_lora.py
    reports are those of the loaded model's distinct parameters and buffers."""
    from fairseq import checkpoint_utils

    data, _ = tiny_sst2(tmp_path, tiny)
    run = trained(tmp_path, "lora", tiny.model_file, data)
    capsys.readouterr()
    assert merge(run, tmp_path / "merged.pt") == 0
    reported = int(capsys.readouterr().out.split(" checkpoint, ")[1].split(" values")[0].replace(",", ""))
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "merged.pt")])
    model = models[0]
    assert model.encoder.lm_head.weight is model.encoder.sentence_encoder.embed_tokens.weight
    assert reported == sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
