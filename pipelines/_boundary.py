"""A node's part of a deploy ends at that node: an error no check foresaw in one node's data fails that
node, named, and never the run.

pyinfra prepares every host's operations in one process; an exception out of one host's deploy function
ends the run for every host, and a fact pyinfra could not process fails its host but hands the deploy a
default value (None) to go on with. Inside ``node_boundary`` either ends this host's part only: the host
is failed (pyinfra runs nothing on it, its operations included) and the others are planned and run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyinfra import host
from pyinfra.api.exceptions import PyinfraError

from pyinfra_gpunode.log import logger, without_controls
from pyinfra_gpunode.operations._internals import current_state

CAUSE_MAX = 500  # characters of the error's text shown


@contextmanager
def node_boundary(what: str) -> Iterator[None]:
    """Fail this host alone, naming ``what`` could not be planned and why, where its deploy raises."""
    try:
        yield
    except PyinfraError:
        raise  # pyinfra's own: it fails the host, or the run, as pyinfra does
    except Exception as error:
        run = current_state()
        if host in run.failed_hosts:  # by pyinfra, which printed why
            logger.error(
                "%s%s not planned: a read of this node failed (its error is printed above)", host.print_prefix, what
            )
            return
        cause = f"the controller could not judge this node's data: {type(error).__name__}: {error}"
        logger.error("%s%s not planned: %s", host.print_prefix, what, without_controls(cause)[:CAUSE_MAX])
        run.fail_hosts({host})
