"""The ``tts-batch`` command: thin; all work happens in pipeline.py.

Exit status: 0 when no line ended in ``error``, 1 when some did (with
``--strict``, also ``suspect`` or ``truncated``), 2 for usage
errors (bad option, recipe, corpus ids or checkpoint file) and for an output
directory that cannot be written; 130 after SIGINT, 143 after SIGTERM.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

import click

from tts_cli.config import (AUDIO_FORMATS, BATCH_SIZES, CORPUS_FORMATS, DEFAULT_RECIPE, PRECISION_NAMES, default_help,
                            SAMPLE_FORMATS, SAMPLE_RATES, ConfigError, load_settings)
from tts_cli.errors import speaking_to
from tts_cli.formats import EXPORTS, LAYOUTS, NORMALIZATIONS
from tts_cli.manifest import plural

EXIT_LINE_ERRORS = 1
EXIT_USAGE = 2


def fatal(message: str) -> None:
    click.echo(f"tts-batch: error: {message}", err=True)
    sys.exit(EXIT_USAGE)


# ``tts-batch`` with nothing after it (click 8.2 and later).
_NO_ARGUMENTS = getattr(click.exceptions, "NoArgsIsHelpError", ())


class DefaultToSynth(click.Group):
    """``tts-batch CORPUS ...`` runs ``synth``; ``tts-batch bench`` the benchmark.
    A usage mistake (an unknown option, a value out of range, a missing
    ``-o``) is one line, as every other error is, not click's usage block."""

    # The subcommand being parsed: a usage error click gives no context
    # (an option missing its value) names its --help by it.
    subcommand: str | None = None

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["synth", *args]
        self.subcommand = args[0] if args and args[0] in self.commands else None
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with speaking_to("command"):   # its messages name the options as flags, even those made in Synthesizer
            return super().invoke(ctx)

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            status = super().main(*args, standalone_mode=False, **kwargs)
        except _NO_ARGUMENTS as e:   # ``tts-batch`` alone: the help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            command = (e.ctx.command_path if e.ctx is not None
                       else " ".join(filter(None, ("tts-batch", self.subcommand))))
            fatal(f"{e.format_message()} ({command} --help lists the options)")
        except click.ClickException as e:
            click.echo(f"tts-batch: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(status if isinstance(status, int) else 0)


@click.group(cls=DefaultToSynth, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tts-batch")
def main():
    """Batch speech synthesis: one WAV per corpus line plus a manifest, with
    Tacotron2 + WaveGlow on the GPU.

    \b
      tts-batch CORPUS -o OUT      synthesize (same as: tts-batch synth CORPUS -o OUT)
      tts-batch synth --help       all synthesis options
    """


def run() -> None:
    """The console command (``tts-batch``, ``python -m tts_cli``): ``main``,
    then the process ends at once with its exit status. By then every file
    is written and closed, the manifest saved and the output unlocked;
    CPython's teardown of torch's modules (and on a GPU, of the CUDA
    context) would add 0.3-0.5 s to every run, a tenth of a small job.
    Under torchrun, or with a thread still working, it ends as usual."""
    try:
        main(prog_name="tts-batch")
    except SystemExit as e:
        if not isinstance(e.code, (int, type(None))) or _under_torchrun() or _others_working():
            raise
        status = e.code or 0
    else:
        status = 0
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):   # a closed pipe: nothing more can be said anyway
            stream.flush()
    os._exit(status)


def _others_working() -> bool:
    return any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread())


@main.command()
@click.argument("corpus", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="Output directory: wavs/, mels/ and manifest.jsonl go here.")
@click.option("--recipe", default=DEFAULT_RECIPE, show_default=True,
              help="Built-in recipe name or a YAML file; options given here override it.")
@click.option("--tacotron2", type=click.Path(dir_okay=False),
              help=f"Tacotron2 checkpoint. {default_help('tacotron2')}")
@click.option("--waveglow", type=click.Path(dir_okay=False),
              help=f"WaveGlow checkpoint. {default_help('waveglow')}")
