"""The run's per-node summary (``pyinfra_gpunode.rollout.summary_table``) read back from its output."""

from __future__ import annotations


def summary_rows(output: str) -> dict[str, str]:
    """Node name -> its block after ``Summary (rollout order)``, the wrapped lines joined by single spaces."""
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in output[output.index("Summary (rollout order)") :].splitlines()[1:]:
        if line.startswith(" "):
            current.append(line)
        elif line.strip():
            current = blocks.setdefault(line.split()[0], [])
            current.append(line)
    return {name: " ".join(" ".join(lines).split()) for name, lines in blocks.items()}
