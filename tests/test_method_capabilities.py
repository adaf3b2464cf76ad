"""What each method record says it can do (``fairseq_idpg.methods``: family, representative, exports_to,
peft_counterpart, merges_into_backbone, ablation_of) and the lists derived from it.

The derived lists equal the ones kept by hand before they were derived (literal values below), and every
record's claims agree with the code that acts on them: the export checks of fairseq_idpg/interop/ and the
merge check refuse exactly the records that do not claim the format or the merge. Cheap: no model is built
(a run is its options and the block configs its record's settings turn on).
"""

from types import SimpleNamespace

import pytest
from blocks_support import method_blocks

from fairseq_idpg.interop import adapters_format, merge, peft_format
from fairseq_idpg.methods import EXPORT_FORMATS, FAMILIES, METHODS, methods_where, representative

# the hand-kept lists these are derived from (check_gpu/training.py, check_gpu/timing.py, interop/merge.py,
# scripts/benchmark_blocks.py)
CHECK_GPU_FAMILIES = {
    "prompts": "prompt-tuning-5",
    "idpg": "m-idpg-phm",
    "inducer": "inducer",
    "adapters": "houlsby-adapter",
    "lora": "lora",
    "bitfit": "bitfit",
    "finetune": "finetune",
}
PEFT_PAIRS = {"lora": "lora", "prompt-tuning": "prompt-tuning-5", "prefix-tuning": "prefix-tuning"}
MERGEABLE = ("lora", "vera", "bitfit")  # VeRA's since it merges (its record came after the hand list)
# the hand list, and (IA)^3, which it had missed: every roberta_blocks record but the ablations
BENCHMARK_BLOCKS = ("finetune", "lora", "inducer", "inducer-lora", "mam-inducer", "prefix-tuning", "houlsby-adapter",
                    "compacter", "mam-adapter", "bitfit", "ia3")  # fmt: skip


def kept(names):
    """``names`` among the records of the day the lists were kept by hand: a record added since joins the
    derived lists (as it should) without failing this comparison."""
    from fairseq_idpg.run.identity import settings_before_hashing

    return [name for name in names if name in settings_before_hashing()]


def test_the_derived_lists_are_the_hand_kept_ones():
    import runpy
    from pathlib import Path

    from fairseq_idpg.check_gpu.timing import PEFT_PAIRS as derived_pairs
    from fairseq_idpg.check_gpu.training import FAMILIES as check_gpu_families

    assert check_gpu_families == CHECK_GPU_FAMILIES and list(check_gpu_families) == list(CHECK_GPU_FAMILIES)
    assert {family: representative(family) for family in FAMILIES} == CHECK_GPU_FAMILIES
    assert {kind: name for kind, name in derived_pairs.items() if kept([name])} == PEFT_PAIRS
    assert merge.MERGEABLE == MERGEABLE
    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "benchmark_blocks.py"))
    assert tuple(kept(script["DEFAULT_METHODS"])) == BENCHMARK_BLOCKS
    assert kept(methods_where(exports_to=lambda formats: "peft" in formats)) == ["lora"]
    assert kept(methods_where(exports_to=lambda formats: "adapters" in formats)) == [
        "prefix-tuning", "houlsby-adapter", "compacter", "mam-adapter"
    ]  # fmt: skip
    assert kept(methods_where(ablation_of="inducer")) == ["inducer-adaptive", "inducer-extension", "inducer-gating"]


def test_every_record_is_in_one_family_with_one_representative():
    assert all(m.family in FAMILIES for m in METHODS.values())
    assert all(len(methods_where(family=f, representative=True)) == 1 for f in FAMILIES)
    # the family's representative trains like it: the same task, and a frozen backbone if any of them has one
    for family in FAMILIES:
        members = [METHODS[n] for n in methods_where(family=family)]
        chosen = METHODS[representative(family)]
        assert chosen.frozen_backbone == any(m.frozen_backbone for m in members), family


def test_a_record_that_claims_too_much_is_refused_at_registration(monkeypatch):
    from dataclasses import replace

    from fairseq_idpg.methods import register

    monkeypatch.setattr("fairseq_idpg.methods.METHODS", dict(METHODS))
    for wrong, why in (
        (dict(family="nope"), "family 'nope'"),
        (dict(representative=True), "a second representative of 'lora'"),
        (dict(exports_to=("onnx",)), "exports_to"),
        (dict(ablation_of="nope"), "ablation_of 'nope'"),
    ):
        with pytest.raises(ValueError, match=why):
            register(replace(METHODS["lora"], name="lora-2", **wrong))


def fake_run(name):
    """What the interop checks read of a trained run of record ``name``: its options and block configs."""
    method = METHODS[name]
    options = {"arch": method.arch, **method.preset, **method.options}
    configs = list(method_blocks(name).values()) if method.arch == "roberta_blocks" else None
    model = SimpleNamespace(block_configs=configs) if configs is not None else SimpleNamespace()
    return SimpleNamespace(options=options, model=model)


def accepted(check, run):
    try:
        check(run)
    except peft_format.NotExpressible:
        return False
    return True


@pytest.mark.parametrize("name", METHODS)
def test_the_records_capabilities_are_what_the_code_does(name):
    method = METHODS[name]
    run = fake_run(name)
    assert set(method.exports_to) <= set(EXPORT_FORMATS)
    assert accepted(peft_format.check_exportable, run) == ("peft" in method.exports_to)
    assert accepted(adapters_format.export_plan, run) == ("adapters" in method.exports_to)
    # what exports to PEFT has a PEFT counterpart (the converse does not hold: PEFT's prompt and prefix tuning
    # are other functions of the prompt, peft_format's docstring)
    assert "peft" not in method.exports_to or method.peft_counterpart
    # merging: the record's blocks are all mergeable, and the merge check takes exactly such a run
    assert method.merges_into_backbone == (bool(method.blocks) and set(method.blocks) <= set(merge.MERGEABLE))
    try:
        merge.check_mergeable(run)
        merges = True
    except merge.ConfigError:
        merges = False
    assert merges == method.merges_into_backbone
    assert method.blocks == (tuple(method_blocks(name)) if method.arch == "roberta_blocks" else ())
    # a method that merges or exports trains a frozen backbone's own blocks, and an ablation is of its family
    assert method.frozen_backbone or not (method.exports_to or method.merges_into_backbone)
    assert not method.ablation_of or METHODS[method.ablation_of].family == method.family