@click.option("--format", "format_", type=click.Choice(CORPUS_FORMATS),
              help="Corpus format: plain lines (id = line number), ljspeech (id|text), tsv (id<TAB>text). "
                   f"{default_help('format')}")
@click.option("--text-normalization", type=click.Choice(NORMALIZATIONS),
              help="How text is read: reference is NVIDIA's english_cleaners exactly (parity with the "
                   "published voice); extended also says percentages, times, e-mail and web addresses, "
                   f"units, symbols and dates. {default_help('text_normalization')}")
@click.option("--device", help=f"cuda, cuda:N or cpu. {default_help('device')}")
@click.option("--precision", type=click.Choice(PRECISION_NAMES),
              help=f"Model dtype. {default_help('precision')}")
@click.option("--batch-size", type=click.IntRange(min=1),
              help=f"Most lines per batch. {default_help('batch_size')}")
@click.option("--sigma", type=click.FloatRange(min=0), help=f"WaveGlow noise scale. {default_help('sigma')}")
@click.option("--denoiser-strength", type=click.FloatRange(min=0),
              help=f"Denoiser strength; 0 disables it. {default_help('denoiser_strength')}")
@click.option("--max-decoder-steps", type=click.IntRange(min=1),
              help=f"Frames after which a line is cut and marked truncated. {default_help('max_decoder_steps')}")
