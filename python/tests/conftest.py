import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))


def qsim_bin() -> str:
    """The qsim binary (scripts/qsim-bin.sh's, or $QSIM)."""
    q = os.environ.get("QSIM")
    if q:
        return q
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/qsim-target"))
    return os.path.join(target, "release", "qsim")
