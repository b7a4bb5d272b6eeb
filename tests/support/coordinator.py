"""`herder server`'s core in the test's own process: a Coordinator over a store the test
holds, its herder.toml in a folder of its own."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from herder.core.settings.loading import load_config
from herder.runtime.coordinator import Coordinator
from herder.runtime.loop_health import LoopRegistry
from herder.store import Store
from support.config import toml_value, write_config


def coordinator_in(folder: Path, store: Store, host: str, stale_after: float = 30.0,
                   **sections: Mapping[str, Any]) -> Coordinator:
    """A coordinator labelled `host`, its logs under `folder`, with these herder.toml
    `sections` (plain values); its loops count as stale after `stale_after` seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {"herder": {"log_dir": f"{folder}/logs"}, **sections}
    path = write_config(folder / "herder.toml", {
        name: {key: toml_value(value) for key, value in values.items()}
        for name, values in written.items()})
    coordinator = Coordinator(store, load_config(path), host=host)
    coordinator.loops = LoopRegistry(floor_seconds=stale_after)
    return coordinator