@click.option("--gate-threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help=f"Stop where sigmoid(gate) exceeds this. {default_help('gate_threshold')}")
@click.option("--prenet-dropout", type=click.FloatRange(0, 1, max_open=True),
              help=f"Prenet dropout at inference, as the reference; 0 is deterministic. "
                   f"{default_help('prenet_dropout')}")
@click.option("--seed", type=click.IntRange(min=0),
              help=f"Run seed: each line's randomness derives from it and the line's id. {default_help('seed')}")
@click.option("--sample-rate", type=click.IntRange(*SAMPLE_RATES), metavar="HZ",
              help=f"Rate of the WAVs; another than the voice's is resampled (libsoxr, very high quality). "
                   f"{default_help('sample_rate')}")
@click.option("--sample-format", type=click.Choice(SAMPLE_FORMATS),
              help=f"Sample format (float32: WAV only). {default_help('sample_format')}")
@click.option("--audio-format", type=click.Choice(AUDIO_FORMATS),
              help=f"Audio file format, wavs/<id>.wav or .flac. {default_help('audio_format')}")
@click.option("--save-mels/--no-save-mels", default=None,
              help=f"Also write mels/<id>.npy ([n_mel, frames] float32). {default_help('save_mels')}")
@click.option("--layout", type=click.Choice(LAYOUTS),
              help="files: one audio file a line in wavs/; webdataset: each line's audio and row in tar "
                   f"shards of about 1 GB in shards/, as WebDataset reads them. {default_help('layout')}")
@click.option("--shard-size", type=click.IntRange(min=0), metavar="N",
              help="A corpus of more than N lines writes wavs/ and mels/ in numbered folders of N lines each "
                   f"(wavs/00000/, wavs/00001/, ... in corpus order); 0 keeps one folder. "
                   f"{default_help('shard_size')}")
@click.option("--max-symbols-per-piece", type=click.IntRange(min=0),
              help="Cut longer lines at sentence, clause, then word boundaries; 0 never cuts. "
                   f"{default_help('max_symbols_per_piece')}")
@click.option("--piece-pause", type=click.FloatRange(0, 10),
              help=f"Seconds of silence between the pieces of a cut line. {default_help('piece_pause')}")
@click.option("--waveglow-memory", type=click.FloatRange(min=0, min_open=True),
              metavar="GIB", help="Memory WaveGlow's activations may take at once; a batch runs in "
                                  f"slices within it (audio unchanged). {default_help('waveglow_memory')}")
@click.option("--check-alignment/--no-check-alignment", default=None,
              help="Measure where each line's attention went, retry the lines that fail the thresholds "
                   f"below and mark those that still fail suspect. {default_help('check_alignment')}")
@click.option("--retries", type=click.IntRange(0, 20),
              help=f"New attempts, each with its own seed, at a line that fails. {default_help('retries')}")
@click.option("--min-coverage", type=click.FloatRange(0, 1),
              help=f"Least share of a line's symbols the attention must visit. {default_help('min_coverage')}")
@click.option("--min-focus", type=click.FloatRange(0, 1),
              help=f"Least mean peak attention weight. {default_help('min_focus')}")
@click.option("--max-forward-jump", type=click.IntRange(min=1), metavar="SYMBOLS",
              help=f"Most symbols the attention may skip ahead at once. {default_help('max_forward_jump')}")
@click.option("--max-backward-jump", type=click.IntRange(min=0), metavar="SYMBOLS",
              help="Most symbols the attention may fall back behind the furthest it reached. "
                   f"{default_help('max_backward_jump')}")
@click.option("--end-margin", type=click.IntRange(min=0), metavar="SYMBOLS",
              help=f"Most symbols left unread when the gate fires. {default_help('end_margin')}")
@click.option("--max-frames-per-symbol", type=click.FloatRange(min=0, min_open=True),
              help=f"Most mel frames per input symbol. {default_help('max_frames_per_symbol')}")
@click.option("--strict/--no-strict", default=None,
              help="Exit 1 when a line is suspect or truncated, as when one fails (for jobs that must not "
                   f"publish bad audio). {default_help('strict')}")
@click.option("--force/--no-force", default=None,
              help="Redo every line; by default a re-run keeps the WAVs an earlier run finished. "
                   f"{default_help('force')}")
@click.option("--prune/--no-prune", default=None,
              help="Remove the WAVs and mels in OUT that no manifest row names (left by an earlier corpus), and "
                   "rewrite the tar shards holding lines no row places there; without it the run counts them "
                   f"in one line. {default_help('prune')}")
@click.option("-q", "--quiet/--no-quiet", default=None,
              help="No progress bar, summary or notices; what changes the output (the demo voice standing in, a "
                   f"corpus that looks misread) and a run that fails still say so in one line. {default_help('quiet')}")
def synth(corpus: Path, out_dir: Path, recipe: str, format_: str | None, **options):
    """Synthesize every line of CORPUS (- reads standard input) into
    OUT/wavs/<id>.wav and OUT/manifest.jsonl."""
    from tts_cli.signals import StopOnSignals

    # Before torch is imported (seconds): from here on no signal raises, so
    # however many come, and whenever, the run ends through its own exits.
    with StopOnSignals(then_ignore=True) as signals:
        settings, utterances = _checked(corpus, out_dir, recipe, format_, options)
        summary, settings, group = _synth(settings, utterances, out_dir, signals)
        # Rank 0 alone knows the whole job's outcome; under torchrun a failing
        # process would also make torchrun stop the others.
        bad = summary.counts["error"] + (settings.strict and summary.counts["suspect"] + summary.counts["truncated"])
        failed = bad and (group is None or group.rank == 0)
        if not settings.quiet:
            click.echo(_summary_lines(summary, out_dir), err=True)
        elif failed:   # a quiet run that fails says so: cron mails only what is printed
            click.echo(f"tts-batch: {_counts(summary)}; the manifest gives each line's reason: "
                       f"{out_dir / 'manifest.jsonl'}", err=True)
        common, unsaid = _common_failure(summary), _unsaid(summary)
        if common is not None and (group is None or group.rank == 0):
            click.echo(f"tts-batch: {common}", err=True)
        if unsaid is not None and (group is None or group.rank == 0):   # even under --quiet: a wrong label
            click.echo(f"tts-batch: warning: {unsaid}", err=True)
        if signals.received is not None and (group is None or group.rank == 0):   # the status says a signal
            click.echo(f"tts-batch: {signal.Signals(signals.received).name} received after the last line was "
                       f"written: every line has its row in {out_dir / 'manifest.jsonl'}", err=True)
        sys.exit(signals.exit_status or (EXIT_LINE_ERRORS if failed else 0))


def _checked(corpus: Path, out_dir: Path, recipe: str, format_: str | None, options: dict):
    """The settings and the corpus's lines, or one line and exit status 2
    for a bad option, recipe, path or corpus: all of it before torch is
    imported, so a mistake is reported at once."""
    from tts_cli.corpus import STDIN, CorpusError, format_hint, read_corpus
    from tts_cli.errors import FatalError
    from tts_cli.synthesizer import check_files, check_output

    try:
        settings = load_settings(recipe, {"format": format_, **options})
    except ConfigError as e:
        fatal(str(e))
    try:
        check_files(settings)
        check_output(out_dir)
    except FatalError as e:
        fatal(str(e))
    if str(corpus) == STDIN and _under_torchrun():
        fatal("a corpus on standard input cannot be shared by torchrun's processes; save it to a file "
              "and pass its path")
    try:
        utterances = read_corpus(corpus, settings.format)
    except CorpusError as e:
        fatal(str(e))
    hint = format_hint(corpus, utterances, settings.format)
    if hint is not None and os.environ.get("RANK", "0") == "0":   # the ids would be spoken: even under --quiet
        click.echo(f"tts-batch: warning: {hint}", err=True)
    return settings, utterances


def _under_torchrun() -> bool:
    """torchrun sets WORLD_SIZE (distributed.from_environment reads it)."""
    return os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1")


def _synth(settings, utterances, out_dir, signals):
    """The run, or its end: one line and the exit status for a usage or
    output error (2) and for a signal (130, 143)."""
    from tts_cli.errors import FatalError
    from tts_cli.pipeline import Interrupted
    from tts_cli.synthesizer import Synthesizer

    group, joined, ends = None, contextlib.nullcontext(), (FatalError,)
    if _under_torchrun():   # torch.distributed; a run on its own does not import torch until it has work
        from tts_cli import distributed
        if settings.layout == "webdataset":
            from tts_cli.tarshards import ONE_PROCESS
            fatal(ONE_PROCESS)
        try:
            group = distributed.from_environment()
            settings = _for_rank(settings, group)
        except distributed.GroupError as e:
            fatal(str(e))
        joined, ends = distributed.joined(group, settings.device), (FatalError, distributed.GroupError)
    echo = _notices(settings.quiet) if group is None or group.rank == 0 else lambda message: None   # said once
    try:
        with joined:
            summary = Synthesizer(settings).synthesize_to_dir(utterances, out_dir, on_notice=echo, signals=signals,
                                                              group=group)
    except ends as e:
        fatal(str(e))
    except Interrupted as e:
        _stopped(e, group, settings.force)
        sys.exit(signals.exit_status)
    return summary, settings, group


def _for_rank(settings, group):
    """Each process on its own GPU; rank 0 alone shows progress and the summary."""
    from tts_cli.distributed import device_for
    return dataclasses.replace(settings, device=device_for(group, settings.device),
                               quiet=settings.quiet or group.rank != 0)


@main.command("export")
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True, path_type=Path), metavar="OUT")
@click.option("--to", "formats", default=",".join(EXPORTS), show_default=True,
              help="Comma-separated: hf (audiofolder metadata.jsonl), lhotse (recordings.jsonl.gz, "
                   "supervisions.jsonl.gz), kaldi (kaldi/wav.scp, text, utt2spk, spk2utt), nemo "
                   "(nemo_manifest.jsonl).")
