"""Tests for tts_cli.manifest: one JSON line per corpus line, written atomically."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from tts_cli import audio
from tts_cli.manifest import (STATUSES, ManifestRow, as_written, manifest_rows_at, read_manifest,
                              row_without_audio, write_manifest)


def make_row(**overrides) -> ManifestRow:
    fields = dict(
        id="LJ001-0001", line=1, text="Printing, in 1490.", normalized_text="printing, in fourteen ninety.",
        audio_filepath="wavs/LJ001-0001.wav", duration=1.5, num_samples=33075, mel_frames=129,
        status="ok", reason=None,
    )
    fields.update(overrides)
    return ManifestRow(**fields)


def sample_rows() -> list[ManifestRow]:
    return [
        make_row(),
        make_row(id="LJ001-0002", line=2, text="Ünïcode — “quotes”", normalized_text="unicode quotes",
                 audio_filepath="wavs/LJ001-0002.wav", duration=10.0, num_samples=220500, mel_frames=1000,
                 status="truncated", reason="hit max_decoder_steps", clipped_samples=7, seed=1234,
                 mel_filepath="mels/LJ001-0002.npy"),
        make_row(id="line-000003", line=3, text="", normalized_text="", audio_filepath=None,
                 duration=0.0, num_samples=0, mel_frames=0, status="skipped", reason="empty line"),
        make_row(id="LJ001-0004", line=4, audio_filepath=None, duration=0.0, num_samples=0, mel_frames=0,
                 status="error", reason="CUDA out of memory"),
    ]


# --- one row as JSON ---------------------------------------------------------------------------

def test_to_json_is_one_line_with_keys_in_field_order():
    row = make_row(text="line one\nline two")
    line = row.to_json()
    assert "\n" not in line
    record = json.loads(line)
    assert list(record) == [field.name for field in dataclasses.fields(ManifestRow)]
    assert record["text"] == "line one\nline two"


def test_to_json_keeps_non_ascii_readable():
    line = make_row(text="café — naïve").to_json()
    assert "café — naïve" in line


def test_to_json_stays_one_line_for_characters_splitlines_breaks_on():
    text = "a\u2028b\u2029c\x85d\x0be\x1cf"
    line = make_row(text=text).to_json()
    assert len(line.splitlines()) == 1
    assert json.loads(line)["text"] == text


def test_to_json_rounds_duration_to_microseconds():
    assert json.loads(make_row(duration=1 / 3).to_json())["duration"] == 0.333333
    assert json.loads(make_row(duration=np.float32(2.5)).to_json())["duration"] == 2.5


def test_to_json_accepts_numpy_scalars_from_the_synthesizer():
    row = make_row(num_samples=np.int64(33075), mel_frames=np.int32(129), clipped_samples=np.int64(3))
    record = json.loads(row.to_json())
    assert (record["num_samples"], record["mel_frames"], record["clipped_samples"]) == (33075, 129, 3)


def test_to_json_refuses_a_value_json_cannot_hold_naming_its_type():
    with pytest.raises(TypeError, match="^object is not JSON serializable$"):
        make_row(alignment={"coverage": object()}).to_json()


def test_to_json_refuses_nan_duration_which_is_not_json():
    with pytest.raises(ValueError):
        make_row(duration=float("nan")).to_json()


@pytest.mark.parametrize("status", STATUSES)
def test_every_documented_status_is_accepted(status):
    assert make_row(status=status).status == status


@pytest.mark.parametrize("status", ["OK", "failed", "", None])
def test_unknown_status_is_rejected_naming_the_row_and_the_choices(status):
    with pytest.raises(ValueError) as error:
        make_row(status=status)
    message = str(error.value)
    assert "LJ001-0001" in message and "line 1" in message
    assert all(choice in message for choice in STATUSES)
    assert message.endswith("; use one of: ok, suspect, truncated, skipped, error, pending")


# --- the manifest file ----------------------------------------------------------------------------

def test_write_then_read_round_trips_every_row_in_order(tmp_path):
    path = tmp_path / "out" / "manifest.jsonl"
    rows = sample_rows()
    write_manifest(path, rows)
    assert read_manifest(path) == [json.loads(row.to_json()) for row in rows]
    assert [record["id"] for record in read_manifest(path)] == ["LJ001-0001", "LJ001-0002", "line-000003", "LJ001-0004"]


def test_manifest_file_is_utf8_jsonl_with_one_row_per_line(tmp_path):
    path = tmp_path / "manifest.jsonl"
    rows = sample_rows()
    write_manifest(path, rows)
    data = path.read_bytes()
    assert data.endswith(b"\n") and b"\r" not in data
    assert data.decode("utf-8").split("\n")[:-1] == [row.to_json() for row in rows]


def test_manifest_file_is_utf8_under_any_locale(tmp_path):
    # a job started from a shell with LANG=C must not fail on, or garble, its first non-ASCII line
    import subprocess
    import sys
    rows = sample_rows()
    write_manifest(tmp_path / "here.jsonl", rows)
    code = ("import json, sys; from tts_cli.manifest import ManifestRow, write_manifest; "
            "write_manifest(sys.argv[1], [ManifestRow(**json.loads(line)) for line in sys.stdin.read().splitlines()])")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c-locale.jsonl")], env=env,
                          input="\n".join(row.to_json() for row in rows), capture_output=True, text=True,
                          encoding="utf-8", timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c-locale.jsonl").read_bytes() == (tmp_path / "here.jsonl").read_bytes()


def test_generator_of_rows_is_accepted(tmp_path):
    path = tmp_path / "manifest.jsonl"
    write_manifest(path, (row for row in sample_rows()))
    assert len(read_manifest(path)) == 4


def test_empty_manifest_is_an_empty_file(tmp_path):
    path = tmp_path / "manifest.jsonl"
    write_manifest(path, [])
    assert path.read_bytes() == b""
    assert read_manifest(path) == []


def test_rewrite_replaces_the_previous_manifest_atomically(tmp_path):
    path = tmp_path / "manifest.jsonl"
    write_manifest(path, sample_rows())
    write_manifest(path, sample_rows()[:1])
    assert len(read_manifest(path)) == 1
    assert os.listdir(tmp_path) == ["manifest.jsonl"]


def test_failure_while_writing_keeps_the_previous_manifest_and_no_temp_file(tmp_path):
    path = tmp_path / "manifest.jsonl"
    write_manifest(path, sample_rows())
    before = path.read_bytes()

    def rows_then_crash():
        yield make_row()
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_manifest(path, rows_then_crash())
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["manifest.jsonl"]


def test_manifest_goes_through_atomic_write(tmp_path, monkeypatch):
    used = []
    real_atomic_write = audio.atomic_write

    def spying_atomic_write(path):
        used.append(path)
        return real_atomic_write(path)

    monkeypatch.setattr("tts_cli.manifest.atomic_write", spying_atomic_write)
    write_manifest(tmp_path / "manifest.jsonl", sample_rows())
    assert used == [tmp_path / "manifest.jsonl"]


# --- reading damaged manifests ---------------------------------------------------------------------

GOOD_LINE = make_row().to_json()


@pytest.mark.parametrize("bad_line, expected", [
    (b'{"id": "x", "line": 2', "not valid JSON"),  # truncated by a crash mid-write
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"id": "x"}', "missing keys line, text, normalized_text, audio_filepath, duration, num_samples, "
                     "mel_frames, status, reason; this is not a tts-batch manifest row"),
    (GOOD_LINE.replace('"status": "ok"', '"status": "done"').encode(),
     "unknown status 'done'; expected one of: ok, suspect, truncated, skipped, error, pending"),
    (GOOD_LINE.replace('"duration": 1.5', '"duration": NaN').encode(), "not valid JSON (NaN is not valid JSON)"),
    (b"\xff\xfe", "not valid UTF-8"),
])
def test_bad_row_raises_value_error_naming_path_and_line(tmp_path, bad_line, expected):
    path = tmp_path / "manifest.jsonl"
    good = GOOD_LINE.encode()
    path.write_bytes(good + b"\n" + good + b"\n" + bad_line + b"\n")
    with pytest.raises(ValueError) as error:
        read_manifest(path)
    message = str(error.value)
    assert message.startswith(f"{path}:3: ") and expected in message
    assert "\n" not in message


def test_blank_lines_are_skipped_but_line_numbers_stay_physical(tmp_path):
    path = tmp_path / "manifest.jsonl"
    good = make_row().to_json()
    path.write_text(f"{good}\n\n{good}\r\n{{broken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"manifest.jsonl:4: "):
        read_manifest(path)
    path.write_text(f"{good}\n\n{good}\r\n", encoding="utf-8")
    assert len(read_manifest(path)) == 2


# --- summary ---------------------------------------------------------------------------------------

def _journal_of(tmp_path, rows, taken=True):
    """A journal over ``rows``' lines, with the rows taken in (or not yet)."""
    from tts_cli.corpus import Utterance
    from tts_cli.journal import ManifestJournal
    utterances = [Utterance(line=row.line, id=row.id, text=row.text) for row in rows]
    return ManifestJournal(tmp_path / "manifest.jsonl", utterances, {row.line: row for row in rows if taken}, seed=3)


