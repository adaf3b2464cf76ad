"""Count the aten operators a callable dispatches: the kernel launches of a training step, counted on the CPU.

On a GPU a small model's training step is bound by kernel launches, and which launches a step makes does not
depend on the device: every aten operator that computes something is (at least) one kernel. So a step's
launches can be counted on the CPU, inside a ``TorchDispatchMode``:

    counts = count_launches(lambda: train_step(model, optimizer, batch))
    counts.total, counts.by_op.most_common(5), counts.by_line.most_common(5)

What is not counted: operators that launch no kernel, namely

- views: every operator whose schema says it returns an alias of an input without writing it
  (``Tensor(a)``: ``view``, ``t``, ``transpose``, ``permute``, ``expand``, ``as_strided``, ``slice``,
  ``select``, ``unsqueeze``, ``squeeze``, ``split``, ``unbind``, ``detach``, ``alias``, ...), read from
  ``op._schema`` so the list cannot go stale;
- ``NO_KERNEL``: ``_unsafe_view`` (a view its schema does not mark), the allocations ``empty*`` (memory, no
  kernel) and ``lift_fresh`` (wraps a tensor literal).

In-place operators (``add_``, ``Tensor(a!)``) are counted: they compute.

Host tensors: a tensor that a GPU run keeps on the host (``on_host``: the optimizer's step counts, a fused
group's gradient norms copied to the host) launches nothing, nor does any operator whose tensor arguments are
all host tensors; what such an operator returns, and ``new_tensor`` of one, is a host tensor too. Moving one
to the device (``.to(device)``) is counted as one launch (the copy).

What the CPU runs differently from CUDA is made to follow CUDA's path (``cuda_like``):

- dropout, which ATen decomposes on the CPU into bernoulli_, div_ and mul but runs on CUDA as one fused
  ``native_dropout`` kernel, is called as ``native_dropout``;
- ``F.scaled_dot_product_attention`` with dropout falls back on the CPU to its unfused math (a dozen
  operators each way), where CUDA runs one fused kernel (efficient or flash attention) forward and one
  backward: it counts as one operator each way (``scaled_dot_product_attention`` and its ``_backward``,
  computed exactly, uncounted inside); under ``torch.func.vmap`` (``fairseq_idpg/fused``) it is counted as
  the CPU runs it, unfused: an overcount;
- ``torch.optim`` should be built with ``foreach=True`` (CUDA's default; the CPU's is a Python loop over
  the tensors).

Each operator is traced to a source line (``by_line``): the innermost frame of the Python stack under one of
``PROJECT_DIRS`` (this project, fairseq, transformers, peft, ``torch.optim``, the scripts and tests), else the
innermost frame outside the dispatch machinery. An operator of the backward pass is traced to
the forward line that made its autograd node (anomaly mode keeps that stack; its NaN check is off, so it
adds no operator) and named ``backward of <line>``.
"""

import contextlib
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode

from fairseq_idpg.host_tensors import is_host, on_host