@click.option("--include-suspect", is_flag=True, help="Also the lines marked suspect (default: ok lines only).")
def export_command(out_dir: Path, formats: str, include_suspect: bool):
    """Write the manifests training tools read from OUT/manifest.jsonl:
    the ok lines (and with --include-suspect the suspect ones), each with
    the normalized text its audio speaks; lines with ARPAbet in braces are
    left out (their transcript is phones). A later run into OUT writes them
    again from its manifest (OUT/exports.json lists them)."""
    from tts_cli.export import export, finish_first

    if not (out_dir / "manifest.jsonl").is_file():
        fatal(f"{out_dir}: no manifest.jsonl; give the -o folder of a tts-batch run")
    try:
        exported = export(out_dir, [name.strip() for name in formats.split(",") if name.strip()], include_suspect)
    except (ValueError, OSError) as e:
        fatal(str(e))
    for name, paths in exported.files.items():
        click.echo(f"{name}: {', '.join(str(path) for path in paths)}", err=True)
    click.echo(exported.summary, err=True)
    if "pending" in exported.left_out:   # even a cron log must say the dataset is short
        click.echo(f"tts-batch: warning: the run is unfinished ({plural(exported.left_out['pending'], 'line')} "
                   f"pending, not exported); {finish_first()}, which writes these exports again", err=True)


