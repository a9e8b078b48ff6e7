"""Reading a torch checkpoint file without running anything in it.

Files are read only with torch's weights-only unpickler. Pickled modules
(NVIDIA's WaveGlow is a pickled ``glow.WaveGlow``) are admitted through
inert stand-in classes of ours that merely hold the pickled attributes.
Nothing the file names is imported, and nothing is called but torch's tensor
rebuilders and our stand-ins, so the ``glow`` package need not be installed
and a hostile file cannot run code. checkpoints.py finds the weights in
what comes back.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import warnings

import torch

from tts_cli.errors import CheckpointError


# --------------------------------------------------------------------------
# Reading the file safely


class Inert:
    """Holds the attributes of a pickled object without being that object.

    torch's weights-only unpickler creates admitted classes with
    ``cls.__new__(cls)`` and then hands the pickled attribute dict to
    ``__setstate__``.  Keeping it in ``state`` (rather than in ``__dict__``)
    means no pickled value can shadow a method of ours.
    """

    pickled_as = "?"

    # What an object the file created without BUILD (no attributes at all) holds.
    state: dict = {}

    def __setstate__(self, state):
        self.state = state if isinstance(state, dict) else {}

    def __repr__(self):
        return f"<stand-in for {self.pickled_as}>"


def _inert_class(dotted_name: str) -> type:
    short = dotted_name.rsplit(".", 1)[-1]
    return type(short, (Inert,), {"pickled_as": dotted_name})


# Every class a pickled NVIDIA WaveGlow names.  The torch.nn ones are mapped
# to stand-ins too: building real modules from old pickles would go through
# their __setstate__ and trip over attributes later torch versions expect.
_STAND_IN_NAMES = (
    "glow.WaveGlow",
    "glow.WN",
    "glow.Invertible1x1Conv",
    "torch.nn.modules.conv.Conv1d",
    "torch.nn.modules.conv.ConvTranspose1d",
    "torch.nn.modules.container.ModuleList",
    "torch.nn.utils.weight_norm.WeightNorm",
)
_STAND_INS = [(_inert_class(name), name) for name in _STAND_IN_NAMES]


def _no_backend(*_args):
    """Stand-in for torch<1.4's ``_get_thnn_function_backend``; modules saved
    then pickle their ``_backend`` attribute as a call to it."""
    return None


# --------------------------------------------------------------------------
# Pickled modules in the non-zip format (torch's default before 1.6)
#
# That format saves each nn.Module subclass as a persistent id
# ('module', cls, source_file, source) so that loading can warn when the
# class's source has changed.  torch's weights-only unpickler accepts only
# storage persistent ids, so it refuses every pickled-model file of that era,
# the published WaveGlow releases included.  We rewrite just those records,
# before torch reads the file, into a call of _legacy_module_record (admitted
# below), which hands back the class; the class itself is still a GLOBAL in
# the record, so it must be one we admit.  Whatever the rewrite produces is
# read by torch's weights-only unpickler all the same, so a wrong guess here
# can make a load fail but can never let a file run code.

_LEGACY_MODULE_REFUSAL = "persistent_load"  # torch: "Only persistent_load of storage is allowed"
_RECORD_CALLEE = "tts_batch.legacy_module_record"
_RECORD_CALL = pickle.GLOBAL + _RECORD_CALLEE.replace(".", "\n").encode() + b"\n"
_TUPLE1_REDUCE = pickle.TUPLE1 + pickle.REDUCE
_STRING_OPS = ("BINUNICODE", "SHORT_BINUNICODE", "SHORT_BINSTRING", "BINSTRING")
_PUT_OPS = ("BINPUT", "LONG_BINPUT")


def _legacy_module_record(record):
    if (isinstance(record, tuple) and len(record) >= 2
            and isinstance(record[1], type) and issubclass(record[1], Inert)):
        return record[1]
    raise pickle.UnpicklingError("malformed legacy module record")


def _module_record_spans(f) -> list[tuple[int, int]]:
    """(MARK, BINPERSID) offsets of each module record in the pickle at f.

    A record is MARK <'module'> <class> <file> <source> TUPLE [BINPUT]
    BINPERSID; 'module' is a string the first time and a memo fetch after.
    Only opcodes are parsed here; nothing is built or called.
    """
    marks, first_after, module_memo, spans = [], {}, set(), []
    last, record_mark = ("", None), None
    for op, arg, pos in pickletools.genops(f):
        if last[0] == "MARK":
            first_after[marks[-1]] = (op.name, arg)
        if op.name in _PUT_OPS and _is_module_string(last):
            module_memo.add(arg)
        if op.name == "BINPERSID" and record_mark is not None:
            spans.append((record_mark, pos))
        if op.name not in _PUT_OPS:
            record_mark = None
        if op.name == "MARK":
            marks.append(pos)
        elif pickletools.markobject in op.stack_before:
            mark = marks.pop()
            first = first_after.get(mark, ("", None))
            if op.name == "TUPLE" and (_is_module_string(first) or (
                    first[0].endswith("GET") and first[1] in module_memo)):
                record_mark = mark
        last = (op.name, arg)
    return spans


def _is_module_string(op_and_arg) -> bool:
    return op_and_arg[0] in _STRING_OPS and op_and_arg[1] in ("module", b"module")


def _without_module_records(f) -> io.BufferedReader:
    """The legacy file at f with its module records rewritten (see above)."""
    for _ in range(3):  # magic number, protocol version, system info
        for _ in pickletools.genops(f):
            pass
    start = f.tell()
    spans = _module_record_spans(f)
    end = f.tell()
    f.seek(start)
    main = f.read(end - start)
    f.seek(0)
    pieces, at = [f.read(start)], 0
    for mark, persid in spans:
        mark, persid = mark - start, persid - start
        pieces += [main[at:mark], _RECORD_CALL, main[mark:persid], _TUPLE1_REDUCE]
        at = persid + 1
    pieces.append(main[at:])
    return io.BufferedReader(_Spliced(b"".join(pieces), f, end), 1 << 20)


class _Spliced(io.RawIOBase):
    """Read-only file made of `head`, then the bytes of `f` from `tail_at` on
    (so the tensors of a large file are not copied in memory first)."""

    def __init__(self, head: bytes, f, tail_at: int):
        super().__init__()
        self._head, self._f, self._tail_at, self._pos = head, f, tail_at, 0
        self._size = len(head) + os.fstat(f.fileno()).st_size - tail_at

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        if self._pos < len(self._head):
            data = self._head[self._pos:self._pos + len(view)]
            view[:len(data)] = data
            count = len(data)
        else:
            self._f.seek(self._tail_at + self._pos - len(self._head))
            count = self._f.readinto(view) or 0
        self._pos += count
        return count


_SAFE_GLOBALS = _STAND_INS + [
    (_no_backend, "torch.nn.backends.thnn._get_thnn_function_backend"),
    (_legacy_module_record, _RECORD_CALLEE),
]


_GLOBAL_RE = re.compile(r"GLOBAL (\S+?)(?: was not an allowed global| whose module)")
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue",
                      "Check the documentation", "In PyTorch 2.6")


def read_checkpoint(path) -> object:
    """torch.load the file with the weights-only unpickler, or raise CheckpointError."""
    name = os.fspath(path)
    if not os.path.exists(name):
        raise CheckpointError(f"{name}: no such file")
    if os.path.isdir(name):
        raise CheckpointError(f"{name}: is a directory, not a checkpoint file")
    try:
        # An open file rather than a path: torch >= 2.13 would otherwise pick
        # a loader by file suffix (.safetensors) and behave unlike 2.11.
        f = open(name, "rb")
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    with f:
        try:
            try:
                return _weights_only_load(f)
            except pickle.UnpicklingError as exc:
                if _LEGACY_MODULE_REFUSAL not in str(exc):
                    raise
            f.seek(0)
            return _weights_only_load(_without_module_records(f))
        except Exception as exc:  # torch raises many types for bad files
            raise _explain_load_failure(name, exc) from exc


class _NewerProtocol(Exception):
    """torch's safe loader stopped in a pickle of a protocol it does not fully read."""