def test_the_summary_counts_every_status_and_totals_audio_clipping_and_failures(tmp_path):
    journal = _journal_of(tmp_path, sample_rows())
    assert journal.counts() == {"ok": 1, "suspect": 0, "truncated": 1, "skipped": 1, "error": 1, "pending": 0}
    assert (journal.audio_seconds(), sum(journal.clipped)) == (11.5, 7)
    assert journal.lines_of(journal.failed) == {4: "CUDA out of memory"}
    # the files the rows name, for the orphans' report
    assert "wavs/LJ001-0002.wav" in journal.named and "mels/LJ001-0002.npy" in journal.named
    assert "wavs/LJ001-0004.wav" not in journal.named


def test_the_summary_of_nothing_still_has_all_status_keys(tmp_path):
    journal = _journal_of(tmp_path, [])
    assert journal.counts() == {"ok": 0, "suspect": 0, "truncated": 0, "skipped": 0, "error": 0, "pending": 0}
    assert journal.audio_seconds() == 0.0 and journal.complete


def test_rows_read_from_another_process_s_partial_manifest_count_and_are_written_as_they_are(tmp_path):
    rows = sample_rows()
    write_manifest(tmp_path / "manifest.rank-1-of-2.jsonl", rows)
    journal = _journal_of(tmp_path, rows, taken=False)
    assert journal.counts()["pending"] == 4 and not journal.complete
    journal.adopt(tmp_path / "manifest.rank-1-of-2.jsonl")
    assert journal.complete and journal.counts() == _journal_of(tmp_path, rows).counts()
    journal.save(final=True)
    assert (tmp_path / "manifest.jsonl").read_bytes() == (tmp_path / "manifest.rank-1-of-2.jsonl").read_bytes()


