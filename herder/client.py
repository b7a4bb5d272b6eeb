"""The Python API: submit, get, list, cancel, retry and wait, as the CLI does them.

    from herder.client import Client

    with Client("sqlite:///herder.db") as herder:
        job_id = herder.submit(command=["pytest", "-q"], weight="heavy").job_id
        job = herder.wait(job_id, timeout=600)
        print(job.status, job.exit_code)

`Client` is `herder.services.operations.Operations`; this path stays for scripts."""

from herder.services.jobs import Submitted
from herder.services.operations import Operations as Client

__all__ = ["Client", "Submitted"]
