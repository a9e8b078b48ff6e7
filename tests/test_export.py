"""tts-batch export: the manifests training tools read, from a run's manifest."""
import gzip
import importlib
import json
import os
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner

from outputs import manifest
from tts_cli.cli import main

CORPUS = "Printing, in the only sense.\n\nIt cost $3.50 in 1963.\nHi.\n日本語\nTurn left on {HH AW1 S} Street.\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_checkpoints):
    """A run with ok, skipped and suspect lines (日本語 is in another script),
    and a line with ARPAbet."""
    folder = tmp_path_factory.mktemp("export")
    (folder / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    out = folder / "out"
    result = CliRunner().invoke(main, [str(folder / "corpus.txt"), "-o", str(out), "--tacotron2",
                                       str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]),
                                       "--device", "cpu", "--max-decoder-steps", "12", "--seed", "1", "-q", "--no-check-alignment",
                                       "--audio-format", "flac", "--sample-rate", "16000"])
    assert result.exit_code == 0, result.output
    rows = manifest(out)
    assert {r["status"] for r in rows} >= {"ok", "suspect", "skipped"}
    return out, rows


def exported(out: Path, *args: str):
    result = CliRunner().invoke(main, ["export", str(out), *args])
    assert result.exit_code == 0, result.output
    return result


def going_in(rows, statuses=("ok",)):
    """The rows of ``statuses`` whose transcript is words (no ARPAbet), by id."""
    return sorted((r for r in rows if r["status"] in statuses and "{" not in r["normalized_text"]),
                  key=lambda r: r["id"])


def said(row) -> str:
    """A row's transcript as the exports give it: its normalized text, single-spaced."""
    return " ".join(row["normalized_text"].split())


def transcripts(out, names=("hf", "lhotse", "kaldi", "nemo")):
    """Each export's (id, transcript) pairs, in file order."""
    def jsonl(data, *keys):
        return [tuple(item[key] for key in keys) for item in map(json.loads, data.splitlines())]
    read = {"hf": lambda: jsonl((out / "metadata.jsonl").read_text(), "id", "transcription"),
            "lhotse": lambda: jsonl(gzip.decompress((out / "supervisions.jsonl.gz").read_bytes()).decode(),
                                    "id", "text"),
            "kaldi": lambda: [tuple(line.split(" ", 1)) for line in (out / "kaldi" / "text").read_text().splitlines()],
            "nemo": lambda: [(Path(path).stem, text) for path, text
                             in jsonl((out / "nemo_manifest.jsonl").read_text(), "audio_filepath", "text")]}
    return {name: read[name]() for name in names}


def test_each_format_holds_the_ok_lines_with_the_text_their_audio_speaks(made):
    out, rows = made
    exported(out)
    ok = going_in(rows)
    hf = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert [(h["id"], h["transcription"]) for h in hf] == [(r["id"], said(r)) for r in ok]
    for h in hf:    # audiofolder: file names relative to the metadata file
        assert sf.info(out / h["file_name"]).duration == pytest.approx(h["duration"], abs=1e-6)
    recordings = [json.loads(line) for line in gzip.decompress((out / "recordings.jsonl.gz").read_bytes()).splitlines()]
    supervisions = [json.loads(line) for line in
                    gzip.decompress((out / "supervisions.jsonl.gz").read_bytes()).splitlines()]
    assert [s["text"] for s in supervisions] == [said(r) for r in ok]
    for rec in recordings:
        info = sf.info(rec["sources"][0]["source"])
        assert (info.samplerate, info.frames) == (rec["sampling_rate"], rec["num_samples"]) == (16000, info.frames)
    kaldi = {name: (out / "kaldi" / name).read_text().splitlines() for name in ("wav.scp", "text", "utt2spk")}
    assert [line.split(" ", 1)[0] for line in kaldi["text"]] == sorted(r["id"] for r in ok)   # sorted, as Kaldi needs
    assert all(line.endswith(".flac |") and " flac -c -d -s /" in line for line in kaldi["wav.scp"])
    nemo = [json.loads(line) for line in (out / "nemo_manifest.jsonl").read_text().splitlines()]
    assert [n["text"] for n in nemo] == [said(r) for r in ok]