NO_KERNEL = frozenset(
    {
        "aten::_unsafe_view",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::lift_fresh",
        # the profiler's ranges (torch.optim's steps, fairseq's trainer): host-side markers
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
    }
)
# host syncs: operators that read a device value on the host (``.item()``, ``bool()``, ``float()``: all
# ``_local_scalar_dense``) or whose output's size depends on the values; and tensor methods that copy to the host
HOST_SYNC_OPS = frozenset(
    {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"}
)
HOST_READS = frozenset({"cpu", "tolist", "numpy"})
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace(os.sep, "/") + "/"
# the frames a launch is traced to, innermost first (path fragments, "/" separated)
PROJECT_DIRS = ("/fairseq_idpg/", "/fairseq/", "/transformers/", "/peft/", "/torch/optim/", "/scripts/", "/tests/")
# frames that are the counting itself, never a launch's source
MACHINERY = (
    "/torch/_ops.py",
    "/torch/utils/_python_dispatch.py",
    "/torch/overrides.py",
    "/torch/_dynamo/",
    "/torch/_compile.py",
    __file__,
)


def launches_kernel(op) -> bool:
    """Whether operator overload ``op`` computes (module docstring): not a view, not an allocation."""
    schema = op._schema
    if schema.name in NO_KERNEL:
        return False
    returns = schema.returns
    views = returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
    return not views


def _short(filename, lineno):
    """``fairseq_idpg/modules/x.py:12``: the path from the checkout's or site-packages' root."""
    path = filename.replace(os.sep, "/")
    for root in (REPO, "/site-packages/"):
        if root in path:
            path = path.rsplit(root, 1)[1]
            break
    return f"{path}:{lineno}"


def source_line(frames) -> str:
    """The line a launch is traced to, from ``frames`` [(filename, lineno)], innermost first."""
    frames = [(f, n) for f, n in frames if not any(m in f.replace(os.sep, "/") for m in MACHINERY)]
    for filename, lineno in frames:
        if any(d in filename.replace(os.sep, "/") for d in PROJECT_DIRS):
            return _short(filename, lineno)
    return _short(*frames[0]) if frames else "?"


def _python_frames():
    frame, frames = sys._getframe(2), []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return frames


def _backward_line():
    """The forward line of the autograd node now running (None outside a backward pass)."""
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    stack = node.metadata.get("traceback_")
    if not stack:
        return "backward of ?"
    text = stack if isinstance(stack, str) else "".join(stack)
    frames = _parse_traceback(text)
    return "backward of " + source_line(frames[::-1])


def _parse_traceback(text):
    """[(filename, lineno)], outermost first, of a formatted traceback's ``File "x", line n`` lines."""
    frames = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            name, _, rest = line[len('File "') :].partition('", line ')
            frames.append((name, int(rest.split(",")[0])))
    return frames


@dataclass
class Launches:
    """The operators counted: ``total``, per operator (``aten.mm``) and per source line."""

    by_op: Counter = field(default_factory=Counter)
    by_line: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # views and allocations, not in total
    syncs: Counter = field(default_factory=Counter)  # host syncs per source line (``HOST_SYNC_OPS``, ``HOST_READS``)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    @property
    def host_syncs(self) -> int:
        return sum(self.syncs.values())


_HOST_MAKERS = frozenset({"new_tensor", "new_zeros", "new_ones", "new_full", "new_empty"})


def _tensors(args):
    return [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(t, torch.Tensor)]


class _Counting(TorchDispatchMode):
    def __init__(self, launches, trace, host=()):
        super().__init__()
        self.launches, self.trace = launches, trace
        self.host = {id(t) for t in host}

    def _on_host(self, args):
        """Whether every tensor argument is one a CUDA run keeps on the host (``on_host``, ``host``)."""
        tensors = _tensors(args)
        return bool(tensors) and all(id(t) in self.host or is_host(t) for t in tensors)

    def count(self, name):
        self.launches.by_op[name] += 1
        if self.trace:
            self.launches.by_line[_backward_line() or source_line(_python_frames())] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        host = self._on_host(args)
        if name in HOST_SYNC_OPS and not host:
            self.launches.syncs[source_line(_python_frames())] += 1
        if launches_kernel(func) and not host:
            self.count(name)
        else:
            self.launches.skipped[name] += 1
        out = func(*args, **(kwargs or {}))
        if host and any(is_host(t) for t in _tensors(args)):  # computed from host tensors alone: a host tensor
            for t in _tensors(out if isinstance(out, (list, tuple)) else [out]):
                on_host(t)
        return out


class _HostReads(TorchFunctionMode):
    """Counts the tensor methods that copy a tensor to the host (``HOST_READS``): on the CPU they dispatch
    nothing, on a GPU each waits for the device."""

    def __init__(self, launches):
        super().__init__()
        self.launches = launches

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        host = bool(args) and isinstance(args[0], torch.Tensor) and is_host(args[0])
        if host and name == "to" and _to_device(args[1:], kwargs):
            self.launches.by_op["_to_copy"] += 1  # a host tensor copied to the device: one launch
            self.launches.by_line[source_line(_python_frames())] += 1
        elif not host and (name in HOST_READS or (name == "to" and _to_host(args[1:], kwargs))):
            self.launches.syncs[source_line(_python_frames())] += 1
        out = func(*args, **kwargs)
        if host and name in _HOST_MAKERS:
            on_host(out)
        return out


def _to_device(args, kwargs):
    """Whether ``Tensor.to``'s arguments name a device (a ``torch.device``, a device tensor) other than the CPU by
    name: a host tensor moved there is a copy to the device in a GPU run."""
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, torch.Tensor):
        return not is_host(device)
    return isinstance(device, (torch.device, str)) and not _to_host([device], {})