def test_a_line_whose_audio_leaves_characters_unsaid_is_counted_with_what_it_left_out(tmp_path):
    rows = [make_row(dropped="%"), make_row(id="b", line=2, text="Привет", dropped=None),
            make_row(id="c", line=3, text="Привет", audio_filepath=None, status="error", reason="x")]
    assert _journal_of(tmp_path, rows).lines_of(_journal_of(tmp_path, rows).unsaid) == {1: "%", 2: "Привет"}


def test_reports_count_one_thing_in_the_singular_and_thousands_with_commas():
    from tts_cli.manifest import plural
    assert [plural(n, "line") for n in (0, 1, 2, 1000)] == ["0 lines", "1 line", "2 lines", "1,000 lines"]


def test_the_summary_totals_audio_to_the_microsecond(tmp_path):
    rows = [make_row(duration=1 / 3), make_row(id="b", line=2, duration=1 / 3)]
    assert _journal_of(tmp_path, rows).audio_seconds() == 0.666667


# --- the run's manifest checkpoint ------------------------------------------------------------


def _checkpoint(tmp_path, lines):
    from tts_cli.corpus import Utterance
    from tts_cli.journal import ManifestJournal
    utterances = [Utterance(line=i, id=f"u{i}", text=f"line {i}") for i in range(1, lines + 1)]
    return ManifestJournal(tmp_path / "manifest.jsonl", utterances, {}, seed=3), utterances


