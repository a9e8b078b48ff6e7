"""A re-run keeps a finished line by its text key (resume.text_key: its id
and text as read, under the run's seed, settings, models and front-end
code) without running the text front end; anything that could change the
line's pieces sends it through the front end and its resume key again."""
import json

import pytest
from click.testing import CliRunner

from outputs import assert_same_output, manifest, mtimes
from tts_cli import planning, resume
from tts_cli.cli import main

LINES = [
    "Printing, in the only sense with which we are at present concerned.",
    "It cost $3.50 in 1963.",
    "Hi.",
    "...!?",
    "The last line of the corpus.",
]


def synth(corpus, out, checkpoints, *extra):
    tacotron2, waveglow = checkpoints
    return CliRunner().invoke(main, [str(corpus), "-o", str(out), "--tacotron2", str(tacotron2),
                                     "--waveglow", str(waveglow), "--device", "cpu", "--max-decoder-steps", "12",
                                     "--batch-size", "2", "--sample-format", "float32", "--no-check-alignment",
                                     "--seed", "1", *extra])


def write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


@pytest.fixture
def reads(monkeypatch):
    """The lines the front end reads in a run, by text."""
    seen = []
    original = planning.prepare_line

    def counting(u, *args):
        seen.append(u.text)
        return original(u, *args)
    monkeypatch.setattr(planning, "prepare_line", counting)
    return seen


def test_a_rerun_keeps_finished_lines_without_reading_their_text_and_reads_a_changed_one(
        tmp_path, tiny_checkpoints, reads):
    corpus, out = write(tmp_path / "corpus.txt", LINES), tmp_path / "out"
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    assert sorted(reads) == sorted(LINES)
    rows = manifest(out)
    assert all(isinstance(r["text_key"], str) for r in rows if r["audio_filepath"])
    reads.clear()
    before = mtimes(out)
    again = synth(corpus, out, tiny_checkpoints)
    assert again.exit_code == 0 and "4 reused" in again.output, again.output
    assert reads == ["...!?"], "only the line without audio is read again"
    assert mtimes(out) == before and manifest(out) == rows
    reads.clear()
    changed = [*LINES[:4], "The last line of the corpus, changed."]
    result = synth(write(corpus, changed), out, tiny_checkpoints)
    assert result.exit_code == 0 and "1 to do, 3 reused" in result.output, result.output
    assert sorted(reads) == ["...!?", "The last line of the corpus, changed."]
    reference = tmp_path / "reference"
    assert synth(corpus, reference, tiny_checkpoints).exit_code == 0
    assert_same_output(out, reference)


def test_another_front_end_reads_every_line_again_and_keeps_those_whose_pieces_are_unchanged(
        tmp_path, tiny_checkpoints, reads, monkeypatch):
    corpus, out = write(tmp_path / "corpus.txt", LINES), tmp_path / "out"
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    first, before = manifest(out), mtimes(out)
    reads.clear()
    monkeypatch.setattr(resume, "front_end_digest", lambda: "another front end")
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 0 and "0 to do, 4 reused" in result.output, result.output
    assert sorted(reads) == sorted(LINES)
    assert mtimes(out) == before
    rows = manifest(out)
    assert [r["key"] for r in rows] == [r["key"] for r in first]
    assert all(new["text_key"] != old["text_key"] for new, old in zip(rows, first) if old["audio_filepath"])


def test_rows_without_a_text_key_are_read_once_and_get_one(tmp_path, tiny_checkpoints, reads):
    corpus, out = write(tmp_path / "corpus.txt", LINES), tmp_path / "out"
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    rows = manifest(out)
    older = [json.dumps({k: v for k, v in r.items() if k != "text_key"}) for r in rows]
    (out / "manifest.jsonl").write_text("".join(f"{line}\n" for line in older))
    reads.clear()
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 0 and "4 reused" in result.output and sorted(reads) == sorted(LINES)
    assert manifest(out) == rows
    reads.clear()
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0 and reads == ["...!?"]


def test_the_text_key_follows_the_id_the_text_and_the_context():
    from tts_cli.config import Settings
    from tts_cli.corpus import Utterance
    settings = Settings()
    context = resume.text_context(1, {"precision": "fp32"}, settings)
    key = resume.text_key(context, Utterance(line=1, id="a", text="Hello."))
    assert key == resume.text_key(context, Utterance(line=9, id="a", text="Hello.")), "not the line number"
    contexts = [resume.text_context(2, {"precision": "fp32"}, settings),
                resume.text_context(1, {"precision": "fp16"}, settings),
                resume.text_context(1, {"precision": "fp32"}, Settings(piece_pause=0.3)),
                resume.text_context(1, {"precision": "fp32"}, Settings(max_symbols_per_piece=80))]
    others = [resume.text_key(context, Utterance(line=1, id="b", text="Hello.")),
              resume.text_key(context, Utterance(line=1, id="a", text="Hello!")),
              *(resume.text_key(c, Utterance(line=1, id="a", text="Hello.")) for c in contexts)]
    assert len({key, *others}) == 1 + len(others)
    # the id and the text cannot trade characters across their boundary
    assert (resume.text_key(context, Utterance(line=1, id="a", text="bc"))
            != resume.text_key(context, Utterance(line=1, id="ab", text="c")))


def test_a_rerun_with_nothing_to_do_leaves_the_manifest_as_it_is_and_one_with_work_first_drops_what_it_replaces(
        tmp_path, tiny_checkpoints, monkeypatch):
    from tts_cli import journal
    corpus, out = write(tmp_path / "corpus.txt", LINES), tmp_path / "out"
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    rows = manifest(out)
    written = []
    original = journal.write_manifest_lines

    def recording(path, lines):
        lines = list(lines)   # the journal's lines come one at a time
        written.append([json.loads(line)["status"] for line in lines])
        return original(path, lines)
    monkeypatch.setattr(journal, "write_manifest_lines", recording)
    before = (out / "manifest.jsonl").read_bytes()
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    # a million-line manifest took seconds to serialize and write again, unchanged
    assert written == [] and (out / "manifest.jsonl").read_bytes() == before
    # the corpus without its last line: nothing to make, but the manifest follows the corpus
    assert synth(write(corpus, LINES[:-1]), out, tiny_checkpoints).exit_code == 0
    assert len(written) == 1 and manifest(out) == rows[:-1]
    assert synth(write(corpus, LINES), out, tiny_checkpoints).exit_code == 0
    assert manifest(out) == rows
    written.clear()
    changed = [*LINES[:4], "The last line of the corpus, changed."]
    assert synth(write(corpus, changed), out, tiny_checkpoints).exit_code == 0
    # before its WAV is replaced, the changed line's old row is gone from the manifest
    assert written[0][-1] == "pending" and written[-1][-1] == "ok"
