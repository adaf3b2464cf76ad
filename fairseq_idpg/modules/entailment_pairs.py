"""EFL's entailment pairs as tensors: every example with each hypothesis, their binary targets, and the
class scores read back from the pairs' entailment logits (Wang et al. 2021, section 3). No loop over
the batch, the hypotheses or the tokens.

An example is ``<s> x </s>`` (right-padded, [B, T]); a description d_c becomes the suffix
``</s> d_c </s>`` (RoBERTa's pair layout ``<s> x </s></s> d_c </s>``), so that

    pairs[b * C + c] = x_b[:len_b] ++ suffix_c[:len_c] ++ <pad>...       [B * C, T + S]

with S the longest suffix. Sentence-pair tasks have no suffix (C = 1, the input is already the pair).

Binary pair logits ``z = [not entailed, entailed]`` ([B * C, 2], ``modules/entailment_head.py``) give:

- per-class descriptions (C > 1): target_{b,c} = [c == y_b]; class score s_{b,c} = z_{bc,1} - z_{bc,0},
  the entailment log-odds of (x_b, d_c); prediction argmax_c s_{b,c};
- one hypothesis (C = 1, a binary task whose class k is the entailed one): target_b = [y_b == k];
  class scores: column k = z_1, the other column = z_0, so argmax is k iff P(entailed) > 1/2 and the
  cross-entropy of the class scores is exactly the pair's binary entailment loss.
"""

import torch


def description_suffixes(descriptions, eos, pad):
    """[C, S] suffixes ``</s> d_c </s>`` (right-padded) and their lengths [C] from C token lists (no specials)."""
    lengths = torch.tensor([len(d) + 2 for d in descriptions], dtype=torch.long)
    suffixes = torch.full((len(descriptions), int(lengths.max())), pad, dtype=torch.long)
    for c, d in enumerate(descriptions):  # once per task, at setup: C rows of a few tokens
        suffixes[c, : len(d) + 2] = torch.tensor([eos, *d, eos], dtype=torch.long)
    return suffixes, lengths


def append_hypotheses(tokens, pad, suffixes, suffix_lengths):
    """Every example with every suffix.

    Args:
        tokens: [B, T] right-padded inputs ``<s> x </s>``; pad: the padding index.
        suffixes: [C, S] right-padded ``</s> d_c </s>``; suffix_lengths: [C].
    Returns:
        [B * C, T + S] right-padded pairs, row ``b * C + c`` = example b with description c.
    """
    B, T = tokens.shape
    C, S = suffixes.shape
    suffixes, suffix_lengths = suffixes.to(tokens.device), suffix_lengths.to(tokens.device)
    lengths = tokens.ne(pad).sum(dim=1)  # [B]
    j = torch.arange(T + S, device=tokens.device)  # output positions
    from_x = j[None, :] < lengths[:, None]  # [B, T + S]
    k = j[None, :] - lengths[:, None]  # position inside the suffix  [B, T + S]
    x = tokens.gather(1, j.clamp(max=T - 1).expand(B, -1))  # [B, T + S]
    s = suffixes[:, k.clamp(0, S - 1)]  # [C, B, T + S]
    in_suffix = (k >= 0)[None] & (k[None] < suffix_lengths[:, None, None])  # [C, B, T + S]
    pairs = torch.where(from_x[None], x[None], torch.where(in_suffix, s, torch.full_like(s, pad)))
    pairs = pairs.transpose(0, 1).reshape(B * C, T + S)
    width = int(pairs.ne(pad).sum(dim=1).max())  # drop all-padding columns
    return pairs[:, :width]


def pair_targets(target, num_pairs, entailed_index=None):
    """Binary targets of the pairs [B * C]: ``[c == y_b]`` (C = num_pairs > 1), else ``[y_b == k]``."""
    if entailed_index is None:
        classes = torch.arange(num_pairs, device=target.device)
        return (classes[None, :] == target[:, None]).long().reshape(-1)
    return (target == entailed_index).long()


def class_scores(pair_logits, num_pairs, entailed_index=None):
    """Class scores of the examples from the pairs' binary logits [B * C, 2] -> [B, C] (C > 1: log-odds),
    or [B, 2] with the entailed logit in column ``entailed_index`` (one hypothesis)."""
    if entailed_index is None:
        return (pair_logits[:, 1] - pair_logits[:, 0]).view(-1, num_pairs)
    return pair_logits if entailed_index == 1 else pair_logits.flip(-1)
