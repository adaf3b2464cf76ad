"""Why long soft prompts do not learn: measurements at initialisation, no training (docs/long-prompts.md).

    python scripts/diagnose_prompts.py DATA_BIN [--backbone models/minilm-l6-fairseq/model.pt] [--n 512]

DATA_BIN is a folder written by ``scripts/prepare_data.py`` (single sentences: ``input0``, ``label``).
For each prompt configuration (preset x ``--prompt-init``) it builds the prompted model on the frozen
backbone and prints, in eval mode (no dropout) unless said otherwise:

- ``|P|``: mean L2 norm of the prompt rows that enter the input (P, or P_0), against the mean norm of
  the ordinary token-embedding rows and of the learned position rows (the prompt is added to the
  positions before fairseq's embedding LayerNorm, which removes each vector's scale, not its direction);
- ``cos``: mean cosine between an example's final ``<s>`` features with the prompt and without it;
- ``spread``: mean distance of the examples' ``<s>`` features from their mean, over the mean's norm
  (how much of ``<s>`` depends on the input at all);
- ``noise``: mean distance between an example's ``<s>`` features in train mode (dropout 0.1 in the
  frozen encoder, as fairseq-train runs it) and in eval mode, over the mean's norm (first 64 train
  examples): when it exceeds ``spread``, dropout noise swamps what the head should read;
- ``probe``: dev accuracy of a logistic regression on the frozen ``<s>`` features of the train split
  (what a head alone can reach before the prompt has learned anything);
- ``|g P|``, ``|g head|``: gradient norms of the cross-entropy of one batch (32 train examples,
  train mode: dropout on, as fairseq-train runs) on the prompt's parameters and on the new
  classification head, and ``g/|P|``: the RMS gradient over the RMS value of the prompt parameters.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq.data import Dictionary, data_utils  # noqa: E402

from fairseq_idpg.models.build import STANDIN, build_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD = "sentence_classification_head"
CONFIGS = [  # (label, preset, extra options)
    ("no prompt", None, {}),
    ("prompt-tuning-5, uniform", "prompt-tuning-5", {}),
    ("prompt-tuning-100, uniform", "prompt-tuning-100", {}),
    ("prompt-tuning-100, vocab", "prompt-tuning-100", {"prompt_init": "vocab"}),
    ("prompt-tuning-100, zero", "prompt-tuning-100", {"prompt_init": "zero"}),
    ("dpt, uniform", "dpt", {}),
    ("dpt, vocab (SVD)", "dpt", {"prompt_init": "vocab"}),
    ("dpt, zero (B = 0)", "dpt", {"prompt_init": "zero"}),
    ("residual-prompt, uniform", "residual-prompt", {}),
    ("residual-prompt, vocab", "residual-prompt", {"prompt_init": "vocab"}),
]


def load_split(data, split, dictionary, label_dict, n):
    """(right-padded tokens [n, T] with <s> prepended, targets [n])."""
    src = data_utils.load_indexed_dataset(os.path.join(data, "input0", split), dictionary)
    lab = data_utils.load_indexed_dataset(os.path.join(data, "label", split), label_dict)
    n = min(n, len(src))
    rows = [torch.cat([torch.tensor([dictionary.bos()]), src[i].long()]) for i in range(n)]
    tokens = data_utils.collate_tokens(rows, dictionary.pad())
    target = torch.tensor([int(lab[i][0]) - label_dict.nspecial for i in range(n)])
    return tokens, target


def cls_features(model, tokens, prompted=True, batch=64):
    out = []
    with torch.no_grad():
        for i in range(0, len(tokens), batch):
            src = tokens[i : i + batch]
            if prompted:
                features = model(src, features_only=True)[0]
            else:  # the stock encoder, no prompt
                features = model.encoder.sentence_encoder(src)["encoder_out"][0].transpose(0, 1)
            out.append(features[:, 0])
    return torch.cat(out)


def probe_accuracy(train_x, train_y, dev_x, dev_y, weight_decay=1e-3, steps=200):
    """Logistic regression (L-BFGS, standardised features) fitted on train, accuracy on dev."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    x, xd = (train_x - mean) / std, (dev_x - mean) / std
    w = torch.zeros(x.size(1), int(train_y.max()) + 1, requires_grad=True)
    b = torch.zeros(w.size(1), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ w + b, train_y) + weight_decay * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return (xd @ w + b).argmax(1).eq(dev_y).float().mean().item() * 100


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--backbone", default=os.path.join(REPO, "models", "minilm-l6-fairseq", "model.pt"))
    parser.add_argument("--n", type=int, default=512, help="train and dev examples for the probe (512)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    dictionary = Dictionary.load(os.path.join(args.data, "input0", "dict.txt"))
    dictionary.add_symbol("<mask>")
    label_dict = Dictionary.load(os.path.join(args.data, "label", "dict.txt"))
    train, train_y = load_split(args.data, "train", dictionary, label_dict, args.n)
    dev, dev_y = load_split(args.data, "valid", dictionary, label_dict, args.n)
    length = train.ne(dictionary.pad()).sum(1).float().mean()
    print(f"{len(train)} train / {len(dev)} dev examples, {length:.1f} tokens on average")

    base = None
    columns = [("|P|", 6), ("cos", 6), ("spread", 7), ("noise", 6), ("probe", 6)]
    columns += [("|g P|", 8), ("|g head|", 8), ("g/|P|", 8)]
    print(f"{'configuration':<30} " + " ".join(f"{name:>{width}}" for name, width in columns))
    for label, preset, options in CONFIGS:
        torch.manual_seed(args.seed)
        model = build_model(
            "roberta_prompt",
            dictionary,
            backbone=args.backbone,
            **STANDIN,
            prompt_preset=preset or "prompt-tuning-5",
            **options,
        )
        model.register_classification_head(HEAD, num_classes=2)
        model.eval()
        if base is None:
            enc = model.encoder.sentence_encoder
            ordinary = model.ordinary_tokens()
            emb = enc.embed_tokens.weight[ordinary].norm(dim=1)
            pos = enc.embed_positions.weight[enc.padding_idx + 1 :].norm(dim=1)
            print(
                f"token-embedding rows (ordinary tokens): mean norm {emb.mean():.3f} (sd {emb.std():.3f}), "
                f"per-coordinate sd {enc.embed_tokens.weight[ordinary].std():.4f}; position rows: mean norm "
                f"{pos.mean():.3f}; embedding LayerNorm: {enc.layernorm_embedding is not None}"
            )
            base = cls_features(model, train, prompted=False), cls_features(model, dev, prompted=False)
        if preset is None:
            train_x, dev_x = base
            p_norm, cos, noise, grads = float("nan"), 1.0, float("nan"), (float("nan"),) * 3
        else:
            P = model.prompt()
            P0 = P[0] if P.dim() == 3 else P
            p_norm = P0.norm(dim=1).mean().item()
            train_x, dev_x = cls_features(model, train), cls_features(model, dev)
            cos = F.cosine_similarity(train_x, base[0], dim=1).mean().item()
            model.train()
            torch.manual_seed(args.seed + 1)
            noisy = cls_features(model, train[:64])
            noise = ((noisy - train_x[:64]).norm(dim=1).mean() / train_x.mean(0).norm()).item()
            # as fairseq-train: dropout on
            logits = model(train[:32], classification_head_name=HEAD)[0]
            F.cross_entropy(logits, train_y[:32]).backward()
            prompt_params = [p for p in model.prompt.parameters() if p.grad is not None]
            g_prompt = torch.cat([p.grad.flatten() for p in prompt_params])
            v_prompt = torch.cat([p.detach().flatten() for p in prompt_params])
            g_head = torch.cat([p.grad.flatten() for p in model.classification_heads.parameters()])
            v_rms = v_prompt.pow(2).mean().sqrt()
            rel = g_prompt.pow(2).mean().sqrt() / v_rms if v_rms > 1e-8 else torch.tensor(float("nan"))  # P = 0
            grads = g_prompt.norm().item(), g_head.norm().item(), rel.item()
        spread = ((train_x - train_x.mean(0)).norm(dim=1).mean() / train_x.mean(0).norm()).item()
        probe = probe_accuracy(train_x, train_y, dev_x, dev_y)
        print(
            f"{label:<30} {p_norm:6.3f} {cos:6.3f} {spread:7.3f} {noise:6.3f} {probe:6.1f} "
            f"{grads[0]:8.2e} {grads[1]:8.2e} {grads[2]:8.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
