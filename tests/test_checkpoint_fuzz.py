"""Hostile and broken checkpoint files, crafted and fuzzed: every file given
as a checkpoint either loads or is refused in one line naming it (exit
status 2 from the command); never a traceback, never code it names run."""
from __future__ import annotations

import dataclasses
import os
import pickle
import random
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checkpoint_files as cf
import hostile_files as hf
from tiny_models import WAVEGLOW_DIMS, canonical, tiny_tacotron2, tiny_waveglow
from tts_cli.cli import main
from tts_cli.config import Settings
from tts_cli.engine import Engine
from tts_cli.errors import FatalError
from tts_cli.loading import make_engine
from tts_cli.waveglow import WaveGlow

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tiny_waveglow_sd():
    return canonical(tiny_waveglow(seed=4))


def loads_or_refuses(tacotron2: Path, waveglow: Path) -> Engine | None:
    """What the command does with the two files short of synthesizing: an
    engine, or a FatalError whose one line names the file."""
    try:
        return make_engine(Settings(tacotron2=str(tacotron2), waveglow=str(waveglow), device="cpu"), [])
    except FatalError as e:
        message = str(e)
        assert "\n" not in message and message.strip()
        assert str(waveglow) in message or str(tacotron2) in message, message
        return None


def the_command(tmp_path, tacotron2, waveglow):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hello there.\n")
    return CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--tacotron2", str(tacotron2),
                                     "--waveglow", str(waveglow), "--device", "cpu",
                                     "--max-decoder-steps", "8", "--quiet"])


# --------------------------------------------------------------------------
# Crafted


def waveglow_tree(sd, change):
    """NVIDIA's pickled WaveGlow for ``sd``, its root node changed by ``change``."""
    root = hf.published_waveglow(sd)
    change(root)
    return {"model": root, "iteration": 1}


