"""``--task idpg_sentence_prediction``: ``peft_sentence_prediction`` whose batches carry example ids,
so that an IDPG model computes each example's sentence representation M(x) once and reuses it
(``data/sentence_representation_cache.py``).

Why a task: a fairseq model sees only ``net_input``, while the example's id is ``sample["id"]``,
and only the task knows which split and files a batch comes from. After the model is built (the
platform's hook order: datasets load after ``build_model`` in fairseq-train and fairseq-validate),
each loaded split

1. gets a slot number and the identity of its data (``dataset_identity``: split, file digests,
   lengths after the prompt-aware truncation, special tokens), handed to the model's
   ``attach_sentence_cache(slot, identity, dataset)``, which opens (or creates) the cache whose
   key also holds the backbone's digest and the encoder settings;
2. is wrapped by ``WithSentenceIds``: batches carry ``net_input["sentence_ids"]``.

A model that is not a ``SentenceCacheModel`` (``model_protocol.py``), or one that says
``wants_sentence_cache() == False`` (``--idpg-cache off``, a trained backbone), gets exactly
``peft_sentence_prediction``.
"""

from fairseq.tasks import register_task

from fairseq_idpg.data.sentence_representation_cache import WithSentenceIds, dataset_identity

from .model_protocol import SentenceCacheModel
from .peft_sentence_prediction import PeftSentencePredictionConfig, PeftSentencePredictionTask


@register_task("idpg_sentence_prediction", dataclass=PeftSentencePredictionConfig)  # same options, ids in batches
class IdpgSentencePredictionTask(PeftSentencePredictionTask):
    def __init__(self, cfg, data_dictionary, label_dictionary):
        super().__init__(cfg, data_dictionary, label_dictionary)
        self._cache_model = None
        self._slots = {}  # split -> slot number in sentence_ids

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if isinstance(model, SentenceCacheModel):
            self._cache_model = model
        return model

    def load_dataset(self, split, combine=False, **kwargs):
        dataset = super().load_dataset(split, combine=combine, **kwargs)
        model = self._cache_model
        if model is None or not model.wants_sentence_cache():
            return dataset
        slot = self._slots.setdefault(split, len(self._slots))
        identity = dataset_identity(
            self.cfg.data,
            split,
            dataset,
            max_tokens=self.cfg.max_positions - self.num_inserted_tokens,
            init_token=self.cfg.init_token,
            separator_token=self.cfg.separator_token,
        )
        model.attach_sentence_cache(slot, identity, dataset)
        self.datasets[split] = WithSentenceIds(dataset, slot)
        return self.datasets[split]
