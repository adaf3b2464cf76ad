"""RoBERTa classification inputs, truncated so that a method's inserted tokens still fit."""

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

from fairseq_idpg.errors import ConfigError


def longest_first_lengths(len_a, len_b, budget):
    """Kept lengths of two texts under longest-first truncation, vectorised.

    Tokens are removed one at a time from the longer text (from the second on ties) until
    ``a + b <= budget``; the closed form is ``a' = min(a, max(budget - b, ceil(budget / 2)))``,
    ``b' = min(b, budget - a')``. ``len_b`` all zero gives plain truncation of the first text.

    Args:
        len_a, len_b: int arrays [N] of text lengths (specials excluded).
        budget: int >= 0, text tokens allowed per example.
    Returns:
        (kept_a, kept_b): int64 arrays [N].
    """
    len_a = np.asarray(len_a, dtype=np.int64)
    len_b = np.asarray(len_b, dtype=np.int64)
    kept_a = np.minimum(len_a, np.maximum(budget - len_b, (budget + 1) // 2))
    kept_b = np.minimum(len_b, budget - kept_a)
    return kept_a, kept_b


class TruncatedSentencesDataset(BaseWrapperDataset):
    """``<s> A </s>`` or ``<s> A </s> </s> B </s>`` (fairseq's sentence_prediction layout),
    truncated longest-first so that the whole sequence has at most ``max_tokens`` tokens.

    Args:
        first: dataset of binarized first sentences, each ending with ``</s>`` (as
            fairseq-preprocess writes them).
        second: same for the second sentences, or None for single-sentence tasks.
        init_token: prepended id (``<s>`` = 0 for RoBERTa).
        separator_token: id put between the sentences (``</s>`` = 2 for RoBERTa).
        max_tokens: the budget for the full sequence: ``--max-positions`` minus the tokens
            a method inserts (prompts), see ``PeftSentencePredictionTask``.
    """

    def __init__(self, first, second, init_token, separator_token, max_tokens):
        super().__init__(first)
        self.first, self.second = first, second
        self.init_token, self.separator_token = init_token, separator_token
        # specials: <s> ... </s>  (+ </s> ... </s> for pairs)
        n_special = 2 + (2 if second is not None else 0)
        if max_tokens < n_special:
            raise ConfigError(
                f"--max-positions leaves {max_tokens} tokens per example after the inserted "
                f"tokens; at least {n_special} are needed for the special tokens"
            )
        len_a = np.asarray(first.sizes, dtype=np.int64) - 1  # drop the stored </s>
        len_b = np.asarray(second.sizes, dtype=np.int64) - 1 if second is not None else np.zeros_like(len_a)
        self.kept_a, self.kept_b = longest_first_lengths(len_a, len_b, max_tokens - n_special)
        self._sizes = self.kept_a + self.kept_b + n_special
        self.num_truncated = int((self.kept_a + self.kept_b < len_a + len_b).sum())

    def __getitem__(self, index):
        a = self.first[index]
        eos = a[-1:]
        parts = [a.new_tensor([self.init_token]), a[: self.kept_a[index]], eos]
        if self.second is not None:
            b = self.second[index]
            parts += [a.new_tensor([self.separator_token]), b[: self.kept_b[index]], eos]
        return torch.cat(parts)

    @property
    def sizes(self):
        return self._sizes

    def size(self, index):
        return int(self._sizes[index])

    def num_tokens(self, index):
        return int(self._sizes[index])

    def prefetch(self, indices):
        self.first.prefetch(indices)
        if self.second is not None:
            self.second.prefetch(indices)

    @property
    def supports_prefetch(self):
        return getattr(self.first, "supports_prefetch", False) and (
            self.second is None or getattr(self.second, "supports_prefetch", False)
        )