def test_rewriting_the_manifest_serializes_each_row_once(tmp_path, monkeypatch):
    # A corpus of millions of lines is rewritten every few seconds; serializing
    # every row each time would hold the GIL the GPU threads need for seconds.
    checkpoint, utterances = _checkpoint(tmp_path, 50)
    calls = []
    real = ManifestRow.to_json
    monkeypatch.setattr(ManifestRow, "to_json", lambda row: calls.append(row.line) or real(row))
    checkpoint.save(final=True)
    assert sorted(calls) == list(range(1, 51))
    done = dataclasses.replace(ManifestRow(**read_manifest(checkpoint.path)[4]), status="ok", reason=None,
                               audio_filepath="wavs/u5.wav", duration=1.0, num_samples=22050)
    calls.clear()
    checkpoint.record(done)
    checkpoint.save(final=True)
    assert calls == [5], "only the row that changed is serialized again"
    assert [r["status"] for r in read_manifest(checkpoint.path)].count("ok") == 1
    assert len(read_manifest(checkpoint.path)) == 50


def test_a_slow_manifest_rewrite_is_done_less_often(tmp_path, monkeypatch):
    from tts_cli import journal
    checkpoint, _ = _checkpoint(tmp_path, 3)
    checkpoint.save(final=True)
    writes = []
    monkeypatch.setattr(journal, "write_manifest_lines", lambda path, lines: writes.append(path))
    checkpoint.saved_at -= journal.CHECKPOINT_SECONDS + 1      # the last write is old enough ...
    checkpoint.save()
    assert len(writes) == 1
    checkpoint.save_seconds = 1.0                                # ... unless writing takes 1 s:
    checkpoint.saved_at -= journal.CHECKPOINT_SECONDS + 1      # then wait 1 / CHECKPOINT_SHARE s
    checkpoint.save()
    assert len(writes) == 1
    checkpoint.saved_at -= 1.0 / journal.CHECKPOINT_SHARE
    checkpoint.save()
    assert len(writes) == 2
    checkpoint.save_seconds = 1.0
    checkpoint.save(final=True)                                  # the final write always happens
    assert len(writes) == 3


def test_a_stopped_run_counts_the_lines_made_or_skipped_among_those_it_keeps(tmp_path):
    # what "stopped after N of M lines" says after Ctrl-C (a torchrun process: of its own lines)
    from tts_cli.journal import ManifestJournal
    checkpoint, utterances = _checkpoint(tmp_path, 5)
    made = row_without_audio(utterances[0], "line 1", "ok", None, 3)
    made.audio_filepath = "wavs/u1.wav"
    skipped = row_without_audio(utterances[2], "", "skipped", "empty line", 3)
    failed = row_without_audio(utterances[3], "line 4", "error", "CUDA out of memory", 3)
    rows = {1: made, 3: skipped, 4: failed}
    assert ManifestJournal(checkpoint.path, utterances, rows, seed=3).progress() == (2, 5)
    assert ManifestJournal(checkpoint.path, utterances, rows, seed=3, only={1, 2, 4}).progress() == (1, 3)


def test_a_torchrun_process_saves_only_the_finished_rows_of_its_own_lines(tmp_path):
    from tts_cli.journal import ManifestJournal
    checkpoint, utterances = _checkpoint(tmp_path, 4)
    done = {n: dataclasses.replace(row_without_audio(utterances[n - 1], "", "ok", None, 3),
                                   audio_filepath=f"wavs/u{n}.wav") for n in (1, 2, 4)}
    partial = ManifestJournal(tmp_path / "manifest.rank-0-of-2.jsonl", utterances, done, seed=3, only={1, 3, 4})
    partial.save(final=True)
    assert [row["id"] for row in read_manifest(partial.path)] == ["u1", "u4"]


