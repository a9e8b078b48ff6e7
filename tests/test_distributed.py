"""Several processes through torchrun, on CPU with gloo: the output equals a
single process's, resume works across process counts, and a job that lost a
process is completed by a re-run. Each torchrun launch costs a few seconds,
so each test launches once."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner

from outputs import assert_same_output, manifest, mtimes
from tts_cli.cli import main
from tts_cli.distributed import Group, share
from tts_cli.manifest import read_manifest

LINES = [
    "Printing, in the only sense with which we are at present concerned.",
    "It cost $3.50 in 1963.",
    "A much longer line, which goes on and on, so that it lands in another batch.",
    "Hi.",
    "...!?",
    "The first sentence is here, and it is not short at all. The second one follows it.",
    "The last line of the first corpus.",
]
MORE = ["One more line, added later.", "And another one."]


def arguments(corpus, out, checkpoints, steps=12):
    tacotron2, waveglow = checkpoints
    return [str(corpus), "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
            "--device", "cpu", "--max-decoder-steps", str(steps), "--batch-size", "2", "--seed", "1",
            "--sample-format", "float32", "--max-symbols-per-piece", "60"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(processes, args, **popen):
    """``torchrun --nproc_per_node=N -m tts_cli ARGS``, started."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "tts_cli", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def finished(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def synth(args):
    return CliRunner().invoke(main, args)


def write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return path





def partial_manifests(out):
    return sorted(out.glob("manifest.rank-*.jsonl"))


def test_shares_are_balanced_by_length_and_the_same_for_every_rank():
    sizes = [120, 10, 10, 80, 40, 40, 30, 5, 5, 60]
    owners = share(sizes, 3)
    assert owners == share(list(sizes), 3)
    loads = [sum(s for s, o in zip(sizes, owners) if o == rank) for rank in range(3)]
    assert max(loads) - min(loads) <= max(sizes) and sorted(set(owners)) == [0, 1, 2]
    assert share([7, 7], 4) == [0, 1], "fewer lines than processes: the first ranks take them"
    assert Group(rank=1, world=2, local_rank=1).partial_manifest == "manifest.rank-1-of-2.jsonl"


CUT = ["A first sentence that is long enough, spoken here. Then a short one. And then a third "
       "sentence, which is longer than the others and has clauses, too.",
       "Short bits. Then much, much longer words follow, and they go on. End."]


