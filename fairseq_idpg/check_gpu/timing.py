"""Seconds per training step of our methods against Hugging Face PEFT, in one process, on one device.

Both sides get the same frozen weights (the fairseq checkpoint, mapped onto
``RobertaForSequenceClassification`` by ``hf_roberta``), the same batch [batch, tokens] of random
words, the same precision (the whole model cast to fp16 / bf16, as fairseq's ``--fp16`` / ``--bf16``
cast it) and the same loop: forward, fp32 cross-entropy, backward, ``torch.optim.Adam`` on the
trained parameters. fairseq's trainer (fp32 master weights, logging) is not in this loop: its own
seconds per update are the training runs' (``training.py``).

    ours                         PEFT
    lora (r 16, alpha 32, q,v)   LoraConfig(r=16, lora_alpha=32, target_modules=["query", "value"])
    prompt-tuning-5              PromptTuningConfig(num_virtual_tokens=5)
    prefix-tuning (l 32, MLP)    PrefixTuningConfig(num_virtual_tokens=32, prefix_projection=True)
    m-idpg-phm                   (against prompt-tuning-5: IDPG's cost over static prompts, M(x) cached)
    finetune                     RobertaForSequenceClassification, every weight trained (no goal: the
                                 encoders' own cost, without a method)

Timed: CUDA wall time (synchronised) on a GPU; on the CPU the process's CPU time with one torch thread
(the machine may be shared), the wall time printed beside it.
"""

import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

from fairseq_idpg.methods import METHODS, methods_where

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SAME_WEIGHTS_ATOL = 1e-3  # fp32 logits of the same encoder in fairseq and in transformers
# PEFT's method -> ours of the same kind (the records' peft_counterpart; ``peft_model`` configures each as ours)
PEFT_PAIRS = {METHODS[name].peft_counterpart: name for name in methods_where(peft_counterpart=bool)}
GOALS = {"peft": 1.0, "m-idpg-phm": 1.10}  # issue 22: ours/PEFT <= 1.0, M-IDPG-PHM <= 1.10 x prompt tuning


@dataclass
class StepTime:
    name: str  # "step:lora", "peft:lora", ...
    precision: str
    seconds: float  # the device's figure (module docstring)
    wall: float
    trained: int  # trained parameters (classification head included)


# ---------------------------------------------------------------------------------------- the models
def load_backbone(model_dir):
    """(fairseq state dict of model.pt, the sizes as build options, the dictionary as the task makes it)."""
    from fairseq.data import Dictionary

    from fairseq_idpg.run import model_dims

    state = torch.load(model_dir / "model.pt", map_location="cpu", weights_only=False)["model"]
    dims = model_dims(model_dir / "model.pt")
    sizes = {flag[2:].replace("-", "_"): value for flag, value in dims.items() if flag != "--max-positions"}
    dictionary = Dictionary.load(str(model_dir / "dict.txt"))
    dictionary.add_symbol("<mask>")  # as the task does
    return state, sizes, dictionary


def ours(model_dir, name, sizes, dictionary, **options):
    """The model of method record ``name`` as fairseq-train builds it, with a 2-class head "head"."""
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.models.build import build_method

    model = build_method(METHODS[name], dictionary, backbone=str(model_dir / "model.pt"), **sizes, **options)
    model.register_classification_head("head", num_classes=2)
    return model


