"""Where training starts: every trained tensor of our methods against the initial law its reference really
trains from (scripts/init_laws.py; the references' laws, measured on their whole models as their training entry
points build them, are committed in tests/data/init_laws/, one JSON per reference with its provenance).

The law tests need no network and no checkout: they build our methods at the fixture's sizes and compare each
tensor's law (its family, std and mean within sampling tolerance for the tensor's size, the bound of a bounded
law, or exact constants) with the fixture's, expecting agreement wherever the script's ``DECISIONS`` does not
record a difference we keep. The last test runs the script end to end where the checkouts are at
$KERNEL_ADAPTERS, $DPT_AUTHORS, $IDPG_AUTHORS (or /tmp/kernel-adapters, /tmp/dpt-authors, /tmp/idpg-authors)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "init_laws.py"
FIXTURES = REPO / "tests" / "data" / "init_laws"
REFERENCES = ("kernel-adapters", "dpt", "idpg-authors", "peft", "adapters")


def _script():
    spec = importlib.util.spec_from_file_location("init_laws", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


laws = _script()
_OURS = {}


def ours(method):
    if method not in _OURS:
        _OURS[method] = {row: laws.law(t) for row, t in laws.build_ours(method).items()}
    return _OURS[method]


def fixture(reference):
    return json.loads((FIXTURES / f"{reference}.json").read_text())


def test_every_reference_has_its_fixture_with_provenance():
    for reference in REFERENCES:
        record = fixture(reference)
        source = record["provenance"]
        assert ("commit" in source and len(source["commit"]) == 40) or "package" in source, reference
        assert "scripts/init_laws.py" in source["command"] and source["sizes"] == laws.SIZES
        assert record["laws"], reference


@pytest.mark.parametrize("reference", REFERENCES)
def test_our_trained_tensors_start_as_the_reference_does(reference):
    """Each trained tensor's law against the reference's effective one: the same law unless DECISIONS keeps a
    difference (then it must still differ: a decision that no longer holds is stale)."""
    mismatches = []
    for key, theirs in fixture(reference)["laws"].items():
        method, row = key.split("/")
        base = method.split(" (")[0]
        mine = ours(base)[row]
        expected, _ = laws.DECISIONS.get((reference, base, row), ("same", ""))
        if laws.laws_agree(mine, theirs) != (expected == "same"):
            mismatches.append(f"{key}: reference {theirs['law']} (std {theirs['std']:.3g}), ours {mine['law']} "
                              f"(std {mine['std']:.3g}), expected {expected}")  # fmt: skip
    assert not mismatches, "\n".join(mismatches)


def test_the_law_check_tells_the_laws_apart():
    """The comparison itself: draws of one law agree, a 2x scale, another family or a lost zero do not."""
    torch.manual_seed(0)
    a, b = laws.law(torch.randn(3000) * 0.02), laws.law(torch.randn(3000) * 0.02)
    assert laws.laws_agree(a, b) and a["law"].startswith("N(0, 0.02")
    assert not laws.laws_agree(laws.law(torch.randn(3000) * 0.04), b)
    assert not laws.laws_agree(laws.law(torch.empty(3000).uniform_(-0.035, 0.035)), b)
    folded = laws.law(torch.fmod(torch.randn(3000), 2) * 0.01)
    assert "folded" in folded["law"] and not laws.laws_agree(folded, laws.law(torch.randn(3000) * 0.0088))
    assert laws.laws_agree(laws.law(torch.zeros(16)), laws.law(torch.zeros(64)))
    assert not laws.laws_agree(laws.law(torch.randn(64) * 1e-3), laws.law(torch.zeros(64)))
    assert laws.law(torch.ones(8))["law"] == "ones"


def test_the_original_adapter_starts_stay_an_option():
    """--adapter-init original: Houlsby et al.'s N(0, 1e-2) folded at 2 std, Compacter's own config (A N(0, 0.01^2),
    s, t Glorot-uniform, biases 0); the default is where the IDPG authors' model starts."""
    from fairseq_idpg.blocks.adapter import AdapterConfig

    assert AdapterConfig().adapter_init == "idpg-authors"
    houlsby = laws.OURS["houlsby-adapter"]
    laws.OURS["houlsby-adapter"] = ({"adapter_init": "original"}, houlsby[1])
    compacter = laws.OURS["compacter"]
    laws.OURS["compacter"] = ({"adapter_init": "original"}, compacter[1])
    try:
        h = {row: laws.law(t) for row, t in laws.build_ours("houlsby-adapter").items()}
        c = {row: laws.law(t) for row, t in laws.build_ours("compacter").items()}
    finally:
        laws.OURS["houlsby-adapter"], laws.OURS["compacter"] = houlsby, compacter
    assert "folded" in h["down.weight"]["law"] and abs(max(-h["up.weight"]["min"], h["up.weight"]["max"]) - 0.02) < 1e-3
    assert h["down.bias"]["law"] == h["up.bias"]["law"] == "zero"
    assert c["down.bias"]["law"] == c["up.bias"]["law"] == "zero" and abs(c["A"]["std"] - 0.01) < 0.003
    # Glorot-uniform per Kronecker term of s [d/n, 1]: bound sqrt(6 / (d/n + 1)) = sqrt(6 / 17) at d = 64, n = 4
    assert c["down.s"]["law"].startswith("U(") and abs(c["down.s"]["max"] - (6 / 17) ** 0.5) < 0.05


def test_a_changed_start_is_a_new_run_folder_and_the_other_records_keep_theirs():
    """The adapter records' settings name their start (adapter_init), so their runs get new folders; every other
    record of the blocks family keeps the settings its runs were named with."""
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.run.identity import model_settings, settings_before_hashing

    before = settings_before_hashing()
    for name in ("houlsby-adapter", "compacter"):
        settings = model_settings(METHODS[name])
        assert settings["adapter_init"] == "idpg-authors" and settings != before[name]
    others = [n for n, m in METHODS.items() if m.arch == "roberta_blocks" and n in before]
    others = [n for n in others if n not in ("houlsby-adapter", "compacter")]
    assert others and all(model_settings(METHODS[n]) == before[n] for n in others)


def _checkout(variable, default, marker):
    path = Path(os.environ.get(variable, default))
    return path if (path / marker).is_file() else None


CHECKOUTS = {
    "--kernel-adapters": _checkout("KERNEL_ADAPTERS", "/tmp/kernel-adapters", "nlu/models/roberta/modeling_roberta.py"),
    "--dpt-authors": _checkout("DPT_AUTHORS", "/tmp/dpt-authors", "modeling_t5.py"),
    "--idpg-authors": _checkout("IDPG_AUTHORS", "/tmp/idpg-authors", "fairseq/modules/transformer_sentence_encoder.py"),
}


@pytest.mark.skipif(
    not all(CHECKOUTS.values()),
    reason="needs the checkouts of kernel-adapters, DPT and IDPG (at $KERNEL_ADAPTERS, $DPT_AUTHORS, $IDPG_AUTHORS)",
)
def test_script_end_to_end_against_the_checkouts(tmp_path):
    args = [str(a) for flag, path in CHECKOUTS.items() for a in (flag, path)]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--save-fixture", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "UNEXPECTED" not in out.stdout
    for reference in REFERENCES:
        written, committed = (json.loads((d / f"{reference}.json").read_text()) for d in (tmp_path, FIXTURES))
        assert written["laws"].keys() == committed["laws"].keys(), reference
        assert written["provenance"]["commit" if "commit" in committed["provenance"] else "package"] == (
            committed["provenance"].get("commit") or committed["provenance"]["package"]
        )
