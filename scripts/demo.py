"""`make demo`: the main job on the embedded default.

1. `evalstop replay` on a shipped example curve (a hacked run's trainer_state.json).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def main() -> int:
    banner("1. evalstop replay on a recorded hacked run (configs/examples/hacked_trainer_state.json)")
    subprocess.run(
        [sys.executable, "-m", "evalstop_trl", "replay", str(ROOT / "configs/examples/hacked_trainer_state.json")],
        check=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
