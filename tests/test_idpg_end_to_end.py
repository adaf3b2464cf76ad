"""M-IDPG-PHM end to end as a user runs it: scripts/run.sh (prepare -> fairseq-train ->
fairseq-validate) on a slice of the real RTE files with the offline stand-in (all-MiniLM-L6-v2
converted to fairseq RoBERTa format, standing in for roberta.large), then ``from_pretrained``
predicting from the compact checkpoint. The job's main (what scripts/run.sh execs) runs in this process, on the
slice prepared in this process where run.sh prepares it (its task.json records the same files, so run.sh uses it):
two interpreter starts fewer (run.sh itself and its preparation are run by tests/test_end_to_end.py's SST-2
learning run). Slow; CI runs it."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import STANDIN

from fairseq_idpg.layout import data_folder
from fairseq_idpg.logs import validations
from fairseq_idpg.preprocessing import prepare
from fairseq_idpg.run import find_runs, main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_m_idpg_phm_trains_scores_and_predicts(shared_data, standin_model, tmp_path, capfd):
    raw = tmp_path / "RTE"
    raw.mkdir()
    for name, rows in (("train.tsv", 64), ("dev.tsv", 40)):
        lines = (shared_data / "glue" / "RTE" / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    # prepared in this process where run.sh prepares it (the same files: run.sh uses it, no prepare_data.py start)
    data = data_folder(tmp_path, "standin", "RTE")
    prepare("RTE", str(raw), str(data), bpe="wordpiece", vocab=str(STANDIN / "vocab.txt"), workers=1)
    cache = tmp_path / "mx-cache"
    argv = [
        "RTE",
        "--raw",
        str(raw),
        "--method",
        "m-idpg-phm",
        "--work-dir",
        str(tmp_path),
        "--max-update",
        "4",
        "--total-batch",
        "8",
        "--validate-interval-updates",
        "4",
        "--idpg-cache-dir",
        str(cache),
    ]
    capfd.readouterr()
    code = main(argv)
    stdout, stderr = capfd.readouterr()
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    (save,) = find_runs(tmp_path, "standin", "RTE", "m-idpg-phm")
    results = json.loads((save / "results.json").read_text())
    assert "valid: " in stdout and "prepare_data.py" not in stdout
    # where M(x) is cached is how, not what, the model computes: fairseq-train gets it, the run's identity does not
    assert "--idpg-cache-dir" not in results["config"]["extra_args"]
    assert f"--idpg-cache-dir {cache}" in (save / "train.log").read_text()
    # fairseq-validate of the compact checkpoint (rebuilt on the frozen stand-in, M(x) from the cache) gives
    # exactly the accuracy fairseq-train's validation printed for the model it saved
    trained = [e.stats["accuracy"] for e in validations((save / "train.log").read_text())]
    assert trained == [results["score"]]

    state = torch.load(save / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert not any(k.startswith("encoder.") for k in state["model"])  # generator + head + fingerprint
    n, m, t, d, L = 16, 16, 5, 384, 6  # M-IDPG-PHM on the 6 x 384 stand-in (IDPG appendix A.1.2's formula)
    expected = 2 * n**3 + (d * m + m * t * d) // n + m + L * t * d
    assert sum(v.numel() for k, v in state["model"].items() if k.startswith("generator.")) == expected
    # M(x) of the 40 dev and 32 seen train examples: computed once, on disk
    filled = sorted(int(np.load(f / "filled.npy").sum()) for f in cache.iterdir())
    assert filled == [32, 40]

    from fairseq.models.roberta import RobertaModel

    hub = RobertaModel.from_pretrained(
        str(save),
        "checkpoint_best.pt",
        data_name_or_path=str(tmp_path / "data-bin" / "standin" / "RTE"),
        user_dir=str(REPO / "fairseq_idpg"),
        bpe="wordpiece",
        wordpiece_vocab=str(STANDIN / "vocab.txt"),
    )
    hub.eval()
    tokens = hub.encode("A cat sat on the mat.", "A cat is sitting.")
    logprobs = hub.predict("sentence_classification_head", tokens)
    assert logprobs.shape == (1, 2) and torch.allclose(logprobs.exp().sum(), torch.tensor(1.0))