# name: (how the file differs from NVIDIA's, whether it still loads)
CRAFTED = {
    # the two: each ended in a traceback and exit status 1
    "made without BUILD": (lambda root: setattr(root, "state", hf.NO_STATE), False),
    "_non_persistent_buffers_set=7": (lambda root: root.state["_modules"]["upsample"].state.update(
        _non_persistent_buffers_set=7), True),
    "state a list": (lambda root: setattr(root, "state", [1, 2]), False),
    "state a tensor": (lambda root: setattr(root, "state", torch.zeros(3)), False),
    "_modules a list": (lambda root: root.state.update(_modules=[1]), False),
    "a child made without BUILD": (lambda root: setattr(root.state["_modules"]["WN"].state["_modules"]["0"],
                                                        "state", hf.NO_STATE), False),
    "a child named 3": (lambda root: root.state["_modules"].update({3: root.state["_modules"]["upsample"]}),
                        True),
    "a meta tensor": (lambda root: root.state["_modules"]["upsample"].state["_parameters"].update(
        bias=torch.empty(16, device="meta")), False),
    "an integer weight": (lambda root: root.state["_modules"]["upsample"].state["_parameters"].update(
        bias=torch.zeros(16, dtype=torch.int32)), False),
    "a NaN weight": (lambda root: root.state["_modules"]["upsample"].state["_parameters"].update(
        bias=torch.full((16,), float("nan"))), False),
    "a wrongly shaped weight": (lambda root: root.state["_modules"]["upsample"].state["_parameters"].update(
        bias=torch.zeros(5)), False),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_waveglow_files_load_or_are_refused_in_one_line(tmp_path, tiny_checkpoints, tiny_waveglow_sd,
                                                                case):
    change, loads = CRAFTED[case]
    path = tmp_path / "waveglow.pt"
    hf.save(path, waveglow_tree(tiny_waveglow_sd, change))
    assert (loads_or_refuses(tiny_checkpoints[0], path) is not None) == loads
    result = the_command(tmp_path, tiny_checkpoints[0], path)
    if loads:
        assert result.exit_code == 0 and (tmp_path / "out" / "wavs" / "000001.wav").exists(), result.output
    else:
        assert result.exit_code == 2, result.output
        assert result.output.count("\n") == 1 and str(path) in result.output


def test_a_waveglow_whose_1x1_convolution_cannot_be_inverted_is_refused(tmp_path, tiny_checkpoints,
                                                                       tiny_waveglow_sd):
    path = tmp_path / "waveglow.pt"
    singular = dict(tiny_waveglow_sd)
    singular["convinv.1.conv.weight"] = torch.zeros_like(singular["convinv.1.conv.weight"])
    cf.write_bare_state_dict(path, singular)
    result = the_command(tmp_path, tiny_checkpoints[0], path)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert str(path) in result.output and "not invertible" in result.output


@pytest.mark.parametrize("mismatch", ["a smaller symbol table", "mels of another size"])
def test_two_files_that_cannot_make_speech_together_are_refused_before_any_line(tmp_path, tiny_checkpoints,
                                                                               mismatch):
    """Each file loads alone; together every line would fail, so the pair
    is refused in one line (exit 2) naming both or the one at fault."""
    tacotron2, waveglow = tiny_checkpoints
    if mismatch == "a smaller symbol table":
        tacotron2 = tmp_path / "tacotron2.pt"
        sd = canonical(tiny_tacotron2(seed=4))
        cf.write_nvidia_tacotron2(tacotron2, {**sd, "embedding.weight": sd["embedding.weight"][:20]})
        expected = "holds 20 symbols, fewer than the 148"
    else:
        waveglow = tmp_path / "waveglow.pt"
        torch.manual_seed(0)
        narrow = WaveGlow(dataclasses.replace(WAVEGLOW_DIMS, n_mel=8))
        cf.write_bare_state_dict(waveglow, canonical(narrow))
        expected = f"makes mels of {WAVEGLOW_DIMS.n_mel} channels but {waveglow} takes 8"
    result = the_command(tmp_path, tacotron2, waveglow)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert expected in result.output and str(tacotron2) in result.output
    assert not (tmp_path / "out" / "manifest.jsonl").exists()


def test_dimensions_that_would_need_far_more_memory_than_the_file_are_refused_before_any_is_taken(
        tmp_path, tiny_checkpoints, tiny_waveglow_sd, monkeypatch):
    # The models are built from sizes read off the tensors; a file whose
    # tensors disagree (here a 1x1 convolution 6,000 wide, with the rest
    # small) must be refused before a 6,000 x 6,000 layer (and more) is made.
    path = tmp_path / "waveglow.pt"
    bad = dict(tiny_waveglow_sd)
    bad["convinv.0.conv.weight"] = torch.zeros(6_000, 1, 1)
    cf.write_bare_state_dict(path, bad)
    built = []
    real_init = WaveGlow.__init__

    def watched_init(self, dims):
        built.append(torch.empty(0).device.type)   # where this model's tensors go: "meta" takes no memory
        real_init(self, dims)
    monkeypatch.setattr(WaveGlow, "__init__", watched_init)
    assert loads_or_refuses(tiny_checkpoints[0], path) is None
    # refused by the dimensions' own check (no model built at all) or by a
    # model sized on the meta device: never a model with real memory
    assert set(built) <= {"meta"}


PAYLOADS = ["os system", "posix system", "builtins exec", "builtins eval", "builtins open",
            "subprocess Popen", "pathlib Path", "io open", "shutil copyfile", "builtins __import__"]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "pre-1.6"])
@pytest.mark.parametrize("callee", PAYLOADS)
def test_a_file_that_would_create_a_file_does_not(tmp_path, tiny_checkpoints, callee, legacy):
    marker = tmp_path / "created"
    argument = {"builtins exec": f"open({str(marker)!r}, 'w').close()",
                "builtins eval": f"open({str(marker)!r}, 'w')"}.get(callee, f"touch {marker}")
    if callee in ("builtins open", "io open", "pathlib Path"):
        argument = str(marker)
    body = (hf.opcode("GLOBAL", callee) + hf.opcode("BINUNICODE", argument)
            + (hf.opcode("BINUNICODE", "w") + pickle.TUPLE2 if callee in ("builtins open", "io open")
               else pickle.TUPLE1)
            + pickle.REDUCE)
    if callee == "pathlib Path":   # Path(marker).touch()
        body = (hf.opcode("GLOBAL", "builtins getattr") + body + hf.opcode("BINUNICODE", "touch")
                + pickle.TUPLE2 + pickle.REDUCE + pickle.EMPTY_TUPLE + pickle.REDUCE)
    main_pickle = pickle.PROTO + b"\x02" + body + pickle.STOP
    path = tmp_path / "evil.pt"
    if legacy:
        path.write_bytes(hf.legacy_file(main_pickle, [], b""))
    else:
        path.write_bytes(hf.zip_archive([("archive/data.pkl", main_pickle), ("archive/version", b"3\n"),
                                         ("archive/byteorder", b"little")]))
    result = the_command(tmp_path, tiny_checkpoints[0], path)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    named = "getattr" if callee == "pathlib Path" else callee.split()[1]   # the first global it names
    assert "refused" in result.output and f"{named}'" in result.output
    assert not marker.exists()


