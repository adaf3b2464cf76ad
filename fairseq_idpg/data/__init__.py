"""fairseq datasets used by the project's tasks."""

from .truncated_sentences_dataset import TruncatedSentencesDataset, longest_first_lengths

__all__ = ["TruncatedSentencesDataset", "longest_first_lengths"]
