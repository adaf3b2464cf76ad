#!/usr/bin/env python3
"""Training-step time of M-IDPG-PHM against prompt tuning and full fine-tuning, measured in one
process on the same shapes (IDPG section 3.1: M(x) can be cached, so IDPG costs about what prompt
tuning does).

    python scripts/benchmark_idpg.py [--size standin|base|large] [--batch 32] [--seq-len 64]
                                     [--repeats 7] [--threads N] [--device cpu|cuda] [--fp16]

One step = forward, backward and an Adam step, in train mode (dropout on), on random token ids of
the given shape with a 2-class head, for:

- ``prompt-tuning-5``: the method record (``roberta_prompt``, t = 5 input prompts; the backbone is
  frozen but the backward still runs through all its layers, down to the input prompt);
- ``m-idpg-phm, cache``: M(x) read from the sentence-representation cache (the batch's rows were
  filled by a first step, as from epoch 2 on, or from the first epoch of a later run);
- ``m-idpg-phm, no cache``: M(x) computed every step (``--idpg-cache off``: one more frozen forward);
- ``fine-tuning``: the ``finetune`` record, fairseq's RobertaModel with every weight trained.

The models are random (weights do not change the cost) at the sizes of the offline stand-in
(6 x 384, 12 heads, ffn 1536, vocab 30522), roberta-base or roberta-large. Methods are timed
in turns (round robin) and the median of ``--repeats`` rounds is reported, so that the load of a
shared machine falls on all of them alike. Prints the step times and the ratios.
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SIZES = {
    "standin": dict(
        encoder_layers=6, encoder_embed_dim=384, encoder_ffn_embed_dim=1536, encoder_attention_heads=12, vocab=30522
    ),
    "base": dict(
        encoder_layers=12, encoder_embed_dim=768, encoder_ffn_embed_dim=3072, encoder_attention_heads=12, vocab=50265
    ),
    "large": dict(
        encoder_layers=24, encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_attention_heads=16, vocab=50265
    ),
}


KINDS = {  # timed kind -> (method record, options)
    "prompt-tuning-5": ("prompt-tuning-5", {}),
    "m-idpg-phm, cache": ("m-idpg-phm", {"idpg_cache": "memory"}),
    "m-idpg-phm, no cache": ("m-idpg-phm", {"idpg_cache": "off"}),
    "fine-tuning": ("finetune", {}),
}


def build(kind, size, dictionary):
    """The model of the kind's method record at ``size``, random weights, a 2-class head."""
    from fairseq_idpg.methods import get_method
    from fairseq_idpg.models.build import build_method

    method, options = KINDS[kind]
    dims = {k: v for k, v in SIZES[size].items() if k != "vocab"}
    model = build_method(get_method(method), dictionary, **dims, **options)
    model.register_classification_head("head", num_classes=2)
    return model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=SIZES, default="standin")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument(
        "--seq-len", type=int, default=64, help="tokens per example before the prompt (SST-2 ~ 25, RTE ~ 70 on average)"
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--fp16", action="store_true", help="half precision (CUDA)")
    opts = p.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    from fairseq.data import Dictionary

    import fairseq_idpg  # noqa: F401  (registers the model and its task)

    torch.manual_seed(0)
    dictionary = Dictionary()
    for i in range(SIZES[opts.size]["vocab"] - len(dictionary) - 1):  # + <mask> below
        dictionary.add_symbol(f"w{i}")
    dictionary.add_symbol("<mask>")
    device, dtype = torch.device(opts.device), torch.float16 if opts.fp16 else torch.float32
    tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (opts.batch, opts.seq_len))
    tokens[:, 0], tokens[:, -1] = dictionary.bos(), dictionary.eos()
    tokens, target = tokens.to(device), torch.randint(0, 2, (opts.batch,), device=device)
    ids = torch.arange(opts.batch, device=device)  # slot 0, examples 0..B-1

    kinds = list(KINDS)
    runs = {}
    for kind in kinds:
        model = build(kind, opts.size, dictionary).to(device=device, dtype=dtype).train()
        kwargs = {}
        if kind == "m-idpg-phm, cache":
            model.attach_sentence_cache(0, {"split": "benchmark"}, range(opts.batch))
            kwargs = {"sentence_ids": ids}
        optimizer = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=1e-5)
        runs[kind] = (model, optimizer, kwargs)

    def step(kind):
        model, optimizer, kwargs = runs[kind]
        start = time.perf_counter()
        logits, _ = model(tokens, classification_head_name="head", **kwargs)
        F.cross_entropy(logits.float(), target).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    times = {k: [] for k in kinds}
    for r in range(opts.warmup + opts.repeats):
        for kind in kinds:
            t = step(kind)
            if r >= opts.warmup:
                times[kind].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    trained = {k: sum(q.numel() for q in runs[k][0].parameters() if q.requires_grad) for k in kinds}

    print(
        f"size {opts.size} ({SIZES[opts.size]}), batch {opts.batch} x {opts.seq_len} tokens (+5 prompt), "
        f"{opts.device} {dtype}, threads {torch.get_num_threads()}, median of {opts.repeats} rounds"
    )
    for k in kinds:
        print(
            f"  {k:<22} {med[k] * 1000:9.1f} ms/step   (min {min(times[k]) * 1000:.1f}, trained tensors {trained[k]:,})"
        )
    pt, ft = med["prompt-tuning-5"], med["fine-tuning"]
    print("ratios:")
    print(f"  M-IDPG-PHM with cache    / prompt tuning: {med['m-idpg-phm, cache'] / pt:.3f}   (goal <= 1.10)")
    print(f"  M-IDPG-PHM without cache / prompt tuning: {med['m-idpg-phm, no cache'] / pt:.3f}")
    print(f"  M-IDPG-PHM with cache    / fine-tuning:   {med['m-idpg-phm, cache'] / ft:.3f}")
    print(f"  M-IDPG-PHM without cache / fine-tuning:   {med['m-idpg-phm, no cache'] / ft:.3f}")
    print(f"  prompt tuning            / fine-tuning:   {pt / ft:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
