"""Run-like checkpoints for the multi-task tests (test_multitask.py, test_serve.py) on a tiny backbone, built
directly from tiny models rather than trained (fast; ``fairseq_idpg.hub.synthetic``). No tests here.

    runs = write_runs(tmp / "work", tiny4, {"mnli-lora": ("lora", "mnli"), ...})   # {task: run folder}
"""

from conftest import files_taken

from fairseq_idpg.hub.synthetic import write_data
from fairseq_idpg.hub.synthetic import write_run as write_synthetic_run
from fairseq_idpg.methods import get_method

# the tests' data sets: their label names (None: regression) and whether they read sentence pairs
LABELS = {
    "sst2": ["0", "1"],
    "rte": ["entailment", "not_entailment"],
    "mnli": ["contradiction", "entailment", "neutral"],
}
PAIR = {"sst2": False, "rte": True, "mnli": True, "stsb": True}


def write_run(save, method, data, backbone, seed, files=None):
    """A run of ``method`` on ``data`` and the tiny ``backbone`` (a TinyBackbone); ``files``: option name -> file,
    each given to the models that take it (``method_files``' GloVe vectors)."""
    vocab = backbone.folder / "vocab.txt"
    options = files_taken(get_method(method), files or {})
    sizes = backbone.sizes
    return write_synthetic_run(save, method, data, backbone.model_file, seed, sizes, vocab, model_options=options)


def write_runs(root, backbone, tasks, files=None):
    """{task: run folder} under ``root`` for ``tasks`` {name: (method record, data set)}, task i with seed i."""
    dictionary = backbone.folder / "dict.txt"
    data = {d: write_data(root / "data" / d, dictionary, LABELS.get(d), PAIR[d], name=d.upper()) for d in PAIR}
    return {
        name: write_run(root / "runs" / name, method, data[d], backbone, seed=i, files=files)
        for i, (name, (method, d)) in enumerate(tasks.items())
    }
