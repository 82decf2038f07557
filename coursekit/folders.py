"""Build folders that concurrent grading runs share safely: one builder of a folder at a time, outputs published whole.

A class graded with `./course grade --all --jobs N` runs many grading processes at once. Each tree (labs, solutions,
a submission) builds into folders of its own (trees.Lab.build_dir: build/<kind>/<tree tag>/<lab>), so runs of
different trees never meet; runs of the same tree (a lab graded again while its notebook runs, two instructors) share
a folder through these helpers:

  - exclusive(folder): an flock(2) on folder/.lock for the duration of a build. The kernel drops it when the holder
    exits, however it exits, so a run killed at its deadline leaves no stale lock behind (torch's FileBaton would);
  - an output is made under a temporary name beside its final one and renamed into place (publish_folder,
    publish_file): rename(2) is atomic, so a reader finds the whole output or none, never a half-written wheel;
  - the final name holds a key of everything the output is made from (content_key), so an output that exists is
    current and a changed source gets a new name instead of overwriting what another run may be reading.

Standard library only, like all of coursekit: the CLI (coursekit/env.py) and lab 09's stable_tools.py import it
without torch.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

LOCK_NAME = ".lock"
PARTIAL_MARK = ".partial-"  # in the name of an output still being made: never read, removed by the next builder


@contextlib.contextmanager
def exclusive(folder: Path) -> Iterator[Path]:
    """Hold folder's lock (created with the folder) until the block ends: one builder of the folder at a time,
    across processes and threads (each acquisition opens the file anew, so two threads of one process wait too)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def content_key(named_files: Iterable[tuple[str, Path]], salt: str = "") -> str:
    """16 hex digits of a hash of `salt` and each (name, file)'s name and bytes, in the order given. Name each file
    by where it sits in its tree, not by its absolute path, so two copies of one submission get one key."""
    digest = hashlib.sha256(salt.encode())
    for name, path in named_files:
        digest.update(f"\n{name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def staging_path(final: Path) -> Path:
    """Where `final` is made before it is published: beside it (one file system, so the rename is atomic), under a
    name of this process's own. A leftover from a killed run is removed by remove_leftovers."""
    return final.with_name(f"{final.name}{PARTIAL_MARK}{os.getpid()}")


def publish_folder(staging: Path, final: Path) -> Path:
    """Rename the finished `staging` folder to `final`; if another run published `final` first, keep theirs (made
    from the same sources: the key is in the name) and drop ours."""
    try:
        staging.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return final


def publish_file(made: Path, final: Path) -> Path:
    """Move the finished file `made` onto `final` in one rename: a process that opened the old file keeps reading
    it whole, and one that opens `final` gets the new file whole."""
    os.replace(made, final)
    return final


def remove_leftovers(folder: Path, prefix: str, keep: Path) -> None:
    """Remove folder's entries named prefix* other than `keep`: outputs of older sources, and partial ones of runs
    that died. Call it holding exclusive(folder): no other builder of this folder is making one then."""
    for entry in folder.glob(f"{prefix}*"):
        if entry != keep:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def require_given_files(folder: Path, names: Iterable[str], what: str, course_copy: Path) -> None:
    """Fail, saying what to do, when the graded tree lacks a file that the course gives (not a student's TODO) and
    that the build of `what` needs."""
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {', '.join(missing)}: given code (no TODO) that {what} is built from. Copy "
            f"{'them' if len(missing) > 1 else 'it'} unchanged from the course's {course_copy} into the submission, "
            "then grade again")