def _resume_hint(group=None, force: bool = False) -> str:
    """The command that finishes the run and keeps what it made: the same
    one, less --force (which would make every line again); with
    --no-force where the run's recipe forces."""
    again = [arg for arg in sys.argv[1:] if arg != "--force"]
    if force and len(again) == len(sys.argv[1:]):   # forced by the recipe
        again.append("--no-force")
        change = " with --no-force (the recipe sets force)"
    else:
        change = " without --force" if len(again) < len(sys.argv[1:]) else ""
    if group is not None:
        return f"to finish, run the same command again{change} (with any number of processes)"
    return f"to finish, run the same command again{change}: tts-batch {shlex.join(again)}"


def _stopped(e, group, force: bool) -> None:
    """One line, even with --quiet: a cron log must say why the run ended."""
    who, whose = (f"{group}: ", "its ") if group else ("", "")
    click.echo(f"tts-batch: {who}{e} received; {e.done} of {whose}{e.total} lines are done and "
               f"{e.saved} is saved; {_resume_hint(group, force)}", err=True)


def _common_failure(summary) -> str | None:
    """One line when most lines failed for one reason (a wrong --format, an
    encoding): the reason, which names the fix, is otherwise only in the
    manifest's rows."""
    reasons = collections.Counter(summary.failed.values())
    if not reasons:
        return None
    reason, n = reasons.most_common(1)[0]
    if n < 2 or 2 * n <= summary.lines:
        return None
    return f"{n} of {summary.lines} lines failed for one reason: {reason}"


def _unsaid(summary) -> str | None:
    """One line for the lines whose audio leaves out what their text says
    (characters the voice cannot say, letters of another script): they are
    suspect, and a dataset made from the output must hear of them."""
    if not summary.unsaid:
        return None
    line, what = next(iter(summary.unsaid.items()))
    return (f"{plural(len(summary.unsaid), 'line')} with characters the voice cannot say (line {line}: {what[:12]!r}), "
            "marked suspect: the manifest's reasons name them")


def _notices(quiet: bool):
    """How the run's notices reach stderr: all of them, or under --quiet
    only those that change what the output is (``errors.OutputNotice``)."""
    from tts_cli.errors import OutputNotice

    def echo(message: str) -> None:
        if not quiet or isinstance(message, OutputNotice):
            click.echo(message if not quiet else f"tts-batch: warning: {message}", err=True)
    return echo


def _summary_lines(summary, out_dir: Path) -> str:
    manifest = out_dir / "manifest.jsonl"
    if not summary.lines:
        written = f"manifest: {manifest}" if manifest.exists() else f"nothing written to {out_dir}"
        return f"the corpus has no lines: nothing to do; {written}"
    seed = f"seed {summary.seed}" + (f" ({summary.seed_source})" if summary.seed_source != "given" else "")
    if summary.made == 0:
        return (f"nothing to do: {_counts(summary)}; {summary.reused:,} reused from an earlier run "
                f"({summary.audio_seconds:.1f} s of audio); {seed}; manifest: {manifest}")
    clipped = f"; {plural(summary.clipped_samples, 'sample')} clipped" if summary.clipped_samples else ""
    retried = f"; {plural(summary.retried, 'line')} retried" if summary.retried else ""
    return (f"{_counts(summary)}; {summary.reused:,} reused from an earlier run{retried}{clipped}\n"
            f"{summary.made_seconds:.1f} s of audio made in {summary.wall_seconds:.1f} s "
            f"({summary.speed:.1f} audio seconds per second{_per_process(summary)}; "
            f"model load {summary.load_seconds:.1f} s); "
            f"{seed}; manifest: {manifest}")