def hf_roberta(state, sizes, head=None, dropout=0.1):
    """``RobertaForSequenceClassification`` holding the fairseq RoBERTa encoder ``state``
    (``encoder.sentence_encoder.*``; the inverse of ``conversion/weights.map_weights`` for RoBERTa) and,
    given, a fairseq classification head's ``dense`` / ``out_proj`` (``head``: its key prefix)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from fairseq_idpg.interop.hf_backbone import hf_roberta_weights

    enc = "encoder.sentence_encoder."
    words, positions = state[enc + "embed_tokens.weight"], state[enc + "embed_positions.weight"]
    config = RobertaConfig(
        vocab_size=words.shape[0], hidden_size=sizes["encoder_embed_dim"],
        num_hidden_layers=sizes["encoder_layers"], num_attention_heads=sizes["encoder_attention_heads"],
        intermediate_size=sizes["encoder_ffn_embed_dim"], max_position_embeddings=positions.shape[0],
        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, num_labels=2,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    model = RobertaForSequenceClassification(config)
    mapped = hf_roberta_weights(state, sizes["encoder_layers"])
    if head is not None:
        for part in ("dense", "out_proj"):
            for kind in ("weight", "bias"):
                mapped[f"classifier.{part}.{kind}"] = head[f"{part}.{kind}"]
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    left = [k for k in missing if not k.startswith("classifier.") or head is not None]
    if left or unexpected:
        raise RuntimeError(f"fairseq -> transformers mapping left {left[:3]} unfilled, {unexpected[:3]} unknown")
    return model


def peft_model(base, kind):
    """``get_peft_model`` of ``base`` for ``kind`` (lora, dora, pissa, vera, prompt-tuning, prefix-tuning), configured
    as our record; raises what PEFT raises (its prefix tuning refuses RoBERTa under transformers 5)."""
    from peft import LoraConfig, PrefixTuningConfig, PromptTuningConfig, TaskType, VeraConfig, get_peft_model

    lora = dict(task_type=TaskType.SEQ_CLS, r=16, lora_alpha=32, lora_dropout=0.1, target_modules=["query", "value"])
    configs = {
        "lora": lambda: LoraConfig(**lora),
        "dora": lambda: LoraConfig(**lora, use_dora=True),
        "pissa": lambda: LoraConfig(**lora, init_lora_weights="pissa"),
        "vera": lambda: VeraConfig(task_type=TaskType.SEQ_CLS, r=256, target_modules=["query", "value"]),
        "prompt-tuning": lambda: PromptTuningConfig(task_type=TaskType.SEQ_CLS, num_virtual_tokens=5),
        "prefix-tuning": lambda: PrefixTuningConfig(
            task_type=TaskType.SEQ_CLS, num_virtual_tokens=32, prefix_projection=True, encoder_hidden_size=800
        ),
    }
    return get_peft_model(base, configs[kind]())


def same_weights_gap(model_dir, state, sizes, dictionary, tokens):
    """Largest |logit difference| of a fp32 fairseq model of ours on the frozen backbone (BitFit: at its start
    the backbone's own function) and ``hf_roberta`` of the same weights and head, in eval mode: the two
    sides of the comparison compute the same function."""
    fs = ours(model_dir, "bitfit", sizes, dictionary).eval()
    head = {k.split("classification_heads.head.")[1]: v for k, v in fs.state_dict().items() if ".head." in k}
    hf = hf_roberta(state, sizes, head).eval()
    with torch.no_grad():
        a = fs(tokens, classification_head_name="head")[0]
        b = hf(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------------------------- the loop
def time_steps(forward: Callable, params, labels, steps, warmup, repeats=1):
    """(device seconds, wall seconds) per step of forward / fp32 cross-entropy / backward / Adam: the
    fastest of ``repeats`` runs of ``steps`` steps (the least disturbed by the rest of the machine;
    single runs of 10 steps varied by 30% between two calls on one H200)."""
    optimizer = torch.optim.Adam(params, lr=1e-4)
    cuda = labels.is_cuda

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward().float(), labels)
        loss.backward()
        optimizer.step()

    return fastest(step, steps, warmup, repeats, cuda)


def fastest(step: Callable, steps, warmup, repeats, cuda):
    """(device seconds, wall seconds) per call of ``step``: the fastest of ``repeats`` runs of ``steps`` calls after
    ``warmup`` calls; the device's figure is the synchronised wall time on a GPU, the process's CPU time on the CPU
    (the machine may be shared)."""
    for _ in range(warmup):
        step()
    best = None
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall, cpu = (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps
        this = ((wall if cuda else cpu), wall)
        best = this if best is None or this[0] < best[0] else best
    return best


def trained_params(model):
    return [p for p in model.parameters() if p.requires_grad]


def sample_batch(dictionary, batch_size, tokens, device):
    """(tokens [batch_size, tokens]: ``<s>`` random words of ``dictionary`` ``</s>``, 2-class labels), seeded: the
    batch every timed loop of one comparison gets."""
    g = torch.Generator().manual_seed(0)
    words = torch.randint(dictionary.nspecial, len(dictionary) - 1, (batch_size, tokens - 2), generator=g)
    batch = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), words, torch.full((batch_size, 1), 2)], 1)
    labels = torch.randint(0, 2, (batch_size,), generator=g)
    return batch.to(device), labels.to(device)


def compare(model_dir, device, precisions, batch_size, tokens, steps=20, warmup=5, repeats=3, log=print):
    """Time every pair of the module docstring at each precision; returns (StepTime list, skipped:
    {name: reason})."""
    state, sizes, dictionary = load_backbone(model_dir)
    batch, labels = sample_batch(dictionary, batch_size, tokens, device)
    mask = torch.ones_like(batch)
    sentence_ids = torch.arange(batch_size, device=device)  # slot 0 (the attached M(x) cache), rows 0..B-1
    times, skipped = [], {}

    def measure(name, precision, build, forward):
        model = build().to(device=device, dtype=DTYPES[precision]).train()
        params = trained_params(model)
        seconds, wall = time_steps(lambda: forward(model), params, labels, steps, warmup, repeats)
        times.append(StepTime(name, precision, seconds, wall, sum(p.numel() for p in params)))
        log(f"    {name:24} {precision}: {seconds * 1000:9.2f} ms/step (wall {wall * 1000:.2f} ms)", flush=True)

    def idpg():
        model = ours(model_dir, "m-idpg-phm", sizes, dictionary, idpg_cache="memory")
        model.attach_sentence_cache(0, {"split": "train", "synthetic": True}, range(batch_size))
        return model

    fairseq_forward = lambda m: m(batch, classification_head_name="head")[0]  # noqa: E731
    hf_forward = lambda m: m(input_ids=batch, attention_mask=mask).logits  # noqa: E731
    for precision in precisions:
        for kind, record in PEFT_PAIRS.items():
            measure(f"step:{record}", precision, partial(ours, model_dir, record, sizes, dictionary), fairseq_forward)
            try:
                peft = peft_model(hf_roberta(state, sizes), kind)
                with torch.no_grad():  # PEFT refuses some models only at the first forward
                    peft(input_ids=batch[:1].cpu(), attention_mask=mask[:1].cpu())
            except Exception as e:  # noqa: BLE001  (PEFT's own refusal is the finding)
                skipped[f"peft:{kind}"] = f"{type(e).__name__}: {e}"
                continue
            measure(f"peft:{kind}", precision, lambda model=peft: model, hf_forward)
        measure("step:m-idpg-phm", precision, idpg, lambda m: m(batch, classification_head_name="head",
                                                                  sentence_ids=sentence_ids)[0])  # fmt: skip
        # the backbones alone, every weight trained: separates the encoders' own cost (fairseq's against
        # transformers') from what a method adds
        measure("step:finetune", precision, lambda: ours(model_dir, "finetune", sizes, dictionary), fairseq_forward)
        measure("hf:finetune", precision, lambda: hf_roberta(state, sizes), hf_forward)
    return times, skipped


def ratios(times: List[StepTime]):
    """[(label, ratio, goal)]: ours/PEFT per method, fairseq/transformers without a method (goal None) and
    M-IDPG-PHM / prompt tuning, per precision."""
    by = {(t.name, t.precision): t.seconds for t in times}
    out = []
    for (name, precision), seconds in by.items():
        if name.startswith("peft:"):
            mine = by.get((f"step:{PEFT_PAIRS[name[len('peft:') :]]}", precision))
            if mine is not None:
                out.append((f"{precision} {name[len('peft:') :]}: ours / PEFT", mine / seconds, GOALS["peft"]))
    for precision in sorted({p for _, p in by}):
        mine, theirs = by.get(("step:finetune", precision)), by.get(("hf:finetune", precision))
        if mine is not None and theirs is not None:
            out.append((f"{precision} full fine-tuning: fairseq / transformers", mine / theirs, None))
        idpg, prompt = by.get(("step:m-idpg-phm", precision)), by.get(("step:prompt-tuning-5", precision))
        if idpg is not None and prompt is not None:
            out.append((f"{precision} m-idpg-phm / prompt-tuning-5", idpg / prompt, GOALS["m-idpg-phm"]))
    return out


def device_name(device) -> Optional[str]:
    if device.type == "cuda":
        n = torch.cuda.device_count()
        return f"{torch.cuda.get_device_name(device)}" + (f" x {n}" if n > 1 else "")
    return None


def trainer_step_times(model, batch, labels, precision, record, steps=10, warmup=3, repeats=3, output_dir=None):
    """(device seconds, wall seconds, the precision the Trainer ran) per ``transformers.Trainer`` update of
    ``model`` (a PEFT model of ``peft_model``) on the fixed ``batch`` / ``labels``, trained as Hugging Face
    users train it: ``trainer.train()`` with ``max_steps`` = warm-up + ``repeats`` x ``steps``, AdamW
    (``adamw_torch``), record ``record``'s recipe lr, weight decay, clipping (``max_grad_norm``; 0: none) and
    schedule (polynomial decay -> ``linear``, fixed -> ``constant``, its warm-up ratio), fp16 / bf16 as
    ``TrainingArguments`` mixed precision (autocast over fp32 weights, fp16 with its grad scaler), a log line
    every step (``logging_steps=1``: the loss read back, as fairseq logs every update).

    One update is timed by a ``TrainerCallback`` from ``on_step_begin`` (before ``training_step``) to the
    ``on_log`` that follows its ``on_step_end`` (after clipping, the optimizer and scheduler steps,
    ``zero_grad`` and the log): all the Trainer does per update but fetching the next batch (an
    ``IterableDataset`` repeating the rows of ``batch``, so every update gets exactly that batch; data loading
    aside). Synchronised on CUDA; on the CPU the process's CPU time. The fastest mean of ``repeats`` windows of
    ``steps`` updates after ``warmup`` updates. A precision the Trainer refuses on this device (fp16 on the
    CPU) runs in fp32, and the third value says so."""
    import contextlib
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments

    recipe = METHODS[record].recipe
    cuda = batch.is_cuda
    rows = [
        {"input_ids": batch[i].cpu(), "attention_mask": torch.ones_like(batch[i]).cpu(), "labels": labels[i].cpu()}
        for i in range(batch.shape[0])
    ]

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                yield from rows

    class Clock(TrainerCallback):
        def __init__(self):
            self.begun, self.times = None, []

        def _now(self):
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter(), time.process_time()

        def on_step_begin(self, args, state, control, **kwargs):
            self.begun = self._now()

        def on_log(self, args, state, control, **kwargs):
            if self.begun is not None:  # not the summary logged after the last update
                wall, cpu = self._now()
                self.times.append((wall - self.begun[0], cpu - self.begun[1]))
                self.begun = None

    def arguments(folder, ran):
        return TrainingArguments(
            output_dir=folder, max_steps=warmup + repeats * steps, per_device_train_batch_size=batch.shape[0],
            learning_rate=recipe.lr, weight_decay=recipe.weight_decay, max_grad_norm=recipe.clip_norm,
            optim="adamw_torch", warmup_ratio=recipe.warmup,
            lr_scheduler_type="constant" if recipe.scheduler == "fixed" else "linear",
            fp16=ran == "fp16", bf16=ran == "bf16", use_cpu=not cuda, logging_steps=1, logging_strategy="steps",
            save_strategy="no", report_to="none", disable_tqdm=True, dataloader_pin_memory=False,
            dataloader_num_workers=0, seed=0,
        )  # fmt: skip

    with tempfile.TemporaryDirectory() if output_dir is None else contextlib.nullcontext(output_dir) as folder:
        ran = precision
        try:
            args = arguments(folder, ran)
        except ValueError:  # the Trainer refuses this precision on this device
            ran = "fp32"
            args = arguments(folder, ran)
        clock = Clock()
        trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[clock])
        trainer.train()
    timed = clock.times[warmup:]
    windows = [timed[i * steps : (i + 1) * steps] for i in range(repeats)]
    best = min(windows, key=lambda w: sum(c if not cuda else s for s, c in w))
    wall = sum(s for s, _ in best) / len(best)
    return (wall if cuda else sum(c for _, c in best) / len(best)), wall, ran
