"""Who makes what when a run is shared, behind one interface the pipeline
asks: ``Alone`` for a process on its own, ``Together`` for one of a torchrun
job's processes (the collective calls are distributed.py's, which imports
torch.distributed, so only ``Together`` loads it).

Under torchrun every process plans the whole corpus alike, makes whole
batches of the one-process plan, keeps its rows in its own partial manifest,
and rank 0 merges them into the manifest at the end.
"""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tts_cli.errors import FatalError, OutputError, cannot_write
from tts_cli.journal import ManifestJournal
from tts_cli.planning import PendingLine
from tts_cli.manifest import partial_manifest_name
from tts_cli.resume import partial_manifests

if TYPE_CHECKING:
    from tts_cli.distributed import Group
    from tts_cli.signals import StopOnSignals

# Under torchrun, the pieces of a cut line that more than one process makes
# go to the line's writer through files here (removed when the line is
# written, and by the next run).
PIECES_DIR = ".pieces"


@dataclass
class Share:
    """What this process makes: its batches of the one plan (each a list of
    (line, piece number)), in plan order; the lines whose rows it makes; and
    the lines whose pieces are made by more than one process, which pass
    their pieces through files in PIECES_DIR."""
    batches: list[list[tuple[PendingLine, int]]]
    lines: list[PendingLine]
    shared: set[PendingLine] = field(default_factory=set)


class Alone:
    """A run on its own: every batch, every row into the manifest."""
    group = None
    processes = 1
    removes_temp_files = True

    def agree_on_seed(self, seed: int) -> int:
        return seed

    def share(self, batches: list[list[tuple[PendingLine, int]]], pending: list[PendingLine],
              manifest: ManifestJournal, journal: ManifestJournal | None = None) -> tuple[Share, ManifestJournal]:
        """This process's share of the plan (or of a later window of it) and
        the journal its rows go to (``journal``, the one a first share gave)."""
        return Share(batches, pending), manifest

    def take_over(self, manifest: ManifestJournal) -> None:
        """Before any WAV is replaced, the manifest is rewritten with only the
        earlier rows this run keeps (old rows must not vouch for new files),
        and what an earlier torchrun job left (its partial manifests, read
        while planning, and its pieces) is removed."""
        _clear_earlier_job(manifest)

    def finish(self, manifest: ManifestJournal, mine: ManifestJournal, share: Share, writer,
               signals: StopOnSignals) -> bool:
        """Nothing to wait for: the rows are in the manifest. Whether the job
        is done (every line has its row, whatever signal came late)."""
        return manifest.complete

    def wrote_manifest(self, done: bool) -> bool:
        """Whether this process saved the manifest: a run alone always does."""
        return True


