"""Benchmarks of infertune and of its test infrastructure; results live in results/."""

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A working directory for one bench run (the cluster's and the operator's logs): removed
    when the run succeeds, kept and named when it fails, for its logs."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    except BaseException:
        print(f"the bench failed; its logs are in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