def single_process(args, threads=1):
    """``tts-batch ARGS`` in a process of its own with ``threads`` CPU threads:
    torchrun gives each of its processes one (OMP_NUM_THREADS=1), and on a
    CPU a matrix product's rounding depends on how many threads share it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-m", "tts_cli", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_two_processes_write_bitwise_what_one_process_writes(tmp_path, tiny_checkpoints):
    # Each process runs whole batches of the one-process plan, so every line
    # is made in the batch it would share on one process; the pieces of a cut
    # line made on two processes go to its writer through files.
    corpus = write(tmp_path / "corpus.txt", LINES + CUT)
    reference = tmp_path / "reference"
    single_process(arguments(corpus, reference, tiny_checkpoints))
    out = tmp_path / "out"
    code, output = finished(torchrun(2, arguments(corpus, out, tiny_checkpoints)))
    assert code == 0, output
    assert "on 2 processes" in output and "9 lines: " in output and "1 skipped" in output
    rows = manifest(out)
    # the alignment checks and retries included (the random model's attention fails them)
    assert rows == manifest(reference) and sum(r["pieces"] > 1 for r in rows) >= 3
    assert all(len(r["alignment"]["pieces"]) == r["pieces"] for r in rows if r["pieces"] > 1)
    for row in rows:
        if row["audio_filepath"]:
            # the samples, bit for bit (a float WAV's header holds a time stamp)
            mine, theirs = (sf.read(folder / row["audio_filepath"], dtype="float32")[0] for folder in (out, reference))
            assert mine.tobytes() == theirs.tobytes(), row["id"]
    assert partial_manifests(out) == [] and not (out / ".pieces").exists()


def test_a_notice_is_said_once_not_once_per_process(tmp_path, tiny_checkpoints):
    """What --quiet still says (here: a precision a CPU cannot give) comes
    from rank 0 alone: a cron log of a job of 8 processes had it 8 times."""
    corpus = write(tmp_path / "corpus.txt", LINES[:2])
    code, output = finished(torchrun(2, [*arguments(corpus, tmp_path / "out", tiny_checkpoints), "--quiet",
                                         "--precision", "fp16"]))
    assert code == 0, output
    assert output.count("--precision fp16 is for CUDA; running on CPU in fp32") == 1, output


def test_two_processes_fill_the_shards_one_process_fills(tmp_path, tiny_checkpoints):
    corpus = write(tmp_path / "corpus.txt", LINES + CUT)
    reference, out = tmp_path / "reference", tmp_path / "out"
    single_process([*arguments(corpus, reference, tiny_checkpoints), "--shard-size", "4"])
    code, output = finished(torchrun(2, [*arguments(corpus, out, tiny_checkpoints), "--shard-size", "4"]))
    assert code == 0, output
    assert_same_output(out, reference)
    folders = {row["audio_filepath"].split("/")[1] for row in manifest(out) if row["audio_filepath"]}
    assert folders == {"00000", "00001", "00002"}
    assert partial_manifests(out) == [] and not (out / ".pieces").exists()


def makers(lines, world, batch_size=2, max_symbols=60):
    """Which processes make each line's pieces, by id, as the pipeline deals
    out the batches of the one-process plan."""
    from tts_cli.config import Settings
    from tts_cli.corpus import Utterance
    from tts_cli.planning import batch_plan, prepare_line
    settings = Settings(max_symbols_per_piece=max_symbols)
    pending = [prepare_line(Utterance(line=n, id=f"{n:06d}", text=t), 1, {}, settings)
               for n, t in enumerate(lines, start=1)]
    batches = batch_plan([p for p in pending if p is not None], batch_size)
    found = {}
    for batch, owner in zip(batches, share([len(b) * max(len(p.pieces[i]) for p, i in b) for b in batches],
                                           world)):
        for p, _ in batch:
            found.setdefault(p.utterance.id, set()).add(owner)
    return found


def test_a_cut_line_is_made_by_two_processes_in_the_test_above():
    # What makes the test above cover the pieces' hand-over.
    assert any(len(ranks) == 2 for ranks in makers(LINES + CUT, 2).values())


def test_resume_across_process_counts_redoes_nothing(tmp_path, tiny_checkpoints):
    """One process, then two with added lines, then one with more added
    lines; the exports written after the first follow (rank 0 writes them)."""
    out = tmp_path / "out"
    corpus = tmp_path / "corpus.txt"
    assert synth(arguments(write(corpus, LINES[:2]), out, tiny_checkpoints)).exit_code == 0
    # the random model's attention fails the alignment checks: most lines are suspect
    assert CliRunner().invoke(main, ["export", str(out), "--to", "hf", "--include-suspect"]).exit_code == 0
    first = mtimes(out)
    code, output = finished(torchrun(2, arguments(write(corpus, LINES), out, tiny_checkpoints)))
    assert code == 0 and "2 reused" in output, output
    kept = [row["id"] for row in manifest(out) if row["status"] in ("ok", "suspect")]
    assert output.count("exports refreshed: hf") == 1 and f"exports refreshed: hf ({len(kept)} lines)" in output
    assert [json.loads(line)["id"] for line in (out / "metadata.jsonl").read_text().splitlines()] == kept
    second = mtimes(out)
    assert {name: second[name] for name in first} == first, "two processes redid a finished WAV"
    assert len(second) == 6
    result = synth(arguments(write(corpus, LINES + MORE), out, tiny_checkpoints))
    assert result.exit_code == 0 and "6 reused" in result.output, result.output
    assert {name: stamp for name, stamp in mtimes(out).items() if name in second} == second
    reference = tmp_path / "reference"
    assert synth(arguments(corpus, reference, tiny_checkpoints)).exit_code == 0
    assert_same_output(out, reference)


def worker(launcher, rank):
    """The pid of torchrun's worker process of ``rank``."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker of rank {rank} among {children}")