class Together:
    """One process of a torchrun job (``group``)."""

    def __init__(self, group: Group):
        from tts_cli import distributed
        self.group, self.distributed = group, distributed
        self.processes = group.world
        # on another machine a live process's pid looks dead: rank 0 alone
        # removes stale temporary files
        self.removes_temp_files = group.rank == 0

    def agree_on_seed(self, seed: int) -> int:
        return self._together(self.distributed.agree_on_seed, seed)

    def share(self, batches: list[list[tuple[PendingLine, int]]], pending: list[PendingLine],
              manifest: ManifestJournal, journal: ManifestJournal | None = None) -> tuple[Share, ManifestJournal]:
        """Whole batches of the plan one process would run (balanced by lines
        x longest piece, what a batch costs), so that every line is made in
        the batch it would share on one process, and its audio is that
        process's; each line's row is made by the process that makes its
        first piece, into its own partial manifest (``journal``, for a later
        window of the plan: the one the first share gave)."""
        costs = [len(batch) * max(len(p.pieces[i]) for p, i in batch) for batch in batches]
        owners = self.distributed.share(costs, self.group.world)
        makers: dict[PendingLine, set[int]] = {}
        first: dict[PendingLine, int] = {}
        for batch, owner in zip(batches, owners):
            for p, i in batch:
                makers.setdefault(p, set()).add(owner)
                if i == 0:
                    first[p] = owner
        rank = self.group.rank
        mine = [p for p in pending if first[p] == rank]
        share = Share([b for b, owner in zip(batches, owners) if owner == rank], mine,
                      {p for p, ranks in makers.items() if len(ranks) > 1})
        if journal is not None:
            journal.only.update(p.utterance.line for p in mine)
            return share, journal
        partial = ManifestJournal(manifest.path.parent / self.group.partial_manifest, manifest.utterances,
                                  seed=manifest.seed, only={p.utterance.line for p in mine})
        return share, partial

    def take_over(self, manifest: ManifestJournal) -> None:
        """``Alone.take_over``, by rank 0, once every rank has planned and
        before any rank writes."""
        self._together(self.distributed.barrier)
        if self.group.rank == 0:
            _clear_earlier_job(manifest)
        self._together(self.distributed.barrier)

    def finish(self, manifest: ManifestJournal, mine: ManifestJournal, share: Share, writer,
               signals: StopOnSignals) -> bool:
        """A process that finished its share waits for the others here; when
        torchrun stops the job (another process died), the signal ends the
        wait and is reported as the interruption it is: this process's rows
        are saved, with those of the lines it owns whose pieces were all made.
        Whether the job is done: past the merge, every process's rows are
        saved (rank 0 has merged them), whatever signal came late."""
        if signals.stop.is_set():
            self._write_shared_lines(share, writer, mine, made_only=True)
            return False
        try:
            self._together(self.distributed.barrier, saved=mine.path)
            self._write_shared_lines(share, writer, mine)
            self._merge(manifest, mine)
        except FatalError:
            if signals.received is None:
                raise
            return False
        return True

    def wrote_manifest(self, done: bool) -> bool:
        """Whether this process saved the manifest: rank 0, once it merged
        every process's rows (``done``)."""
        return done and self.group.rank == 0

    def _write_shared_lines(self, share: Share, writer, mine: ManifestJournal, made_only: bool = False) -> None:
        """Each process writes the lines it owns whose pieces were made
        elsewhere too, from the pieces' files: once every process has made
        its batches, all of them; stopped early (``made_only``), those whose
        pieces are all there, so that no finished line is made again."""
        failure = None
        for p in share.lines:
            if p not in share.shared or made_only and not writer.pieces_made(p):
                continue
            p.results = [writer.read_piece(p, i) for i in range(len(p.pieces))]
            try:
                mine.record(writer.write(p))
            except OSError as e:
                failure = e
                break
            finally:
                p.results.clear()
            writer.remove_pieces(p)
            mine.save()
        mine.save(final=True)
        if failure is not None:
            raise OutputError(cannot_write(writer.out_dir, failure))

    def _merge(self, manifest: ManifestJournal, mine: ManifestJournal) -> None:
        """Once every rank has saved its partial manifest, rank 0 reads their
        rows into the one manifest, in corpus order, and removes the partial
        manifests it no longer needs (the output folder is shared: README,
        Scale)."""
        self._together(self.distributed.barrier, saved=mine.path)
        if self.group.rank != 0:
            return
        for rank in range(self.group.world):
            path = manifest.path.parent / partial_manifest_name(rank, self.group.world)
            try:
                manifest.adopt(path)
            except OSError as e:
                raise FatalError(f"{self.group}: cannot read {path} ({e.strerror or e}), which the others saved; "
                                 "run the same command again to finish") from None
        manifest.save(final=True)
        _remove_partial_manifests(manifest.path.parent)
        with contextlib.suppress(OSError):   # gone already, or pieces of lines that failed
            (manifest.path.parent / PIECES_DIR).rmdir()

    def _together(self, call, *args, saved: Path | None = None):
        """A step all processes take together; one that cannot (another
        process died) ends this one with a line saying how to finish."""
        try:
            return call(*args)
        except self.distributed.GroupError as e:
            kept = f"; its finished lines are saved in {saved}" if saved else ""
            raise FatalError(f"{self.group}: {e}{kept}; run the same command again to finish") from None


def coordinator(group: Group | None) -> Alone | Together:
    return Alone() if group is None else Together(group)


def _clear_earlier_job(manifest: ManifestJournal) -> None:
    """The manifest rewritten with the rows this run keeps, unless every
    line has its row already and no earlier job left partial manifests (a
    re-run with nothing to do: no file will be replaced, and the run's end
    writes the manifest), or there is none (no row to vouch for a file the
    run replaces; a run that fails before its first file leaves no
    manifest); then the earlier job's files removed."""
    partials = partial_manifests(manifest.path.parent)
    if partials or not manifest.complete and manifest.path.exists():
        manifest.save(final=True)
    _remove_partial_manifests(manifest.path.parent)
    shutil.rmtree(manifest.path.parent / PIECES_DIR, ignore_errors=True)


def _remove_partial_manifests(out_dir: Path) -> None:
    try:
        for path in partial_manifests(out_dir):
            path.unlink(missing_ok=True)
    except OSError as e:
        raise OutputError(cannot_write(out_dir, e)) from None