def test_nemo_reads_its_manifest_rows(made):
    """NeMo's manifest reader takes ``audio_filepath`` through expanduser
    (a path, never null) and ``text`` as the transcript."""
    out, rows = made
    exported(out, "--to", "nemo")
    by_text = {said(r): r for r in going_in(rows)}
    nemo = [json.loads(line) for line in (out / "nemo_manifest.jsonl").read_text().splitlines()]
    assert len(nemo) == len(by_text) and all(set(n) == {"audio_filepath", "duration", "text"} for n in nemo)
    for n in nemo:
        path = Path(os.path.expanduser(n["audio_filepath"]))
        assert path.is_absolute() and sf.info(path).duration == pytest.approx(n["duration"], abs=1e-6)
        assert path.name == Path(by_text[n["text"]]["audio_filepath"]).name


def test_kaldi_finds_the_audio_under_a_folder_with_spaces(made, tmp_path):
    """wav.scp splits a line at white space and runs a piped one in a
    shell: a path with a space is quoted into the pipe."""
    out = tmp_path / "my data" / "out"
    shutil.copytree(made[0], out)
    exported(out, "--to", "kaldi")
    for line in (out / "kaldi" / "wav.scp").read_text().splitlines():
        utterance, rxfilename = line.split(" ", 1)
        command = shlex.split(rxfilename.removesuffix("|"))
        assert command[:4] == ["flac", "-c", "-d", "-s"] and len(command) == 5
        assert Path(command[4]).is_file() and Path(command[4]).stem == utterance