def wait_for_rows(process, partial, timeout=60.0):
    """Until the partial manifest holds a row."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and partial.stat().st_size:
            return
        time.sleep(0.02)
    raise AssertionError(f"no row in {partial.name}: {finished(process)[1]}")


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
                    reason="finds torchrun's workers through /proc/PID/task/PID/children (Linux)")
def test_a_killed_process_leaves_the_others_work_and_a_rerun_completes(tmp_path,
                                                                       never_stopping_checkpoints):
    """Every line decodes 30 frames, so the job lasts long enough to kill rank 1."""
    corpus = write(tmp_path / "corpus.txt", [f"Sentence number {i}, spoken slowly." for i in range(24)])
    out = tmp_path / "out"
    job = torchrun(2, arguments(corpus, out, never_stopping_checkpoints, steps=30))
    wait_for_rows(job, out / "manifest.rank-1-of-2.jsonl")
    os.kill(worker(job, 1), signal.SIGKILL)
    code, output = finished(job)
    assert code != 0
    # torchrun stops the survivor with SIGTERM (or, when it had finished its
    # share, its wait for rank 1 fails first); it saves its rows and says so.
    assert re.search(r"rank 0 of 2: (SIGTERM received|another process of this job stopped)", output)
    assert "manifest.rank-0-of-2.jsonl" in output and "run the same command again" in output
    kept = [row for path in partial_manifests(out) for row in read_manifest(path)]
    assert [path.name for path in partial_manifests(out)] == ["manifest.rank-0-of-2.jsonl",
                                                              "manifest.rank-1-of-2.jsonl"]
    assert kept and all(sf.info(str(out / r["audio_filepath"])).frames == r["num_samples"] for r in kept)
    before = mtimes(out)
    result = synth(arguments(corpus, out, never_stopping_checkpoints, steps=30))
    assert result.exit_code == 0 and f"{len(kept)} reused" in result.output, result.output
    assert all(mtimes(out)[r["id"] + ".wav"] == before[r["id"] + ".wav"] for r in kept)
    assert partial_manifests(out) == []
    reference = tmp_path / "reference"
    assert synth(arguments(corpus, reference, never_stopping_checkpoints, steps=30)).exit_code == 0
    assert_same_output(out, reference)


def test_without_torchrun_to_stop_it_a_survivor_finishes_its_share_and_says_what_is_saved(
        tmp_path, never_stopping_checkpoints):
    """Two processes started by hand (as on machines that lose each other):
    nobody stops rank 0 when rank 1 dies, so it finishes its share, then
    fails to merge and says so in one line."""
    lines = [f"Sentence number {i}, spoken slowly." for i in range(24)]
    corpus, out = write(tmp_path / "corpus.txt", lines), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "tts_cli", *arguments(corpus, out, never_stopping_checkpoints, steps=30),
            "--quiet"]
    ranks = [subprocess.Popen(args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    wait_for_rows(ranks[0], out / "manifest.rank-1-of-2.jsonl")
    ranks[1].kill()
    code, output = finished(ranks[0])
    assert code == 2 and output.count("\n") == 1, output
    assert "rank 0 of 2: another process of this job stopped" in output
    assert "manifest.rank-0-of-2.jsonl" in output and "run the same command again" in output
    share_of_0 = sum(ranks == {0} for ranks in makers(lines, 2, max_symbols=180).values())
    assert len(read_manifest(out / "manifest.rank-0-of-2.jsonl")) == share_of_0
    kept = sum(len(read_manifest(path)) for path in partial_manifests(out))
    result = synth(arguments(corpus, out, never_stopping_checkpoints, steps=30))
    assert result.exit_code == 0 and f"{kept} reused" in result.output, result.output


def test_a_fixed_gpu_under_torchrun_is_one_line_naming_what_to_pass(tmp_path):
    corpus = write(tmp_path / "corpus.txt", LINES[:1])
    result = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--device", "cuda:1"],
                                env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "--device cuda:1" in result.output and "pass --device cuda" in result.output
    assert not (tmp_path / "out").exists()


def test_the_webdataset_layout_under_torchrun_is_one_line_naming_what_to_do(tmp_path, tiny_checkpoints):
    corpus = write(tmp_path / "corpus.txt", LINES[:1])
    result = CliRunner().invoke(main, [*arguments(corpus, tmp_path / "out", tiny_checkpoints), "--layout",
                                       "webdataset"], env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "writes its tar shards from one process" in result.output
    assert not (tmp_path / "out").exists()


def test_a_process_that_cannot_join_the_job_is_one_line_naming_torchrun(tmp_path, tiny_checkpoints):
    corpus = write(tmp_path / "corpus.txt", LINES[:1])
    result = CliRunner().invoke(main, arguments(corpus, tmp_path / "out", tiny_checkpoints),
                                env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": None})
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "rank 0 of 2: could not join" in result.output and "MASTER_ADDR" in result.output
    assert "torchrun" in result.output


def node(nodes, endpoint, args):
    """One machine's torchrun agent in a job of ``nodes`` machines with one
    process each, meeting at ``endpoint`` through torch's c10d rendezvous
    (on one machine here: each agent stands for a node)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc_per_node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=tts-batch-test",
               "-m", "tts_cli", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_nodes_write_into_one_folder_what_one_process_writes(tmp_path, tiny_checkpoints):
    corpus = write(tmp_path / "corpus.txt", LINES + CUT)
    reference, out = tmp_path / "reference", tmp_path / "out"
    single_process([*arguments(corpus, reference, tiny_checkpoints), "--shard-size", "4"])
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [node(2, endpoint, [*arguments(corpus, out, tiny_checkpoints), "--shard-size", "4"]) for _ in range(2)]
    ended = [finished(n) for n in nodes]
    assert all(code == 0 for code, _ in ended), ended
    assert "on 2 processes" in "".join(output for _, output in ended)
    assert manifest(out) == manifest(reference)
    for row in manifest(reference):
        if row["audio_filepath"]:
            mine, theirs = (sf.read(folder / row["audio_filepath"], dtype="float32")[0] for folder in (out, reference))
            assert mine.tobytes() == theirs.tobytes(), row["id"]
    assert partial_manifests(out) == [] and not (out / ".pieces").exists()


