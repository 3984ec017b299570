"""docs/byom.md, as written: its walkthrough's commands run one by one in a fresh export of the
repository (``git archive HEAD``, the checkout's .venv linked in), against the real broker and
Redis of the test stack (what ``scripts/stack_up.sh && source .stack/env`` provide)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, LocalStack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DOC = REPO_ROOT / "docs" / "byom.md"


def walkthrough() -> list[str]:
    """The commands of the block after "Then, from the repository root:" (comments dropped)."""
    text = DOC.read_text()
    block = text[text.index("Then, from the repository root:") :]
    body = re.search(r"```bash\n(.*?)```", block, re.S)
    assert body is not None
    return [line for line in body.group(1).splitlines() if line and not line.startswith("#")]


def test_the_walkthrough_works_as_written_from_a_fresh_export(
    local_stack: LocalStack, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    archive = subprocess.run(
        ["git", "archive", "HEAD"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(clone)], input=archive, check=True)
    (clone / ".venv").symlink_to(REPO_ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    env["STREAMRANK_KAFKA__BOOTSTRAP_SERVERS"] = local_stack.bootstrap_servers
    env["STREAMRANK_REDIS__URL"] = local_stack.redis_url
    env["STREAMRANK_METRICS__ENABLED"] = "false"
    commands = walkthrough()
    assert [c.split()[1] for c in commands] == [
        "examples/deepfm/example.py", "-c", "examples/deepfm/example.py",
        "examples/deepfm/example.py", "-c", "-c",
    ]  # fmt: skip
    outputs = []
    for command in commands:
        result = subprocess.run(
            command, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
        outputs.append(result)
    assert "imported artifacts/examples/deepfm.pt as version simpledeepfmnn-" in outputs[1].stderr
    summary = json.loads(outputs[4].stderr.strip().splitlines()[-1])
    assert summary["events_out"] == 200 and summary["dead_lettered"] == 0
    rankings = [json.loads(line) for line in outputs[5].stdout.splitlines()]
    assert len(rankings) == 3
    assert all(r["model_version"].startswith("simpledeepfmnn-") for r in rankings)
    assert all(0.0 <= i["score"] <= 1.0 for r in rankings for i in r["items"])