def _to_host(args, kwargs):
    """Whether ``Tensor.to``'s arguments name the CPU by name (``"cpu"``): a ``torch.device`` is the CPU in a CPU
    count whatever it is in a GPU run (fairseq's ``.to(p.grad.device)``), so it is not counted."""
    device = kwargs.get("device", args[0] if args else None)
    return isinstance(device, str) and torch.device(device).type == "cpu"


class _FusedAttention(torch.autograd.Function):
    """SDPA counted as CUDA's fused kernels: one operator forward, one backward (module docstring). The
    values and gradients are SDPA's own (its graph is kept and differentiated, uncounted)."""

    @staticmethod
    def forward(ctx, counter, attention, kwargs, q, k, v):
        counter.count("scaled_dot_product_attention")
        with _disable_current_modes(), torch.enable_grad():
            inputs = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
            out = attention(*inputs, **kwargs)
        ctx.counter, ctx.inputs, ctx.out = counter, inputs, out
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.counter.count("scaled_dot_product_attention_backward")
        with _disable_current_modes():
            wanted = [t for t in ctx.inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(ctx.out, wanted, grad) if wanted else ())
        return (None, None, None, *(next(grads) if t.requires_grad else None for t in ctx.inputs))


@contextlib.contextmanager
def _cuda_like(counter):
    """Dropout and attention as CUDA runs them (module docstring): ``torch.nn.functional``'s ``dropout`` and
    ``scaled_dot_product_attention`` replaced while counting, under the name every caller reads them by
    (``F.dropout``, and the module's own globals for ``F.multi_head_attention_forward``)."""
    functional = torch.nn.functional
    dropout, attention = functional.dropout, functional.scaled_dot_product_attention

    def fused_dropout(input, p=0.5, training=True, inplace=False):
        if not (training and 0 < p < 1 and input.numel() > 0):
            return dropout(input, p, training, inplace)
        out = torch.native_dropout(input, p, True)[0]
        return input.copy_(out) if inplace else out

    def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        options = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)
        if torch._C._functorch.is_batchedtensor(query):  # under vmap (fused members): counted unfused, an overcount
            return attention(query, key, value, **options)
        if _get_current_dispatch_mode() is None:  # inside an operator the count dispatched (folded attention):
            return attention(query, key, value, **options)  # counted as that operator
        return _FusedAttention.apply(counter, attention, options, query, key, value)

    with mock.patch.object(functional, "dropout", fused_dropout):
        with mock.patch.object(functional, "scaled_dot_product_attention", fused_attention):
            yield


def count_launches(fn, trace=True, cuda_like=True, host=()) -> Launches:
    """The operators ``fn()`` dispatches (module docstring); ``trace``: also per source line (anomaly mode
    keeps the forward stacks for the backward's lines; it does not change the operators). ``host``: tensors
    a CUDA run keeps on the host, whose operators launch nothing (``optimizer_steps``)."""
    launches = Launches()
    anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False) if trace else contextlib.nullcontext()
    counter = _Counting(launches, trace, host)
    cuda = _cuda_like(counter) if cuda_like else contextlib.nullcontext()
    with anomaly, cuda, counter, _HostReads(launches):
        fn()
    return launches


