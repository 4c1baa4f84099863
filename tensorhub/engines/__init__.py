"""Adapters between tensorhub and the engines users run: staged (atomic) updates, HF
transformers models, vLLM and SGLang workers. Each adapter is a thin layer over
:meth:`Hub.fetch <tensorhub.Hub.fetch>` and :meth:`Hub.stream <tensorhub.Hub.stream>`;
the engine packages are imported only by the adapter that needs them."""

from .atomic import StagedWeights

__all__ = ["StagedWeights"]