# --------------------------------------------------------------------------
# Fuzzed: the pickle's opcodes


MARKER_DIR = Path(tempfile.gettempdir()) / f"tts-batch-fuzz-{os.getpid()}"
_CALLEES = PAYLOADS + ["glow WaveGlow", "glow WN", "torch._utils _rebuild_tensor_v2",
                       "torch._utils _rebuild_parameter", "collections OrderedDict",
                       "torch.nn.modules.conv Conv1d", "tts_batch legacy_module_record",
                       "torch.nn.backends.thnn _get_thnn_function_backend", "builtins getattr",
                       "builtins setattr", "copyreg _reconstructor", "builtins object", "torch FloatStorage",
                       "torch.serialization _get_layout", "torch device", "builtins set"]
_STRINGS = ["touch " + str(MARKER_DIR / "ran"), str(MARKER_DIR / "ran"), "w", "model", "state_dict",
            "upsample.weight", "WN.0.in_layers.0.weight", "_parameters", "_modules", "storage", "0", "cpu",
            "module", "__dict__", "_non_persistent_buffers_set", "\udcff", ""]
_OPS = st.one_of(
    st.sampled_from(["MARK", "STOP", "POP", "DUP", "NONE", "NEWTRUE", "NEWFALSE", "EMPTY_TUPLE",
                     "EMPTY_LIST", "EMPTY_DICT", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "DICT",
                     "APPEND", "APPENDS", "SETITEM", "SETITEMS", "REDUCE", "BUILD", "NEWOBJ", "OBJ",
                     "BINPERSID", "MEMOIZE", "STACK_GLOBAL"]).map(hf.opcode),
    st.integers(-2 ** 31, 2 ** 31 - 1).map(lambda n: hf.opcode("BININT", n)),
    st.integers(0, 255).map(lambda n: hf.opcode("BININT1", n)),
    st.integers(0, 40).map(lambda n: hf.opcode("BINPUT", n)),
    st.integers(0, 40).map(lambda n: hf.opcode("BINGET", n)),
    st.integers(0, 2 ** 32 - 1).map(lambda n: hf.opcode("LONG_BINGET", n)),
    st.sampled_from(_STRINGS).map(lambda s: hf.opcode("BINUNICODE", s)),
    st.sampled_from(_CALLEES).map(lambda s: hf.opcode("GLOBAL", s)),
    st.binary(max_size=24).map(lambda b: hf.opcode("SHORT_BINBYTES", b)),
)


def persistent_storage_op():
    """A storage record: ('storage', FloatStorage, key, location, numel)."""
    return (pickle.MARK + hf.opcode("BINUNICODE", "storage") + hf.opcode("GLOBAL", "torch FloatStorage")
            + hf.opcode("BINUNICODE", "0") + hf.opcode("BINUNICODE", "cpu") + hf.opcode("BININT", 4)
            + pickle.TUPLE + pickle.BINPERSID)


_PICKLES = st.lists(st.one_of(_OPS, st.just(persistent_storage_op())), max_size=60).map(
    lambda ops: pickle.PROTO + b"\x02" + b"".join(ops) + pickle.STOP)


@FUZZ
@given(main_pickle=_PICKLES, legacy=st.booleans(), storage=st.binary(max_size=32))
def test_any_pickle_loads_or_is_refused_and_never_runs_what_it_names(tiny_checkpoints, main_pickle, legacy,
                                                                     storage):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzzed.pt"
        if legacy:
            path.write_bytes(hf.legacy_file(main_pickle, ["0"], storage))
        else:
            path.write_bytes(hf.zip_archive([("archive/data.pkl", main_pickle), ("archive/version", b"3\n"),
                                             ("archive/byteorder", b"little"), ("archive/data/0", storage)]))
        loads_or_refuses(tiny_checkpoints[0], path)
        loads_or_refuses(path, tiny_checkpoints[1])
    assert not MARKER_DIR.exists() or not any(MARKER_DIR.iterdir())


