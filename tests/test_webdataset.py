"""--layout webdataset: each line's audio and row in tar shards of about
formats.TAR_SHARD_BYTES, written under a temporary name and renamed when
whole; a re-run keeps what the finished shards hold and makes the rest."""
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from outputs import manifest
from test_layout import LINES, run as run_in_files, write
from tts_cli import formats
from tts_cli.cli import main


def run(args, checkpoints):
    return run_in_files([*args, "--layout", "webdataset"], checkpoints)


def shards(out: Path) -> dict[str, dict[str, bytes]]:
    """Each shard's members, by name."""
    found = {}
    for path in sorted((out / "shards").glob("shard-*.tar")):
        with tarfile.open(path) as tar:
            found[path.name] = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    return found


def test_each_line_is_its_audio_and_row_in_a_shard_as_webdataset_reads_them(tmp_path, tiny_checkpoints,
                                                                            monkeypatch):
    monkeypatch.setattr(formats, "TAR_SHARD_BYTES", 3000)     # a few lines a shard
    out = tmp_path / "out"
    result = run([write(tmp_path / "c.txt", LINES), "-o", out, "--audio-format", "flac", "--save-mels"],
                 tiny_checkpoints)
    assert result.exit_code == 0, result.output
    rows, found = manifest(out), shards(out)
    assert len(found) >= 2 and not (out / "wavs").exists()
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(found), "no temporary file is left"
    for row in rows:
        shard, member = row["audio_filepath"].split("/")[1:]
        members = found[shard]
        key = member.rsplit(".", 1)[0]
        assert {f"{key}.flac", f"{key}.json", f"{key}.npy"} <= set(members)
        audio, rate = sf.read(io.BytesIO(members[f"{key}.flac"]))
        assert (len(audio), rate, len(members[f"{key}.flac"])) == (row["num_samples"], 22050, row["audio_bytes"])
        assert json.loads(members[f"{key}.json"]) == row
        assert np.load(io.BytesIO(members[f"{key}.npy"])).shape[1] == row["mel_frames"]


def test_a_rerun_keeps_the_finished_shards_and_makes_only_what_a_lost_shard_held(tmp_path, tiny_checkpoints,
                                                                                monkeypatch):
    monkeypatch.setattr(formats, "TAR_SHARD_BYTES", 3000)
    corpus, out = write(tmp_path / "c.txt", LINES), tmp_path / "out"
    assert run([corpus, "-o", out], tiny_checkpoints).exit_code == 0
    again = run([corpus, "-o", out], tiny_checkpoints)
    assert again.exit_code == 0 and "7 reused" in again.output, again.output
    before = shards(out)
    lost = sorted(before)[-1]                 # as if the run was killed before it was finished
    (out / "shards" / lost).unlink()
    redone = run([corpus, "-o", out], tiny_checkpoints)
    assert redone.exit_code == 0, redone.output
    held = len([name for name in before[lost] if name.endswith(".wav")])
    assert f"{7 - held} reused" in redone.output
    after = shards(out)
    assert {name: after[name] for name in before if name != lost} == \
        {name: before[name] for name in before if name != lost}, "a finished shard was rewritten"
    assert all(row["audio_filepath"].split("/")[1] in after for row in manifest(out))


def test_rows_of_the_other_layout_are_made_again_where_this_one_keeps_audio(tmp_path, tiny_checkpoints):
    corpus, out = write(tmp_path / "c.txt", LINES), tmp_path / "out"
    assert run_in_files([corpus, "-o", out], tiny_checkpoints).exit_code == 0
    tarred = run([corpus, "-o", out], tiny_checkpoints)
    assert tarred.exit_code == 0 and "0 reused" in tarred.output, tarred.output
    assert all(row["audio_filepath"].startswith("shards/") for row in manifest(out))
    assert "7 files" in tarred.output and "no manifest row names" in tarred.output   # the WAVs left in wavs/


def test_an_export_says_in_one_line_that_shards_are_read_as_they_are(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    assert run([write(tmp_path / "c.txt", LINES[:2]), "-o", out], tiny_checkpoints).exit_code == 0
    exported = CliRunner().invoke(main, ["export", str(out), "--to", "hf"])
    assert exported.exit_code != 0 and "in tar shards" in exported.output and "WebDataset" in exported.output


def test_a_shard_whose_write_fails_is_dropped_whole_and_the_next_line_starts_another(tmp_path, monkeypatch):
    from tts_cli.audio import WriteError
    from tts_cli.tarshards import TarShards
    shards = TarShards(tmp_path, 10 ** 6)
    assert shards.add("a", lambda shard: ([("wav", b"x" * 10)], shard)) == "shards/shard-000000.tar"
    real = tarfile.TarFile.addfile

    def full_disk(self, info, fileobj=None):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tarfile.TarFile, "addfile", full_disk)
    with pytest.raises(WriteError, match="shard-000000.tar"):
        shards.add("b", lambda shard: ([("wav", b"y")], shard))
    assert list((tmp_path / "shards").iterdir()) == [], "the half-written shard is gone, under any name"
    monkeypatch.setattr(tarfile.TarFile, "addfile", real)
    assert shards.take_whole() == [], "a's shard was lost: its row is not handed on"
    assert shards.add("c", lambda shard: ([("wav", b"z")], shard)) == "shards/shard-000001.tar"
    assert shards.take_whole() == [], "c's shard is not whole yet"
    shards.close()
    assert shards.take_whole() == ["shards/shard-000001.tar"]
    with tarfile.open(tmp_path / "shards" / "shard-000001.tar") as tar:
        assert tar.getnames() == ["c.wav"]


