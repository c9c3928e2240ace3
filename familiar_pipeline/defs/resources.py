"""Dagster resources: where familiars live, the LLM, and the embedder."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from familiar_pipeline.config import FamiliarConfig, load_config
from familiar_pipeline.models.embedders import create_embedder
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.storage.paths import FamiliarPaths, data_root
from familiar_pipeline.engine.run_loop import OpenRuntime
from familiar_pipeline.engine.runtime import FamiliarRuntime


class FamiliarData(dg.ConfigurableResource):
    """The data root holding one folder per familiar ("" = FAMILIAR_DATA_ROOT or ./data/familiars)."""

    data_root: str = ""

    def root(self) -> Path:
        return Path(self.data_root).expanduser().resolve() if self.data_root else data_root()

    def paths(self, familiar_id: str) -> FamiliarPaths:
        return FamiliarPaths.for_id(familiar_id, self.root())

    def config(self, familiar_id: str) -> FamiliarConfig:
        return load_config(familiar_id, root=self.root())


class LlmResource(dg.ConfigurableResource):
    """The background LLM slot of each familiar, with its response cache under the familiar's folder."""

    slot: str = "background"

    def client(self, config: FamiliarConfig, paths: FamiliarPaths, usage=None):
        """An LlmClient, or None when the slot has no model configured."""
        slot = config.llm.slots.get(self.slot)
        if slot is None or not slot.configured:
            return None
        paths.cache_dir.mkdir(parents=True, exist_ok=True)
        return client_for(config.llm, self.slot, cache_path=paths.llm_cache, usage=usage)


class EmbedderResource(dg.ConfigurableResource):
    """The embedder named by [providers.embedding] (None when the backend is "off")."""

    def embedder(self, config: FamiliarConfig):
        return create_embedder(config.embedding)


def build_runtime(data: FamiliarData, llm: LlmResource, familiar_id: str, *, usage=None, embedder: EmbedderResource | None = None,
                  config: FamiliarConfig | None = None, embedders: dict | None = None) -> FamiliarRuntime:
    """The familiar's runtime; `config`: its effective config when the caller already loaded it.

    `embedders`: a cache (embedding config -> embedder) shared by the familiars of one
    step, so a run over many familiars loads the embedding model once, not per familiar.
    """
    config = config or data.config(familiar_id)
    paths = data.paths(familiar_id)
    model = None
    if embedder is not None:
        if embedders is None:
            model = embedder.embedder(config)
        else:
            if config.embedding not in embedders:
                embedders[config.embedding] = embedder.embedder(config)
            model = embedders[config.embedding]
    return FamiliarRuntime(paths=paths, config=config, llm_client=llm.client(config, paths, usage=usage), embedder=model)


def runtime_opener(data: FamiliarData, llm: LlmResource, embedder: EmbedderResource | None = None, *,
                   embedders: dict | None = None) -> OpenRuntime:
    """How the engine's run loop opens each familiar (`engine.run_loop.OpenRuntime`): its runtime over
    these resources, its effective config loaded, the embedder only for a pass with a projector that embeds."""

    def open_runtime(familiar_id: str, *, needs_embedder: bool) -> FamiliarRuntime:
        return build_runtime(data, llm, familiar_id, embedder=embedder if needs_embedder else None, embedders=embedders)

    return open_runtime