def _counts(summary) -> str:
    """``5 lines: 4 ok, 1 skipped``."""
    by_status = ", ".join(f"{n:,} {status}" for status, n in summary.counts.items() if n)
    return f"{plural(summary.lines, 'line')}: {by_status}"


def _per_process(summary) -> str:
    if summary.processes == 1:
        return ""
    return f" on {summary.processes} processes, {summary.speed / summary.processes:.1f} per process"


@main.command()
@click.option("--corpus", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Corpus to run. [default: the first 2,000 LJSpeech transcripts, shipped]")
@click.option("--format", "format_", type=click.Choice(CORPUS_FORMATS), default="ljspeech",
              show_default=True, help="Corpus format.")
@click.option("--lines", type=click.IntRange(min=1), help="Use only the first N lines.")
@click.option("--batch-size", type=click.IntRange(min=1), default=BATCH_SIZES["cuda"], show_default=True,
              help="Most lines per batch.")
@click.option("--baseline-lines", type=click.IntRange(min=1), default=10, show_default=True,
              help="Lines run through the naive batch-of-one loop for the speed-up ratio.")
@click.option("--device", help="cuda or cuda:N (a CPU is refused). [default: cuda; under torchrun each "
              "process takes the GPU of its LOCAL_RANK]")
@click.option("--precision", type=click.Choice(PRECISION_NAMES), help="Model dtype. [default: fp16]")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JSON here (under torchrun: rank 0 writes it).")
@click.option("--end-to-end-only", is_flag=True,
              help="Only the corpus run end to end (audio seconds per wall second, startup): "
                   "the one-GPU figure to compare a torchrun bench with.")
def bench(corpus, format_, lines, batch_size, baseline_lines, device, precision, json_path, end_to_end_only):
    """Benchmark on random full-size weights (no download): one run, one
    table, on a GPU (on a CPU the bench's 2,000 lines would take hours: it
    is refused).

    \b
    Under torchrun, one process per GPU:
      torchrun --nproc_per_node=N -m tts_cli bench --batch-size 128 --json N.json
    only the end-to-end run is measured, over all N processes together (GPU
    busy, decoder ms per step, TFLOP/s and the naive-loop baseline describe
    one GPU and are skipped); rank 0 prints the table. Compare with
    --end-to-end-only on one GPU for the scaling ratio.
    """
    from tts_cli import distributed
    from tts_cli.bench import SAMPLE_CORPUS, BenchSettings, run_bench
    from tts_cli.bench_report import format_end_to_end_table, format_table, write_json

    try:
        group = distributed.from_environment()
        if group is not None:
            device = distributed.device_for(group, device)
    except distributed.GroupError as e:
        fatal(str(e))
    settings = BenchSettings(corpus=corpus or SAMPLE_CORPUS, format=format_, lines=lines,
                             batch_size=batch_size, baseline_lines=baseline_lines,
                             device=device, precision=precision, end_to_end_only=end_to_end_only)
    if group is not None:
        _bench_processes(settings, group, json_path)
        return
    try:
        result = run_bench(settings, echo=lambda m: click.echo(m, err=True))
    except ValueError as e:
        fatal(str(e))
    click.echo((format_end_to_end_table if end_to_end_only else format_table)(result))
    if json_path:
        write_json(result, json_path)


def _bench_processes(settings, group, json_path) -> None:
    """The bench under torchrun: every process runs its share of the corpus;
    rank 0 alone prints the table and writes the JSON."""
    from tts_cli import distributed
    from tts_cli.bench import run_bench_processes
    from tts_cli.bench_report import format_end_to_end_table, write_json
    from tts_cli.errors import FatalError

    try:
        with distributed.joined(group, settings.device):
            result = run_bench_processes(settings, group, echo=lambda m: click.echo(m, err=True))
    except (ValueError, FatalError, distributed.GroupError) as e:
        fatal(str(e))
    if result is None:
        return
    click.echo(format_end_to_end_table(result))
    if json_path:
        write_json(result, json_path)
