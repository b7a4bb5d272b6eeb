"""[defaults]: what a submitted job gets when neither it nor its job type says. A module
of its own, importing only the field types, so that the model's `JobSpec` takes its
defaults from here without a cycle."""

from typing import Annotated

from msgspec import Meta, Struct

from herder.core.settings.fields import Duration


class DefaultsSection(Struct, frozen=True):
    """[defaults]: what a submitted job gets when neither it nor its job type says."""

    priority: int = 100
    weight: str = "light"
    max_attempts: Annotated[int, Meta(ge=1)] = 3
    max_transient_attempts: Annotated[int, Meta(ge=1)] = 5
    """The transient budget (`transient_max_attempts`): its own, never the job's
    attempts."""
    timeout: Duration | None = None
    backoff_base: Duration = 10.0
    backoff_max: Duration = 600.0
