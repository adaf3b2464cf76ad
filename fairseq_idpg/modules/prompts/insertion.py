"""Insert t prompt vectors into RoBERTa inputs at one of IDPG's positions (IDPG appendix A.4/A.5).

One implementation for every prompt method (prompt tuning, IDPG, DPT, residual prompts):

- ``insertion_index`` finds, per example, where the prompt goes (vectorised over the batch):

  ====  =====================================  ==============================
  pos   ``<s> A </s> </s> B </s>`` (pairs)      ``<s> A </s>`` (single)
  ====  =====================================  ==============================
  0     right after ``<s>``                     right after ``<s>``
  1     before the first ``</s>``               before ``</s>``
  2     at the start of B (after ``</s></s>``)  -- (needs a pair)
  3     before the last ``</s>``                -- (needs a pair)
  4     after the final ``</s>``                after ``</s>``
  ====  =====================================  ==============================

  (IDPG appendix A.4/A.5 and Figure 5: five positions for pairs, 0, 1, 4 for single sentences.)
- ``insert_prompts`` builds the prompted sequence by one gather: real tokens after the slot
  shift right by t, so the prompt takes ordinary consecutive positions; the returned token
  ids carry a non-pad filler at the prompt slots, so that fairseq's own encoder computes
  the padding mask (0 at prompt slots) and the learned positions from them unchanged.
- ``insert_after_bos`` does position 0 (the default, the slot the same in every row) by one
  concatenation: the same embeddings as ``insert_prompts`` and the padding mask of its tokens,
  without computing an index (``insert_prompts``: some twenty operators forward and four backward;
  this: one and one, and one for the mask).
"""

import torch

from fairseq_idpg.errors import ConfigError

PAIR_ONLY_POSITIONS = (2, 3)
POSITIONS = (0, 1, 2, 3, 4)
MIN_INPUT_TOKENS = 4  # <s> A </s></s> B </s> with empty sentences: the task's smallest input


def check_position(position, is_pair):
    """Build-time check of ``--prompt-position`` against the task's input layout."""
    if position not in POSITIONS:
        raise ConfigError(f"--prompt-position must be one of 0-4, got {position}")
    if position in PAIR_ONLY_POSITIONS and not is_pair:
        raise ConfigError(
            f"--prompt-position {position} needs sentence pairs (<s> A </s></s> B </s>); "
            f"this task has single sentences: use 0, 1 or 4"
        )


def insertion_index(src_tokens, position, pad_idx, eos_idx):
    """Index in ``src_tokens`` [B, T] before which the prompt is inserted, [B] (long).

    Padding is on the right (fairseq's RightPadDataset). For pairs the first ``</s>`` closes
    A and is followed by the separator ``</s>``.
    """
    bsz, seq_len = src_tokens.shape
    lengths = src_tokens.ne(pad_idx).sum(dim=1)
    if position == 0:
        return torch.ones_like(lengths)
    if position == 4:
        return lengths
    if position == 3:
        return lengths - 1
    is_eos = src_tokens.eq(eos_idx)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1), lengths - 1)
    if position == 1:
        return first_eos
    return first_eos + 2  # position 2: after "</s> </s>"


def insert_prompts(src_tokens, token_embeddings, prompts, index, pad_idx, filler_idx):
    """Insert ``prompts`` before ``index`` in every example.

    Args:
        src_tokens: [B, T] token ids (right-padded).
        token_embeddings: [B, T, C] their embeddings (before positions are added).
        prompts: [B, t, C] (instance-dependent) or [t, C] (shared) prompt vectors.
        index: [B] long, from ``insertion_index``.
        pad_idx: padding id; filler_idx: any non-pad id (written at the prompt slots).
    Returns:
        tokens [B, T+t], embeddings [B, T+t, C] and ``slots`` [B, T+t] (bool, True at the
        prompt vectors). Padding stays at the end of each row.
    """
    bsz, seq_len, dim = token_embeddings.shape
    if prompts.dim() == 2:
        prompts = prompts.unsqueeze(0).expand(bsz, -1, -1)
    t = prompts.size(1)
    pos = torch.arange(seq_len + t, device=src_tokens.device).unsqueeze(0)  # [1, T+t]
    start = index.unsqueeze(1)  # [B, 1]
    slots = (pos >= start) & (pos < start + t)  # [B, T+t]
    # source index of each output position: j before the slot, j - t after it (<= T - 1,
    # so right padding stays padding); inside the slot it is overwritten below
    src = torch.where(pos < start, pos, pos - t).clamp(min=0)
    tokens = torch.gather(src_tokens, 1, src)
    tokens = torch.where(slots, torch.full_like(tokens, filler_idx), tokens)
    emb = torch.gather(token_embeddings, 1, src.unsqueeze(-1).expand(-1, -1, dim))
    prompt_idx = (pos - start).clamp(0, t - 1)  # [B, T+t]
    prompt_rows = torch.gather(prompts.to(emb.dtype), 1, prompt_idx.unsqueeze(-1).expand(-1, -1, dim))
    emb = torch.where(slots.unsqueeze(-1), prompt_rows, emb)
    return tokens, emb, slots


def insert_after_bos(token_embeddings, prompts, padding_mask):
    """Position 0 (right after ``<s>``): ``insert_prompts``'s embeddings, by one concatenation.

    Args:
        token_embeddings: [B, T, C] of right-padded rows that start with ``<s>``.
        prompts: [B, t, C] or [t, C].
        padding_mask: [B, T] (True at padding) of the same rows.
    Returns:
        embeddings [B, T+t, C] and their padding mask [B, T+t] (False at the prompt slots 1..t).
    """
    bsz = token_embeddings.size(0)
    if prompts.dim() == 2:
        prompts = prompts.unsqueeze(0).expand(bsz, -1, -1)
    t = prompts.size(1)
    first, rest = token_embeddings[:, :1], token_embeddings[:, 1:]
    emb = torch.cat([first, prompts.to(token_embeddings.dtype), rest], dim=1)
    # <s> is never padding, so its column stands for the t slots too
    mask = torch.cat([padding_mask[:, :1].expand(-1, 1 + t), padding_mask[:, 1:]], dim=1)
    return emb, mask


def slots_after_bos(bsz, length, t, device):
    """The prompt slots of position 0 in rows of ``length`` (prompt included): True at 1..t, [B, length]."""
    slots = torch.zeros(1, length, dtype=torch.bool, device=device)
    slots[:, 1 : 1 + t] = True
    return slots.expand(bsz, -1)
