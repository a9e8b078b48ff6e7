"""Where a line's files go (formats.Layout): a corpus longer than one shard
is written in numbered folders that sort in corpus order and hold at most
``--shard-size`` lines' files each; a shorter one stays flat. Resume, mels,
orphans and the exports work across shards."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from outputs import manifest
from tts_cli.cli import main
from tts_cli.formats import Layout, names_a_place_for

LINES = ["Printing, in short.", "It cost $3.50.", "A longer line, in another batch.", "Hi.",
         "The fifth line.", "A sixth one, somewhat longer than the fifth.", "Seven."]


def run(args, checkpoints):
    tacotron2, waveglow = checkpoints
    return CliRunner().invoke(main, [*map(str, args), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
                                     "--device", "cpu", "--max-decoder-steps", "12", "--seed", "1",
                                     "--no-check-alignment", "--batch-size", "3"])


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def files_in(folder: Path) -> dict[str, list[str]]:
    """Each folder under ``folder`` (itself as '.'), with the files it holds."""
    return {str(d.relative_to(folder)): sorted(p.name for p in d.iterdir() if p.is_file())
            for d in [folder, *folder.rglob("*")] if d.is_dir()}


def test_a_corpus_within_one_shard_stays_flat_and_a_longer_one_is_sharded_by_line_number():
    assert Layout.for_corpus("wav", 10_000, 10_000).audio("LJ001-0001", 10_000) == "wavs/LJ001-0001.wav"
    sharded = Layout.for_corpus("flac", 10_000, 10_001)
    assert [sharded.audio("a", n) for n in (1, 10_000, 10_001)] == \
        ["wavs/00000/a.flac", "wavs/00000/a.flac", "wavs/00001/a.flac"]
    assert sharded.mel("a", 25_000) == "mels/00002/a.npy"
    assert Layout.for_corpus("wav", 0, 10 ** 6).audio("a", 10 ** 6) == "wavs/a.wav", "0: never sharded"


def test_shard_folders_sort_in_corpus_order_however_many_there_are():
    layout = Layout.for_corpus("wav", 2, 10 ** 6)      # 500,000 shards: names wider than five digits
    folders = [layout.audio("a", line).split("/")[1] for line in (1, 3, 19, 21, 199_999, 10 ** 6)]
    assert folders == sorted(folders) and len(set(folders)) == len(folders)
    assert len({len(name) for name in folders}) == 1


@pytest.mark.parametrize("path, ok", [("wavs/a.wav", True), ("wavs/00012/a.wav", True),
                                      ("wavs/a.flac", False), ("wavs/x/a.wav", False),
                                      ("wavs/00012/../../a.wav", False), ("../wavs/a.wav", False),
                                      ("mels/a.wav", False), ("wavs/00001/00002/a.wav", False)])
def test_a_row_is_trusted_only_with_a_path_a_layout_makes(path, ok):
    assert names_a_place_for(path, "wavs", "a.wav") is ok


def test_a_long_corpus_is_written_in_shards_of_at_most_the_shard_size(tmp_path, tiny_checkpoints):
    corpus = write(tmp_path / "corpus.txt", LINES)
    out = tmp_path / "out"
    result = run([corpus, "-o", out, "--shard-size", "3", "--save-mels", "--audio-format", "flac"],
                 tiny_checkpoints)
    assert result.exit_code == 0, result.output
    rows = manifest(out)
    assert files_in(out / "wavs") == {".": [], "00000": ["000001.flac", "000002.flac", "000003.flac"],
                                      "00001": ["000004.flac", "000005.flac", "000006.flac"],
                                      "00002": ["000007.flac"]}
    assert all((out / r["audio_filepath"]).is_file() and (out / r["mel_filepath"]).is_file() for r in rows)
    assert {Path(r["mel_filepath"]).parent.name for r in rows} == {"00000", "00001", "00002"}
    again = run([corpus, "-o", out, "--shard-size", "3", "--save-mels", "--audio-format", "flac"], tiny_checkpoints)
    assert again.exit_code == 0 and "7 reused" in again.output, again.output


def test_a_corpus_that_grows_past_one_shard_keeps_its_flat_files_and_shards_the_new(tmp_path, tiny_checkpoints):
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    assert run([write(corpus, LINES[:3]), "-o", out, "--shard-size", "3"], tiny_checkpoints).exit_code == 0
    flat = {p.name: p.stat().st_mtime_ns for p in (out / "wavs").glob("*.wav")}
    assert len(flat) == 3
    grown = run([write(corpus, LINES), "-o", out, "--shard-size", "3"], tiny_checkpoints)
    assert grown.exit_code == 0 and "3 reused" in grown.output, grown.output
    assert "no manifest row names" not in grown.output
    assert {p.name: p.stat().st_mtime_ns for p in (out / "wavs").glob("*.wav")} == flat, "a finished line was redone"
    rows = manifest(out)
    assert [r["audio_filepath"].count("/") for r in rows] == [1, 1, 1, 2, 2, 2, 2]
    assert all((out / r["audio_filepath"]).is_file() for r in rows)


def test_files_left_in_shard_folders_are_counted_and_pruned(tmp_path, tiny_checkpoints):
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    assert run([write(corpus, LINES), "-o", out, "--shard-size", "3"], tiny_checkpoints).exit_code == 0
    (out / "wavs" / "00001" / "notes.txt").write_text("the user's own")
    shrunk = run([write(corpus, LINES[:2]), "-o", out, "--shard-size", "3"], tiny_checkpoints)
    [line] = [line for line in shrunk.output.splitlines() if "no manifest row names" in line]
    assert "5 files" in line
    pruned = run([corpus, "-o", out, "--shard-size", "3", "--prune"], tiny_checkpoints)
    assert pruned.exit_code == 0
    # the two lines kept stay in their shard; shards left empty go, the user's file stays
    assert files_in(out / "wavs") == {".": [], "00000": ["000001.wav", "000002.wav"], "00001": ["notes.txt"]}


def test_exports_name_the_files_in_their_shards(tmp_path, tiny_checkpoints):
    corpus, out = write(tmp_path / "corpus.txt", LINES), tmp_path / "out"
    assert run([corpus, "-o", out, "--shard-size", "3"], tiny_checkpoints).exit_code == 0
    exported = CliRunner().invoke(main, ["export", str(out), "--to", "hf,kaldi", "--include-suspect"])
    assert exported.exit_code == 0, exported.output
    metadata = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert metadata and all((out / m["file_name"]).is_file() and m["file_name"].count("/") == 2 for m in metadata)
    scp = (out / "kaldi" / "wav.scp").read_text().splitlines()
    assert scp and all(Path(line.split(" ", 1)[1]).is_file() for line in scp)