class ThreadsCount:
    """One count over several threads (``fairseq_idpg/fused``: each member's thread, and the fused step):
    ``enter()`` and ``exit()`` in each thread around what it does, sequentially; ``cuda_like()`` (process-wide
    patches) around them all. ``launches``: the sum."""

    def __init__(self, trace=False):
        self.launches, self.trace = Launches(), trace
        self._local = threading.local()

    def enter(self):
        if getattr(self._local, "modes", None) is None:
            modes = [_Counting(self.launches, self.trace), _HostReads(self.launches)]
            for mode in modes:
                mode.__enter__()
            self._local.modes = modes

    def exit(self):
        modes = getattr(self._local, "modes", None)
        if modes is not None:
            for mode in reversed(modes):
                mode.__exit__(None, None, None)
            self._local.modes = None

    def cuda_like(self):
        return _cuda_like(_Counting(self.launches, self.trace))


# ---------------------------------------------------------------------------------------- a training step
def optimizer_steps(optimizer):
    """The optimizer's step counts: host tensors in a CUDA run (``torch.optim``'s default, not capturable)."""
    return [state["step"] for state in optimizer.state.values() if torch.is_tensor(state.get("step"))]


def training_step(forward, params, labels, warmup=2):
    """(step, optimizer): a training step, run ``warmup`` times already: ``forward()`` (logits), fp32
    cross-entropy, backward, ``torch.optim.Adam`` (foreach, as on CUDA) over ``params``, gradients set to None."""
    optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-6, foreach=True)

    def step():
        loss = torch.nn.functional.cross_entropy(forward().float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    return step, optimizer


# ---------------------------------------------------------------------------------------- the models
@dataclass(frozen=True)
class Shape:
    """The encoder and batch a count is made at: tiny widths (the counts do not depend on the width or the
    batch), RoBERTa-large's depth; a quarter of the rows padded to half the length."""

    layers: int = 24
    dim: int = 64
    heads: int = 4
    ffn: int = 128
    vocab: int = 100
    batch: int = 4
    length: int = 32

    def sizes(self, layers=None):
        return dict(
            encoder_layers=layers or self.layers, encoder_embed_dim=self.dim,
            encoder_ffn_embed_dim=self.ffn, encoder_attention_heads=self.heads,
        )  # fmt: skip


# the benchmarks' random backbones (scripts/bench_fused.py, bench_updates.py): the offline stand-in's shape
# (all-MiniLM-L6-v2 in fairseq RoBERTa's format, not RoBERTa: models.build.STANDIN) and RoBERTa's two sizes;
# and their precisions
SIZES = {"standin": dict(layers=6, dim=384, heads=12, ffn=1536), "base": dict(layers=12, dim=768, heads=12, ffn=3072),
         "large": dict(layers=24, dim=1024, heads=16, ffn=4096)}  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def tiny_batch(shape, device="cpu"):
    """(tokens [B, T] from a fairseq dictionary of ``shape.vocab`` symbols, labels [B]), seeded."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, shape.vocab, (shape.batch, shape.length), generator=g)
    tokens[:, 0], tokens[:, -1] = 0, 2
    short = max(1, shape.batch // 4)
    tokens[:short, shape.length // 2 :] = 1  # padding
    tokens[:short, shape.length // 2 - 1] = 2
    return tokens.to(device), torch.randint(0, 2, (shape.batch,), generator=g).to(device)


def _dictionary(shape):
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(shape.vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def ours(name, shape, layers=None, dtype=torch.bfloat16, seed=0, **options):
    """(model, forward) of method record ``name`` at ``shape`` (``layers`` deep), random weights, a 2-class
    head, cast to ``dtype``, in training mode; ``options`` override the record's. IDPG reads M(x) from its cache,
    as from the second epoch on."""
    from fairseq_idpg.methods import get_method
    from fairseq_idpg.models.build import build_method

    method = get_method(name)
    options = {"idpg_cache": "memory", **options} if method.arch == "roberta_idpg" else options
    torch.manual_seed(seed)
    model = build_method(method, _dictionary(shape), **shape.sizes(layers), **options)
    model.register_classification_head("head", num_classes=2)
    model = model.to(dtype).train()
    tokens, _ = tiny_batch(shape)
    extra = {}
    if method.arch == "roberta_idpg":
        rows = [{"net_input.src_tokens": row} for row in tokens]  # what GloVe's M(x) reads; the cache its count
        model.attach_sentence_cache(0, {"split": "train", "synthetic": True}, rows)
        extra["sentence_ids"] = torch.arange(shape.batch)  # slot 0, rows 0..B-1
    return model, lambda: model(tokens, classification_head_name="head", **extra)[0]


def counterpart(name):
    """The PEFT method (or ``"finetune"``: transformers' model, every weight trained) of record ``name``."""
    from fairseq_idpg.methods import get_method

    return "finetune" if name == "finetune" else get_method(name).peft_counterpart


def theirs(name, shape, layers=None, dtype=torch.bfloat16, seed=0):
    """(model, forward) of ``counterpart(name)``: transformers' ``RobertaForSequenceClassification`` of the
    same shape (and weights: the stock fairseq model's of ``seed``), PEFT's method configured as our record
    (``check_gpu.timing.peft_model``); None without a counterpart."""
    from fairseq_idpg.check_gpu.timing import hf_roberta, peft_model

    kind = counterpart(name)
    if not kind:
        return None
    stock, _ = ours("finetune", shape, layers, torch.float32, seed)
    sizes = shape.sizes(layers)
    model = hf_roberta(stock.state_dict(), sizes)
    tokens, _ = tiny_batch(shape)
    mask = tokens.ne(1).long()
    if kind == "prefix-tuning":
        return _peft_prefix(model.to(dtype).train(), tokens, mask)
    if kind != "finetune":
        model = peft_model(model, kind)
    model = model.to(dtype).train()
    return model, lambda: model(input_ids=tokens, attention_mask=mask).logits


def _peft_prefix(hf, tokens, mask):
    """PEFT's prefix tuning (``check_gpu.timing.peft_model``'s configuration) on the encoder, under the
    transformers head: PEFT's sequence-classification wrapper reads a pooled output that
    ``RobertaForSequenceClassification``'s encoder does not return (it fails at the first forward)."""
    from peft import PrefixTuningConfig, TaskType, get_peft_model

    config = PrefixTuningConfig(
        task_type=TaskType.FEATURE_EXTRACTION, num_virtual_tokens=32, prefix_projection=True, encoder_hidden_size=800
    )
    encoder = get_peft_model(hf.roberta, config)
    model = torch.nn.ModuleDict({"encoder": encoder, "classifier": hf.classifier})
    return model, lambda: hf.classifier(encoder(input_ids=tokens, attention_mask=mask).last_hidden_state)


def trained(model):
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def one_thread():
    """One torch thread inside: the same operators, and tiny tensors run several times faster on a busy
    machine, where idle threads spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def model_step_count(build, name, shape, layers, dtype, count):
    """``count(step, optimizer)`` of a warmed-up ``training_step`` of ``build(name, shape, layers, dtype)``
    (``ours`` or ``theirs``) on its tiny batch, on one thread; None where ``build`` gives no model."""
    built = build(name, shape, layers, dtype)
    if built is None:
        return None
    model, forward = built
    _, labels = tiny_batch(shape)
    with one_thread():
        step, optimizer = training_step(forward, trained(model), labels)
        return count(step, optimizer)


def model_launches(build, name, shape, layers=None, dtype=torch.bfloat16, trace=True):
    """The launches of one warmed-up training step of ``build(name, shape, layers, dtype)`` (``model_step_count``)."""
    return model_step_count(
        build, name, shape, layers, dtype,
        lambda step, optimizer: count_launches(step, trace=trace, host=optimizer_steps(optimizer)),
    )  # fmt: skip


@dataclass(frozen=True)
class PerUpdate:
    """Launches per update at ``shape.layers`` and how they grow with depth: ``per_layer`` (from a model half
    as deep) and ``fixed`` (the rest: embeddings, head, loss, optimizer)."""

    total: int
    per_layer: float
    fixed: float
    launches: Launches


def per_update(build, name, shape, dtype=torch.bfloat16, trace=True):
    """``PerUpdate`` of ``build``'s model of ``name`` (None without one)."""
    full = model_launches(build, name, shape, None, dtype, trace)
    if full is None:
        return None
    half = shape.layers // 2
    shallow = model_launches(build, name, shape, half, dtype, trace=False)
    per_layer = (full.total - shallow.total) / (shape.layers - half)
    return PerUpdate(full.total, per_layer, full.total - per_layer * shape.layers, full)


# ---------------------------------------------------------------------------------------- a fairseq-train update
PRECISIONS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def train_folders(shape, folder, batches=4, bpe_dir=None):
    """(backbone folder, data folder) for fairseq-train at ``shape``, written into ``folder`` once: a random
    RoBERTa of the shape (the stand-in's WordPiece vocabulary, or RoBERTa's own dictionary from the GPT-2 BPE
    folder ``bpe_dir``) and synthetic SST-2 sentences of ``shape.length`` tokens (``check_gpu``'s), ``batches``
    batches of training data."""
    from pathlib import Path

    from fairseq_idpg.check_gpu.data import write_synthetic_data
    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    model, data = Path(folder) / "model", Path(folder) / f"data-{batches * shape.batch}x{shape.length}"
    if not (model / "model.pt").exists():
        write_tiny_roberta(model, layers=shape.layers, dim=shape.dim, heads=shape.heads, ffn=shape.ffn, bpe_dir=bpe_dir)
    if not (data / "task.json").exists():
        write_synthetic_data(
            data, model / "dict.txt", train=batches * shape.batch, valid=shape.batch, tokens=shape.length
        )
    return model, data


def train_argv(name, shape, dtype, folder, cpu=True, batches=4, bpe_dir=None):
    """fairseq-train's arguments for record ``name`` as ``scripts/run.sh`` plans them (its recipe's Adam,
    clipping, schedule, logging every update), on the CPU (else the GPU), at ``shape``, in ``dtype``."""
    from fairseq_idpg.check_gpu.training import Setup, fairseq_train_argv, launcher_command

    model, data = train_folders(shape, folder, batches, bpe_dir)
    setup = Setup(model, data, model.parent / "runs", cpu, shape.batch, shape.length, updates=100)
    return fairseq_train_argv(launcher_command(setup, name, PRECISIONS[dtype]), cpu=cpu)


def build_trainer(argv):
    """(trainer, a training sample) as ``fairseq_cli.train.main`` builds them from ``argv``: its task, model,
    criterion and optimizer; the first batch, a quarter of its rows padded to half the length (``tiny_batch``)."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.logging import metrics
    from fairseq.trainer import Trainer

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    metrics.reset()
    metrics.log_start_time("wall", priority=790, round=0)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    epoch_itr = trainer.get_train_iterator(epoch=1, load_dataset=True)
    trainer.lr_step(epoch_itr.epoch)
    trainer.begin_epoch(epoch_itr.epoch)
    sample = next(iter(epoch_itr.next_epoch_itr(shuffle=False)))
    return trainer, _pad_a_quarter(sample, task.source_dictionary)


def _pad_a_quarter(sample, dictionary):
    """``sample`` with a quarter of its rows cut to half the length and padded, as ``tiny_batch``'s."""
    tokens = sample["net_input"]["src_tokens"]
    short, half = max(1, len(tokens) // 4), tokens.size(1) // 2
    tokens[:short, half:] = dictionary.pad()
    tokens[:short, half - 1] = dictionary.eos()
    sample["net_input"]["src_lengths"][:short] = half
    sample["ntokens"] = int(tokens.ne(dictionary.pad()).sum())
    return sample


def fairseq_train_update(trainer, sample):
    """One iteration of ``fairseq_cli.train.train``'s loop: the update, then the log line at the log interval
    (the meters' smoothed values; the line itself is not written)."""
    from fairseq.logging import metrics
    from fairseq_cli.train import get_training_stats

    with metrics.aggregate("train_inner"):
        log_output = trainer.train_step([sample])
    if log_output is not None and trainer.get_num_updates() % trainer.cfg.common.log_interval == 0:
        get_training_stats(metrics.get_smoothed_values("train_inner"))
        metrics.reset_meters("train_inner")


def time_updates(trainer, sample, updates, cuda, warmup=3, repeats=3):
    """Seconds per fairseq-train update (``fairseq_train_update``, ``sample`` reused): ``check_gpu.timing.fastest``'s
    device figure (synchronised wall time on a GPU, the process's CPU time on the CPU)."""
    from fairseq.logging import metrics

    from fairseq_idpg.check_gpu.timing import fastest

    with metrics.aggregate("train"):  # train() runs under it
        return fastest(lambda: fairseq_train_update(trainer, sample), updates, warmup, repeats, cuda)[0]


def update_launches(name, shape, dtype=torch.bfloat16, warmup=2, trace=True, folder=None):
    """The launches (and ``host_syncs``) of one fairseq-train update of record ``name`` after ``warmup``:
    fairseq's ``Trainer`` with the run's task, model, criterion and optimizer (loss scaling, clipping, the
    meters and the log line included), on one thread, the same batch each time (IDPG's first update fills its
    M(x) cache, the next ones read it)."""
    import tempfile

    from fairseq.logging import metrics

    with contextlib.ExitStack() as stack:
        folder = folder or stack.enter_context(tempfile.TemporaryDirectory())
        trainer, sample = build_trainer(train_argv(name, shape, dtype, folder))
        stack.enter_context(one_thread())
        stack.enter_context(metrics.aggregate("train"))  # train() runs under it
        for _ in range(warmup):
            fairseq_train_update(trainer, sample)
        return count_launches(lambda: fairseq_train_update(trainer, sample), trace=trace)


# ---------------------------------------------------------------------------------------- runs trained together
HOST_DATA = ("fairseq/data/", "fairseq_idpg/data/")  # source lines of the data pipeline


def fused_update_launches(name, shape, dtype, k, folder, warmup=3):
    """Launches per member-update of ``k`` runs of record ``name`` trained together (``fairseq_idpg/fused``), the
    same flags and data as ``update_launches``: one round after ``warmup`` rounds (each member's update once, its
    optimizer step and logging, and the one fused forward and backward), counted in every member's thread, divided
    by ``k``. Not counted: the next batch's making (fairseq's datasets and collater run on the host in a GPU run;
    the lone count reuses its batch). Counted though a GPU run keeps them on the host: the fairseq meters' sums
    made in the warm-up rounds (an overcount of a few a member)."""
    from fairseq_idpg.fused.train import train_group
    from fairseq_idpg.member_flags import split_own

    shared, _ = split_own(train_argv(name, shape, dtype, folder))
    shared += ["--max-update", str(warmup + 2), "--validate-interval-updates", "1000", "--disable-validation"]
    members = [
        ["--lr", "1e-4", "--seed", str(s), "--save-dir", os.path.join(folder, f"m{k}", str(s))] for s in range(k)
    ]
    count = ThreadsCount(trace=True)
    with count.cuda_like():
        outcome = train_group(shared, members, count=(warmup, count))
    failed = {i: line for i, line in outcome.items() if line}
    if failed:
        raise RuntimeError(f"fused_update_launches: member failed: {failed}")
    host = sum(n for line, n in count.launches.by_line.items() if line.startswith(HOST_DATA))
    return (count.launches.total - host) / k
