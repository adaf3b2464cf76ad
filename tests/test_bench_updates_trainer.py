"""PEFT trained by transformers.Trainer, timed per update (check_gpu.timing.trainer_step_times, used by
scripts/bench_updates.py): positive times, the PEFT parameters trained, the frozen backbone left as it was."""

import pytest
import torch


@pytest.mark.parametrize("kind, record", [("lora", "lora"), ("prompt-tuning", "prompt-tuning-5")])
def test_the_trainer_updates_peft_parameters_and_leaves_the_backbone(tiny, kind, record):
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from fairseq_idpg.check_gpu.timing import hf_roberta, load_backbone, peft_model, trainer_step_times

    state, sizes, dictionary = load_backbone(tiny.folder)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(dictionary.nspecial, len(dictionary) - 1, (2, 8), generator=g)
    labels = torch.tensor([0, 1])
    model = peft_model(hf_roberta(state, sizes), kind)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}

    seconds, wall, ran = trainer_step_times(model, batch, labels, "fp32", record, steps=2, warmup=1, repeats=2)

    assert seconds > 0 and wall > 0 and ran == "fp32"
    after = dict(model.named_parameters())
    changed = {name for name, p in after.items() if not torch.equal(p.detach().cpu(), before[name])}
    trained = {name for name, p in after.items() if p.requires_grad}
    method = {name for name in trained if "lora_" in name or "prompt_encoder" in name}
    assert method and method <= changed  # the method's own parameters moved (the head's too, as PEFT trains it)
    assert not changed - trained  # nothing frozen moved
    assert len(after) > len(trained)  # and there is a frozen backbone