@pytest.mark.parametrize("fails", ["while a line goes in", "as the shard is finished"])
def test_a_shard_that_cannot_be_written_leaves_its_lines_pending_and_the_next_run_makes_them(
        tmp_path, tiny_checkpoints, monkeypatch, fails):
    """A full disk mid-shard, or at its last bytes: one line and exit 2,
    no row names audio that is not on disk, and the same command again
    finishes the job."""
    corpus, out = write(tmp_path / "c.txt", LINES), tmp_path / "out"
    calls = []

    def full_disk(real):
        def failing(self, *args, **kwargs):
            calls.append(1)
            if fails == "as the shard is finished" or len(calls) >= 5:
                raise OSError(28, "No space left on device")
            return real(self, *args, **kwargs)
        return failing
    name = "addfile" if fails == "while a line goes in" else "close"
    monkeypatch.setattr(tarfile.TarFile, name, full_disk(getattr(tarfile.TarFile, name)))
    failed = run([corpus, "-o", out], tiny_checkpoints)
    monkeypatch.undo()
    assert failed.exit_code == 2, failed.output
    last = failed.output.splitlines()[-1]
    assert "Traceback" not in failed.output and re.search(r"shard-00000\d\.tar: No space left on device", last)
    assert list((out / "shards").glob("*")) == [], "no shard is left, whole or not, and no temporary file"
    assert {row["status"] for row in manifest(out)} == {"pending"}
    assert all(row["audio_filepath"] is None for row in manifest(out))
    again = run([corpus, "-o", out], tiny_checkpoints)
    assert again.exit_code == 0, again.output
    found = shards(out)
    for row in manifest(out):
        shard, member = row["audio_filepath"].split("/")[1:]
        assert row["status"] == "ok" and member in found[shard]


def test_a_run_that_fails_before_its_first_shard_leaves_no_folder(tmp_path, tiny_checkpoints):
    tacotron2, waveglow = tiny_checkpoints
    damaged = tmp_path / "waveglow.pt"
    damaged.write_bytes(waveglow.read_bytes()[:4000])
    out = tmp_path / "out"
    result = run([write(tmp_path / "c.txt", LINES), "-o", out], (tacotron2, damaged))
    assert result.exit_code == 2 and str(damaged) in result.output
    assert not out.exists()


def test_ids_that_would_be_one_key_in_a_shard_stop_before_any_work(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "c.psv"
    corpus.write_text("a.b|Hello.\nc|Fine.\na_b|World.\n")
    result = run([corpus, "-o", tmp_path / "out", "--format", "ljspeech"], tiny_checkpoints)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "lines 1 and 3: ids 'a.b' and 'a_b' are one key in a tar shard" in result.output
    assert not (tmp_path / "out").exists()
    apart = run_in_files([corpus, "-o", tmp_path / "files", "--format", "ljspeech"], tiny_checkpoints)
    assert apart.exit_code == 0, "in wavs/ they are two files"


def test_a_line_made_again_leaves_no_second_copy_in_its_earlier_shard_once_pruned(tmp_path, tiny_checkpoints):
    """b's text changes: b is made again into a new shard, and its old
    members, which a reader of the whole folder would take as a second b
    with the old transcript, are reported; --prune rewrites the shard
    without them and keeps the others as they were."""
    corpus, out = tmp_path / "c.psv", tmp_path / "out"
    corpus.write_text("a|Hello there.\nb|World.\nc|Third line.\n")
    assert run([corpus, "-o", out, "--format", "ljspeech"], tiny_checkpoints).exit_code == 0
    first = shards(out)["shard-000000.tar"]
    corpus.write_text("a|Hello there.\nb|A new world.\nc|Third line.\n")
    again = run([corpus, "-o", out, "--format", "ljspeech"], tiny_checkpoints)
    assert again.exit_code == 0, again.output
    assert "1 line in 1 earlier shard" in again.output and "--prune rewrites" in again.output
    assert set(shards(out)["shard-000000.tar"]) == set(first), "reported, not yet removed"
    pruned = run([corpus, "-o", out, "--format", "ljspeech", "--prune"], tiny_checkpoints)
    assert pruned.exit_code == 0 and "rewrote 1 shard" in pruned.output, pruned.output
    found = shards(out)
    assert found["shard-000000.tar"] == {name: data for name, data in first.items() if not name.startswith("b.")}
    keys = [name.partition(".")[0] for members in found.values() for name in members if name.endswith(".json")]
    assert sorted(keys) == ["a", "b", "c"], "each line once in the folder"
    texts = {row["id"]: row["text"] for row in manifest(out)}
    assert json.loads(found["shard-000001.tar"]["b.json"])["text"] == texts["b"] == "A new world."
    settled = run([corpus, "-o", out, "--format", "ljspeech"], tiny_checkpoints)
    assert "3 reused" in settled.output and "earlier shard" not in settled.output


def test_a_shard_size_that_cannot_act_in_this_layout_is_said(tmp_path, tiny_checkpoints):
    corpus, out = write(tmp_path / "c.txt", LINES[:2]), tmp_path / "out"
    result = run([corpus, "-o", out, "--shard-size", "1"], tiny_checkpoints)
    assert result.exit_code == 0 and "--shard-size: no effect with --layout webdataset" in result.output
    unset = run([corpus, "-o", tmp_path / "other"], tiny_checkpoints)
    assert unset.exit_code == 0 and "--shard-size" not in unset.output
