"""pyinfra's floor for bench/controller.py: one trivial operation from a deploy file, as deploys/gpu_node.py runs."""

from pyinfra.operations import server

server.shell(name="one trivial operation", commands=["true"])