def test_the_manifest_is_rewritten_once_the_checkpoint_interval_has_passed(tmp_path, monkeypatch):
    from tts_cli import journal
    checkpoint, _ = _checkpoint(tmp_path, 2)
    clock = iter([100.0, 100.0, 100.0 + journal.CHECKPOINT_SECONDS, 100.0 + journal.CHECKPOINT_SECONDS])
    monkeypatch.setattr(journal.time, "monotonic", lambda: next(clock))
    checkpoint.save(final=True)                     # written at 100.0, taking no time
    writes = []
    monkeypatch.setattr(journal, "write_manifest_lines", lambda path, lines: writes.append(path))
    checkpoint.save()                               # CHECKPOINT_SECONDS later, exactly
    assert writes == [checkpoint.path]


def test_a_line_not_made_yet_is_a_pending_row_saying_how_to_finish_with_its_text_so_far(tmp_path):
    checkpoint, utterances = _checkpoint(tmp_path, 3)
    checkpoint.expect([(utterances[1], "line two", "%")])
    checkpoint.save(final=True)
    rows = [ManifestRow(**row) for row in read_manifest(checkpoint.path)]
    assert [row.normalized_text for row in rows] == ["", "line two", ""]
    assert [row.dropped for row in rows] == [None, "%", None], "a pending row names what its line left unsaid"
    assert {(row.status, row.reason, row.seed, row.audio_filepath) for row in rows} == {
        ("pending", "not synthesized yet: the run is still making lines, or stopped first; the same command "
                    "again finishes it", 3, None)}


def test_the_first_checkpoint_is_written_at_once_whatever_the_clock_reads(tmp_path, monkeypatch):
    from tts_cli import journal
    checkpoint, _ = _checkpoint(tmp_path, 2)
    monkeypatch.setattr(journal.time, "monotonic", lambda: 0.5)
    checkpoint.save()
    assert len(read_manifest(checkpoint.path)) == 2


def test_a_row_read_back_is_written_as_it_was_and_a_changed_one_is_not(tmp_path):
    # A re-run keeps a row by writing its line as the manifest holds it; a
    # row that differs in any field, or a line from another version of the
    # manifest (a key more or fewer), must be serialized again instead.
    path = tmp_path / "manifest.jsonl"
    rows = sample_rows()
    write_manifest(path, rows)
    read = list(manifest_rows_at(path))
    data = path.read_bytes()
    assert [data[start:start + length] for _, (start, length) in read] == data.split(b"\n")[:-1]
    for row, (record, _) in zip(rows, read, strict=True):
        assert as_written(row, record)
        assert not as_written(dataclasses.replace(row, line=row.line + 1), record)
        assert not as_written(dataclasses.replace(row, text_key="0" * 32), record)
        assert not as_written(row, {**record, "speaker": "x"})
        assert not as_written(row, {k: v for k, v in record.items() if k != "text_key"})


def test_kept_rows_are_copied_from_the_earlier_manifest_through_every_rewrite_and_no_spool_is_left(tmp_path):
    # A re-run holds no row's JSON in memory: a kept row's line is read from
    # the manifest the earlier run left (a CRLF one too, written back with
    # '\n'), and still after the run's own rewrites have replaced that file.
    from tts_cli.corpus import Utterance
    from tts_cli.journal import ManifestJournal
    rows = sample_rows()
    path = tmp_path / "manifest.jsonl"
    path.write_bytes(b"".join(row.to_json().encode() + b"\r\n" for row in rows))
    utterances = [Utterance(line=row.line, id=row.id, text=row.text) for row in rows]
    journal = ManifestJournal(path, utterances, {}, seed=3)
    for record, where in manifest_rows_at(path):
        if record["line"] != 2:
            journal.keep(ManifestRow(**record), where)
    journal.save(final=True)
    assert read_manifest(path)[1]["status"] == "pending"
    journal.record(rows[1])
    journal.save(final=True)
    journal.close()
    assert path.read_bytes() == b"".join(row.to_json().encode() + b"\n" for row in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.jsonl"]
