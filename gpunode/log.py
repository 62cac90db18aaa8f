"""The project's logger: a child of pyinfra's, so the pyinfra CLI prints its messages."""

import logging

logger = logging.getLogger("pyinfra.gpunode")