def _weights_only_load(f) -> object:
    with torch.serialization.safe_globals(_SAFE_GLOBALS), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")   # recorded, not printed: the error says what matters
        try:
            # mmap=False: mmap is refused for the older non-zip format, and a
            # global torch config could otherwise switch it on.
            return torch.load(f, map_location="cpu", weights_only=True, mmap=False)
        except Exception as e:
            protocol = [w for w in said if "pickle protocol" in str(w.message)]
            if protocol:
                raise _NewerProtocol(str(protocol[0].message)) from e
            raise


def _explain_load_failure(name: str, exc: Exception) -> CheckpointError:
    text = str(exc)
    match = _GLOBAL_RE.search(text)
    if match:
        found = match.group(1)
        if found.startswith("glow_old."):
            return CheckpointError(
                f"{name}: is an early WaveGlow release ({found}) whose flows differ "
                "from current WaveGlow; use waveglow_256channels_universal_v5.pt or newer")
        return CheckpointError(
            f"{name}: refused: the file names the Python object '{found}', which a "
            "Tacotron2/WaveGlow checkpoint does not need and which could run code; "
            "re-download the checkpoint from its publisher")
    if isinstance(exc, _NewerProtocol):
        protocol = re.search(r"protocol (\d+)", text)
        return CheckpointError(
            f"{name}: saved with pickle protocol {protocol[1] if protocol else 'other than 2'}, which torch's "
            "safe loader cannot read; load it in Python and save it again with torch.save's default protocol")
    if "TorchScript" in text:
        return CheckpointError(
            f"{name}: is a TorchScript archive, not a checkpoint; "
            "save the model's state_dict() with torch.save instead")
    if os.path.getsize(name) == 0:
        return CheckpointError(f"{name}: is empty (0 bytes); download it again")
    return CheckpointError(
        f"{name}: not a PyTorch checkpoint, or cut short or damaged (download it "
        f"again); torch reported {_one_line(exc)}")


def _one_line(exc: Exception) -> str:
    """The first sentence of an exception message, without torch's advice."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line and not line.startswith(_TORCH_BOILERPLATE):
            return f"{type(exc).__name__}: {line.split('. ')[0][:160]}"
    return type(exc).__name__