def workers_of(agent):
    """The pids of the worker processes a torchrun agent started (torchrun starts each in a
    session of its own)."""
    try:
        return [int(pid) for pid in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()]
    except OSError:
        return []


def rank_of(agent):
    """The RANK of the worker an agent started (None until it has one)."""
    for pid in workers_of(agent):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"RANK="):
                return int(entry[5:])
    return None


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
                    reason="finds torchrun's workers through /proc/PID/task/PID/children (Linux)")
def test_a_node_killed_mid_run_loses_nothing_and_a_rerun_on_any_number_of_nodes_finishes(
        tmp_path, never_stopping_checkpoints):
    """48 lines of 100 frames each: the nodes are killed as soon as the first
    line's audio is written, long before either has finished its share (the
    job takes several seconds). torchrun's agents would wait up to 5 minutes
    at the end for a node that is gone, had their own work ended well."""
    lines = [f"Sentence number {i}, spoken slowly." for i in range(48)]
    corpus, out = write(tmp_path / "corpus.txt", lines), tmp_path / "out"
    args = arguments(corpus, out, never_stopping_checkpoints, steps=100)
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [node(2, endpoint, args) for _ in range(2)]
    deadline = time.monotonic() + 120
    while not (any((out / "wavs").glob("*.wav")) and all(rank_of(n) is not None for n in nodes)):
        assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), [finished(n) for n in nodes]
        time.sleep(0.02)
    doomed = next(n for n in nodes if rank_of(n) == 1)
    for pid in [*workers_of(doomed), doomed.pid]:   # the machine is gone: its agent and its worker
        os.kill(pid, signal.SIGKILL)
    doomed.wait()
    survivor = next(n for n in nodes if n is not doomed)
    code, output = finished(survivor)
    assert code != 0
    assert "rank 0 of 2" in output and "run the same command again" in output, output
    kept = [row for path in partial_manifests(out) for row in read_manifest(path)]
    assert kept and all(sf.info(str(out / r["audio_filepath"])).frames == r["num_samples"] for r in kept)
    before = mtimes(out)
    # the re-run: three nodes this time
    endpoint = f"127.0.0.1:{free_port()}"
    again = [finished(n) for n in [node(3, endpoint, args) for _ in range(3)]]
    assert all(code == 0 for code, _ in again), again
    assert f"{len(kept)} reused" in "".join(output for _, output in again)
    assert all(mtimes(out)[r["id"] + ".wav"] == before[r["id"] + ".wav"] for r in kept)
    assert partial_manifests(out) == []
    reference = tmp_path / "reference"
    assert synth(arguments(corpus, reference, never_stopping_checkpoints, steps=100)).exit_code == 0
    assert_same_output(out, reference)