# --------------------------------------------------------------------------
# Fuzzed: the torch archive around a real WaveGlow


@pytest.fixture(scope="module")
def published_archive(tiny_waveglow_sd, tmp_path_factory):
    path = tmp_path_factory.mktemp("archive") / "waveglow.pt"
    cf.write_pickled_waveglow(path, tiny_waveglow_sd)
    return hf.zip_entries(path.read_bytes())


_EDITS = st.lists(st.tuples(st.sampled_from(["drop", "double", "rename", "truncate", "flip", "extend",
                                             "swap"]),
                            st.integers(0, 2 ** 16), st.integers(0, 2 ** 16)), min_size=1, max_size=4)


def edited(entries, edits):
    entries = list(entries)
    for kind, a, b in edits:
        if not entries:
            break
        i = a % len(entries)
        name, data = entries[i]
        if kind == "drop":
            del entries[i]
        elif kind == "double":
            entries.append((name, data))
        elif kind == "rename":
            entries[i] = (name[: b % (len(name) + 1)] + "x", data)
        elif kind == "truncate":
            entries[i] = (name, data[: b % (len(data) + 1)])
        elif kind == "flip" and data:
            flipped = bytearray(data)
            flipped[b % len(data)] ^= 1 << (a % 8)
            entries[i] = (name, bytes(flipped))
        elif kind == "extend":
            entries[i] = (name, data + bytes(b % 64))
        elif kind == "swap":
            j = b % len(entries)
            entries[i], entries[j] = (entries[i][0], entries[j][1]), (entries[j][0], entries[i][1])
    return entries


@FUZZ
@given(edits=_EDITS)
def test_any_damage_to_the_archive_loads_or_is_refused(tiny_checkpoints, published_archive, edits):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "waveglow.pt"
        path.write_bytes(hf.zip_archive(edited(published_archive, edits)))
        loads_or_refuses(tiny_checkpoints[0], path)


# --------------------------------------------------------------------------
# Fuzzed: what the pickled modules hold


_ODD_VALUES = st.one_of(
    st.none(), st.integers(), st.text(max_size=8), st.booleans(), st.just(hf.NO_STATE),
    st.just(torch.zeros(3)), st.just(torch.zeros(2, 2, dtype=torch.int64)), st.just(torch.tensor(float("nan"))),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    st.builds(set, st.lists(st.text(max_size=3), max_size=3)))


def nodes(tree):
    """Every Pickled node of a tree, root first."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node.state, dict):
            todo.extend(child for child in (node.state.get("_modules") or {}).values()
                        if isinstance(child, hf.Pickled))
    return found


@FUZZ
@given(changes=st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(
    ["state", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "a parameter", "a child",
     "swap children"]), _ODD_VALUES), min_size=1, max_size=4), seed=st.integers(0, 2 ** 16))
def test_any_state_in_the_pickled_modules_loads_or_is_refused(tiny_checkpoints, tiny_waveglow_sd, changes, seed):
    tree = hf.published_waveglow(tiny_waveglow_sd)
    everything = nodes(tree)
    rng = random.Random(seed)
    for at, what, value in changes:
        node = everything[at % len(everything)]
        if not isinstance(node.state, dict):
            continue
        if what == "state":
            node.state = value
        elif what in ("a parameter", "a child"):
            table = node.state.get("_parameters" if what == "a parameter" else "_modules")
            if isinstance(table, dict) and table:
                table[rng.choice(sorted(table, key=str))] = value
        elif what == "swap children":
            table = node.state.get("_modules")
            if isinstance(table, dict) and len(table) > 1:
                a, b = rng.sample(sorted(table, key=str), 2)
                table[a], table[b] = table[b], table[a]
        else:
            node.state[what] = value
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "waveglow.pt"
        hf.save(path, {"model": tree, "iteration": 1})
        loads_or_refuses(tiny_checkpoints[0], path)
