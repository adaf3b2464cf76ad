"""Rows of several members of one method group packed into the [K, B, T] batch ``StackedMembers`` runs.

Each member needs the same number of rows B: a member with fewer real rows gets dummy rows ``<s> </s>`` (never an
all-padding row: its attention would have no key to attend to, a softmax over nothing), whose outputs nothing
reads. Every row is padded to the group's longest (the pads are masked). Built with tensor operators, no loop
over rows.
"""

import torch
from fairseq.data.data_utils import collate_tokens


def pack(rows, member, pad, bos, eos):
    """``rows``: N token tensors [T_i]; ``member`` [N]: each row's member index in the group.

    Returns (tokens [K', B, T], used [K'] the members present, in index order, local [N] each row's index
    into ``used``, slot [N] its row within its member): row i's output is ``out[local[i], slot[i]]``."""
    used, local = torch.unique(member, return_inverse=True)
    counts = torch.bincount(local, minlength=len(used))
    order = torch.argsort(local, stable=True)
    starts = counts.cumsum(0) - counts
    slot = torch.empty_like(local)
    slot[order] = torch.arange(len(local)) - starts[local[order]]
    flat = collate_tokens(rows, pad_idx=pad)  # [N, T]
    tokens = flat.new_full((len(used), int(counts.max()), max(flat.size(1), 2)), pad)
    tokens[:, :, 0], tokens[:, :, 1] = bos, eos  # dummy rows
    tokens[local, slot, : flat.size(1)] = flat
    return tokens, used, local, slot
