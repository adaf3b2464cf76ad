"""docs/recipes.md is generated from the method records and must not go stale; the records hold
each paper's recipe (numbers checked against the papers' stated settings)."""

import subprocess
import sys
from pathlib import Path

from fairseq_idpg.methods import METHODS

REPO = Path(__file__).resolve().parents[1]


def test_recipe_doc_is_current():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "recipe_table.py"), "--check"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_each_family_carries_its_papers_recipe():
    inducer = METHODS["inducer-lora"].recipe.for_task("MNLI")  # inducer-tuning appendix B.2
    assert (inducer.lr, inducer.batch, inducer.epochs, inducer.warmup, inducer.clip_norm) == (2e-4, 16, 10, 0.06, 1.0)
    assert inducer.select_on == "valid1" and inducer.num_updates(392702) == 10 * 24544
    idpg = METHODS["m-idpg-phm"].recipe  # IDPG Table 4: fixed lr, batch 16 x 50 epochs, 32 x 10 on large tasks
    assert (idpg.scheduler, idpg.lr_grid, idpg.for_task("RTE").num_updates(2490)) == (
        "fixed",
        (5e-3, 1e-3, 5e-4, 1e-4),
        7800,
    )
    assert (idpg.for_task("SST-2").batch, idpg.for_task("SST-2").epochs) == (32, 10)
    dpt = METHODS["dpt"].recipe  # DPT: linear decay, 10% warmup, clip 1.0, wd 1e-5, batch 16, 100 epochs
    assert (dpt.warmup, dpt.clip_norm, dpt.weight_decay, dpt.batch, dpt.epochs) == (0.1, 1.0, 1e-5, 16, 100)
    finetune = METHODS["finetune"].recipe.for_task("RTE")  # fairseq's GLUE table
    assert (finetune.lr, finetune.batch, finetune.num_updates(2490)) == (2e-5, 16, 2036)
    for name, method in METHODS.items():
        assert method.recipe.sources.get("lr"), f"{name}: its lr has no source"