def test_suspect_lines_go_in_only_when_asked(made):
    out, rows = made
    exported(out, "--to", "hf", "--include-suspect")
    ids = [json.loads(line)["id"] for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert ids == [r["id"] for r in going_in(rows, ("ok", "suspect"))]


def test_a_line_with_arpabet_is_in_no_export_and_the_command_says_so(made):
    """Its normalized text keeps the phones in braces, which the audio
    speaks as a word: no recognizer may learn that as its transcript."""
    out, rows = made
    [braced] = [r for r in rows if "{HH AW1 S}" in r["normalized_text"]]
    assert braced["status"] == "ok"
    result = exported(out, "--include-suspect")
    for name, lines in transcripts(out).items():
        assert lines == [(r["id"], said(r)) for r in going_in(rows, ("ok", "suspect"))], name
        assert braced["id"] not in dict(lines) and not any("{" in text for _, text in lines), name
    assert f"exported {len(going_in(rows, ('ok', 'suspect')))} lines; left out: 1 skipped, 1 with ARPAbet" \
        in result.output


def edited(made, out, statuses):
    """``made``'s audio and manifest (no export) in ``out``, the rows of
    ``statuses``' ids set to those statuses, as a run leaves them."""
    shutil.copytree(made / "wavs", out / "wavs")
    rows = manifest(made)
    for row in rows:
        if row["id"] in statuses:
            row.update(status=statuses[row["id"]], audio_filepath=None, duration=0.0, num_samples=0, pieces=0)
    (out / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_an_unfinished_run_exports_its_done_lines_and_says_what_is_left_out(made, tmp_path):
    rows = edited(made[0], tmp_path, {"000001": "pending", "000003": "error"})
    result = exported(tmp_path)
    assert [r["id"] for r in going_in(rows)] == ["000004"]
    assert result.output.splitlines()[-2:] == [
        "exported 1 line; left out: 1 suspect (--include-suspect adds them), 1 skipped, 1 error, 1 pending, "
        "1 with ARPAbet",
        "tts-batch: warning: the run is unfinished (1 line pending, not exported); finish the run first: "
        "the same tts-batch command again, which writes these exports again"]


def test_a_manifest_with_no_line_to_export_is_one_line_and_nothing_is_written(made, tmp_path):
    edited(made[0], tmp_path, {r["id"]: "pending" for r in made[1] if r["status"] == "ok"})
    result = CliRunner().invoke(main, ["export", str(tmp_path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "no line to export (left out: 1 suspect (--include-suspect adds them), 1 skipped, 4 pending)" \
        in result.output and "finish the run first: the same tts-batch command again" in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["manifest.jsonl", "wavs"]


@pytest.mark.parametrize("formats", ["hf,lhotse,kaldi,nemo", "nemo"])
def test_a_missing_audio_file_is_one_line_naming_it_and_nothing_is_written(made, tmp_path, formats):
    edited(made[0], tmp_path, {})
    gone = tmp_path / "wavs" / "000003.flac"
    gone.unlink()
    result = CliRunner().invoke(main, ["export", str(tmp_path), "--to", formats])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{gone}: no such file" in result.output
    assert "run the same tts-batch command again: it makes missing files again" in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["manifest.jsonl", "wavs"]


def test_audio_kaldi_cannot_read_the_header_of_is_one_line_and_nothing_is_written(made, tmp_path):
    edited(made[0], tmp_path, {})
    damaged = tmp_path / "wavs" / "000003.flac"
    damaged.write_bytes(b"not audio")
    result = CliRunner().invoke(main, ["export", str(tmp_path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{damaged}: cannot read its header" in result.output and "remove it and run the same" in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["manifest.jsonl", "wavs"]


def synthesized(folder, checkpoints, *lines):
    """``tts-batch corpus.txt -o out`` over ``lines``, cut at 20 symbols: a
    longer line has more pieces, and more seconds."""
    (folder / "corpus.txt").write_text("".join(line + "\n" for line in lines))
    return CliRunner().invoke(main, [str(folder / "corpus.txt"), "-o", str(folder / "out"), "--tacotron2",
                                     str(checkpoints[0]), "--waveglow", str(checkpoints[1]), "--device", "cpu",
                                     "--max-decoder-steps", "12", "--seed", "1", "--no-check-alignment",
                                     "--max-symbols-per-piece", "20"])


def durations(out):
    """Each export's (id, seconds) pairs, in file order (Kaldi's data folder has none)."""
    def jsonl(name):
        data = (out / name).read_bytes()
        return [json.loads(line) for line in (gzip.decompress(data) if name.endswith(".gz") else data).splitlines()]
    return {"hf": [(item["id"], item["duration"]) for item in jsonl("metadata.jsonl")],
            "lhotse": [(item["id"], item["duration"]) for item in jsonl("supervisions.jsonl.gz")],
            "nemo": [(Path(item["audio_filepath"]).stem, item["duration"]) for item in jsonl("nemo_manifest.jsonl")]}


def test_a_rerun_writes_the_exports_again_with_a_changed_line_s_text_and_duration(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.").exit_code == 0
    exported(out)
    before = manifest(out)
    result = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.",
                         "Hi there. And a second sentence follows.")
    assert result.exit_code == 0 and "exports refreshed: hf, lhotse, kaldi, nemo (2 lines)" in result.output
    rows = manifest(out)
    assert rows[1]["normalized_text"] == "hi there. and a second sentence follows."
    assert rows[1]["duration"] > before[1]["duration"] and rows[0] == before[0]
    for name, lines in transcripts(out).items():
        assert lines == [(r["id"], said(r)) for r in rows], name
    for name, lines in durations(out).items():
        assert lines == [(r["id"], r["duration"]) for r in rows], name
    recordings = gzip.decompress((out / "recordings.jsonl.gz").read_bytes()).splitlines()
    assert [json.loads(line)["num_samples"] for line in recordings] == [r["num_samples"] for r in rows]


def test_a_run_stopped_early_leaves_a_changed_line_out_of_the_exports(tmp_path, tiny_checkpoints):
    """Through the Python front door: the job is the command's, exports and all."""
    from tts_cli import Synthesizer
    from tts_cli.pipeline import Interrupted
    from tts_cli.signals import StopOnSignals

    s = Synthesizer.load(*tiny_checkpoints, device="cpu", max_decoder_steps=12, check_alignment=False)
    out = tmp_path / "out"
    s.synthesize_to_dir(["Printing, in the only sense.", "Hi."], out, seed=1)
    exported(out, "--to", "hf,kaldi", "--include-suspect")
    notices = []
    with StopOnSignals() as signals, pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGTERM)   # as the run starts: it makes nothing
        s.synthesize_to_dir(["Printing, in the only sense.", "Hi there."], out, seed=1, signals=signals,
                            on_notice=notices.append)
    assert [r["status"] for r in manifest(out)] == ["ok", "pending"]
    assert "exports refreshed: hf, kaldi (1 line)" in notices
    [warning] = [notice for notice in notices if "pending" in notice]
    assert "exports hold no line of the 1 line still pending" in warning and "same synthesize_to_dir call" in warning
    assert transcripts(out, ("hf", "kaldi")) == {name: [("000001", "printing, in the only sense.")]
                                                 for name in ("hf", "kaldi")}


def test_exports_without_a_record_are_left_as_they_are(tmp_path, tiny_checkpoints):
    """Those an earlier version wrote: which exports, with which lines, is not known."""
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.").exit_code == 0
    exported(out, "--to", "hf")
    (out / "exports.json").unlink(missing_ok=True)
    earlier = (out / "metadata.jsonl").read_bytes()
    result = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi there.")
    assert result.exit_code == 0 and "exports refreshed" not in result.output
    assert (out / "metadata.jsonl").read_bytes() == earlier


def test_a_refresh_that_fails_is_one_warning_and_the_run_stands(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.").exit_code == 0
    exported(out, "--to", "hf")
    (out / "wavs" / "000001.wav").unlink()
    (out / "exports.json").write_text("{not json")
    result = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi there.")
    assert result.exit_code == 0, result.output
    [warning] = [line for line in result.output.splitlines() if "exports not refreshed" in line]
    assert warning.startswith("exports not refreshed, and they may hold lines as an earlier run made them: ")
    assert f"{out / 'exports.json'}: not a record of exports" in warning
    assert [r["normalized_text"] for r in manifest(out)] == ["printing, in the only sense.", "hi there."]
    assert (out / "wavs" / "000001.wav").is_file()


def test_a_run_that_leaves_no_line_to_export_removes_the_exports_and_a_later_one_makes_them_again(
        tmp_path, tiny_checkpoints):
    """Lines of another script (suspect, left out) where the exported lines
    were: the exports must not pair the old transcripts with the new audio."""
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.").exit_code == 0
    exported(out, "--to", "hf,kaldi")
    result = synthesized(tmp_path, tiny_checkpoints, "東京", "京都")
    assert result.exit_code == 0 and not (out / "metadata.jsonl").exists() and not (out / "kaldi" / "text").exists()
    [notice] = [line for line in result.output.splitlines() if "exports removed" in line]
    assert "metadata.jsonl" in notice and "no line to export" in notice
    result = synthesized(tmp_path, tiny_checkpoints, "Hello there.", "京都")
    assert result.exit_code == 0 and "exports refreshed: hf, kaldi (1 line)" in result.output
    assert transcripts(out, ("hf", "kaldi")) == {name: [("000001", "hello there.")] for name in ("hf", "kaldi")}


def test_a_refresh_cut_short_is_finished_by_the_next_run_with_nothing_to_do(tmp_path, tiny_checkpoints, monkeypatch):
    """A SIGKILL after the manifest is saved and before the exports are: the
    record still names the manifest they were made from, not this one."""
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.").exit_code == 0
    exported(out, "--to", "hf")
    with monkeypatch.context() as patched:
        patched.setattr("tts_cli.pipeline.refresh_saying", lambda *args, **kwargs: None)   # killed there
        assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.").exit_code == 0
    assert len(transcripts(out, ("hf",))["hf"]) == 1
    again = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.")
    assert again.exit_code == 0 and "nothing to do" in again.output and "exports refreshed: hf (2 lines)" in again.output
    assert len(transcripts(out, ("hf",))["hf"]) == 2
    after = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.")
    assert "exports refreshed" not in after.output   # made from this manifest: nothing to write


def test_a_record_whose_choice_is_not_true_or_false_is_refused(made):
    out, _ = made
    exported(out, "--to", "hf")
    record = json.loads((out / "exports.json").read_text())
    record["exports"]["hf"]["include_suspect"] = "no"
    (out / "exports.json").write_text(json.dumps(record))
    result = CliRunner().invoke(main, ["export", str(out), "--to", "hf"])
    assert result.exit_code == 2 and "include_suspect true or false" in result.output
    (out / "exports.json").unlink()


def test_the_files_each_export_is_known_by_are_those_it_writes(made):
    from tts_cli.export import FILES
    out, _ = made
    result = exported(out)
    for name, paths in FILES.items():
        assert all((out / path).is_file() for path in paths), name
        assert f"{name}: " + ", ".join(str(out.resolve() / path) for path in paths) in result.output


def test_lhotse_loads_them_with_the_files_durations(made):
    lhotse = pytest.importorskip("lhotse")
    out, rows = made
    exported(out, "--to", "lhotse")
    cuts = lhotse.CutSet.from_manifests(recordings=lhotse.load_manifest(out / "recordings.jsonl.gz"),
                                        supervisions=lhotse.load_manifest(out / "supervisions.jsonl.gz"))
    by_id = {r["id"]: r for r in rows}
    for cut in cuts:
        audio = cut.load_audio()
        assert audio.shape[1] == by_id[cut.recording_id]["num_samples"]
        assert cut.supervisions[0].text == said(by_id[cut.recording_id])


def test_datasets_loads_the_audiofolder(made):
    datasets = pytest.importorskip("datasets")
    if int(datasets.__version__.split(".")[0]) >= 4:
        try:   # datasets 4 and later store audio through torchcodec, which needs FFmpeg's libraries, even to load
            importlib.import_module("torchcodec.decoders")
        except (ImportError, OSError, RuntimeError) as e:
            pytest.skip(f"datasets cannot store audio here: torchcodec does not load ({str(e)[:80]})")
    out, rows = made
    exported(out, "--to", "hf")
    loaded = datasets.load_dataset("audiofolder", data_dir=str(out), split="train")
    by_text = {said(r): r for r in going_in(rows)}
    assert sorted(loaded["transcription"]) == sorted(by_text)
    # the files as datasets found them, read here (its decoder wants librosa or torchcodec, not needed to load)
    for item in loaded.cast_column("audio", datasets.Audio(decode=False)):
        row, info = by_text[item["transcription"]], sf.info(item["audio"]["path"])
        assert info.frames == row["num_samples"] and info.duration == pytest.approx(item["duration"], abs=1e-6)


def test_mistakes_are_one_line(tmp_path, made):
    out, _ = made
    result = CliRunner().invoke(main, ["export", str(out), "--to", "hf,espnet"])
    assert result.exit_code == 2 and "unknown export espnet; use any of: hf, lhotse, kaldi, nemo" in result.output
    result = CliRunner().invoke(main, ["export", str(out), "--to", ","])
    assert result.exit_code == 2 and "no export named; use any of: hf, lhotse, kaldi, nemo" in result.output
    result = CliRunner().invoke(main, ["export", str(tmp_path)])
    assert result.exit_code == 2 and "no manifest.jsonl" in result.output


@pytest.mark.parametrize("sample_format, audio_format", [("float32", "wav"), ("pcm24", "flac"), ("pcm16", "wav")])
def test_kaldi_is_given_16_bit_pcm_whatever_the_files_hold(tmp_path, tiny_checkpoints, sample_format, audio_format):
    """Kaldi's wave reader takes 16-bit PCM and nothing else."""
    (tmp_path / "corpus.txt").write_text("Printing, in the only sense.\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [str(tmp_path / "corpus.txt"), "-o", str(out), "--tacotron2",
                                       str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]),
                                       "--device", "cpu", "--max-decoder-steps", "12", "-q", "--no-check-alignment",
                                       "--sample-format", sample_format, "--audio-format", audio_format])
    assert result.exit_code == 0, result.output
    exported(out, "--to", "kaldi")
    [line] = (out / "kaldi" / "wav.scp").read_text().splitlines()
    path = str(out / manifest(out)[0]["audio_filepath"])
    expected = {"float32": f"sox {path} -t wav -b 16 - |", "pcm24": f"sox {path} -t wav -b 16 - |",
                "pcm16": path}[sample_format]
    assert line == f"000001 {expected}"


def test_a_transcript_is_single_spaced_where_the_front_end_left_out_a_character(tmp_path, tiny_checkpoints):
    """The model reads " smile" for "😀 smile"; a recognizer's transcript has no stray space."""
    (tmp_path / "corpus.txt").write_text("😀 smile\n", encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [str(tmp_path / "corpus.txt"), "-o", str(out), "--tacotron2",
                                       str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]),
                                       "--device", "cpu", "--max-decoder-steps", "12", "-q", "--no-check-alignment"])
    assert result.exit_code == 0, result.output
    assert manifest(out)[0]["normalized_text"] == " smile"
    exported(out, "--include-suspect")
    assert set(map(tuple, transcripts(out).values())) == {(("000001", "smile"),)}


def test_an_export_whose_refresh_failed_is_made_by_a_later_run_though_another_was_refreshed(
        tmp_path, tiny_checkpoints):
    """Two exports refreshed apart (one takes the suspect lines): the one
    that could not be written again stays known as made from the older
    manifest, so the next run, with nothing to do, tries it again."""
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.").exit_code == 0
    exported(out, "--to", "hf")
    exported(out, "--to", "kaldi", "--include-suspect")
    wav = out / "wavs" / "000001.wav"
    good = wav.read_bytes()
    wav.write_bytes(b"X" * 12 + good[12:])   # a header Kaldi's check cannot read; the run reuses it (same size)
    result = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.")
    assert result.exit_code == 0 and "exports refreshed: hf (2 lines)" in result.output
    [warning] = [line for line in result.output.splitlines() if "exports not refreshed" in line]
    assert warning.startswith("exports not refreshed (kaldi), and they may") and "cannot read its header" in warning
    assert len(transcripts(out, ("kaldi",))["kaldi"]) == 1   # as it was
    wav.write_bytes(good)
    again = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.")
    assert "nothing to do" in again.output and "exports refreshed: kaldi (2 lines)" in again.output
    assert transcripts(out, ("hf", "kaldi")) == {name: [("000001", "printing, in the only sense."),
                                                        ("000002", "hi.")] for name in ("hf", "kaldi")}


def test_a_refresh_stopped_by_a_signal_is_said_and_left_to_the_next_run(tmp_path, tiny_checkpoints):
    """A second Ctrl-C while a refresh writes (of a million lines: minutes)
    stops it at once; the exports it did not write are the next run's."""
    import threading

    from tts_cli.export import refresh_saying

    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.").exit_code == 0
    exported(out, "--to", "hf,nemo")
    earlier = {name: (out / name).read_bytes() for name in ("metadata.jsonl", "nemo_manifest.jsonl", "exports.json")}
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.").exit_code == 0
    (out / "exports.json").write_bytes(earlier["exports.json"])   # as if the run had not refreshed them
    for name in ("metadata.jsonl", "nemo_manifest.jsonl"):
        (out / name).write_bytes(earlier[name])
    stop, notices = threading.Event(), []
    stop.set()
    refresh_saying(out, notices.append, stop)
    [notice] = notices
    assert "exports not all refreshed (stopped by a signal)" in notice and "the next run into" in notice
    assert {name: (out / name).read_bytes() for name in earlier} == earlier
    again = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.")
    assert "exports refreshed: hf, nemo (2 lines)" in again.output
    assert [len(lines) for lines in transcripts(out, ("hf", "nemo")).values()] == [2, 2]


def test_an_export_that_cannot_be_written_again_leaves_the_others_refreshed(
        tmp_path, tiny_checkpoints):
    """A folder where hf's metadata.jsonl goes: hf is said not refreshed,
    and the exports beside it are written again all the same."""
    out = tmp_path / "out"
    assert synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.").exit_code == 0
    exported(out, "--to", "hf,lhotse,nemo")
    (out / "metadata.jsonl").unlink()
    (out / "metadata.jsonl").mkdir()
    result = synthesized(tmp_path, tiny_checkpoints, "Printing, in the only sense.", "Hi.")
    [warning] = [line for line in result.output.splitlines() if "exports not refreshed" in line]
    assert warning.startswith("exports not refreshed (hf)") and "exports refreshed: lhotse (2 lines), nemo (2 lines)"\
        in result.output
    assert [len(lines) for lines in transcripts(out, ("lhotse", "nemo")).values()] == [2, 2]
