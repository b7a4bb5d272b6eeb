"""Every operator operation, written once over the store and the config: the Python API
(`herder.client.Client` is this class), the CLI against a database, and the HTTP API's
routes all call it; `herder.services.remote.RemoteClient` does the same over HTTP.

    from herder.client import Client

    with Client("sqlite:///herder.db") as herder:
        job_id = herder.submit(command=["pytest", "-q"], weight="heavy").job_id
        job = herder.wait(job_id, timeout=600)
        print(job.status, job.exit_code)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from herder.core.settings.loading import Config, load_config
from herder.services.base import nothing
from herder.services.fleet import FleetOperations
from herder.services.jobs import JobOperations
from herder.services.reservations import ReservationOperations
from herder.store import Store, open_store

if TYPE_CHECKING:
    from herder.services.base import Placement


class Operations(JobOperations, FleetOperations, ReservationOperations):
    def __init__(
        self, db: str | None = None, config: Config | str | Path | None = None
    ) -> None:
        self.config = config if isinstance(config, Config) else load_config(config)
        self.store = open_store(self.config.db_url(db))
        self.on_change, self.placement = nothing, None

    @classmethod
    def over(cls, store: Store, config: Config, *, on_change: Callable[[], None] = nothing,
             placement: Placement | None = None) -> Operations:
        """The operations on a store its owner closes (the server's coordinator), so the
        server answers the operator's commands with the code that answers them locally;
        `on_change` wakes its scheduler, `placement` lends its latest placement."""
        operations = cls.__new__(cls)
        operations.config, operations.store = config, store
        operations.on_change, operations.placement = on_change, placement
        return operations

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Operations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
