"""Checkpoint files no publisher would write: pickled objects with any state
(or none), pickles made of arbitrary opcodes, torch archives with entries
missing, doubled or damaged. For the tests that feed them to the loader."""
from __future__ import annotations

import copyreg
import io
import pickle
import struct
import sys
import types
import warnings
import zipfile

import torch
from torch import nn

import checkpoint_files as cf

NO_STATE = object()


class Pickled:
    """Pickles as an instance of ``cls`` made by NEWOBJ (no constructor runs)
    and, unless ``state`` is NO_STATE, given ``state`` by BUILD."""

    def __init__(self, cls: type, state=NO_STATE):
        self.cls, self.state = cls, state

    @property
    def __class__(self):   # what pickle checks NEWOBJ's class against
        return self.cls

    def __reduce_ex__(self, protocol):
        if self.state is NO_STATE:
            return copyreg.__newobj__, (self.cls,)
        return copyreg.__newobj__, (self.cls,), self.state


def glow_class(name: str) -> type:
    """NVIDIA's ``glow.<name>``, as a class to pickle (see save)."""
    return type(name, (), {"__module__": "glow", "__qualname__": name})


GLOW = {name: glow_class(name) for name in ("WaveGlow", "WN", "Invertible1x1Conv")}


def as_pickled(module: nn.Module):
    """A module tree as Pickled nodes whose states are the modules' __dict__
    (children converted too): what torch.save of the module writes."""
    name = type(module).__qualname__
    cls = GLOW[name] if type(module).__module__ == "glow" else type(module)
    state = {}
    for key, value in vars(module).items():
        if key == "_modules":
            value = {k: as_pickled(m) for k, m in value.items()}
        state[key] = value
    return Pickled(cls, state)


def published_waveglow(sd: dict) -> Pickled:
    """The pickled module tree of NVIDIA's WaveGlow file for canonical ``sd``."""
    return as_pickled(cf._GlowWaveGlow(sd, per_layer_cond=False))


def save(path, obj, legacy: bool = False) -> None:
    """torch.save, with NVIDIA's ``glow`` module present while it writes."""
    glow = types.ModuleType("glow")
    for name, cls in GLOW.items():
        setattr(glow, name, cls)
    sys.modules["glow"] = glow
    try:
        torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    finally:
        del sys.modules["glow"]


def zip_archive(entries: list[tuple[str, bytes]]) -> bytes:
    """A torch zip archive (uncompressed, as torch writes it) of ``entries``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a doubled entry is meant
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


def zip_entries(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def legacy_file(main_pickle: bytes, storage_keys: list[str], storages: bytes) -> bytes:
    """torch's pre-1.6 layout: magic number, protocol, system info, the
    object's pickle, the storage keys, then the storages' raw bytes."""
    head = b"".join(pickle.dumps(x, protocol=2) for x in (
        0x1950A86A20F9469CFC6C, 1001,
        {"protocol_version": 1001, "little_endian": True,
         "type_sizes": {"short": 2, "int": 4, "long": 4}}))
    return head + main_pickle + pickle.dumps(storage_keys, protocol=2) + storages


# Opcodes for arbitrary pickles: those that build containers and call things,
# with the arguments each needs.
def opcode(name: str, arg=None) -> bytes:
    op = getattr(pickle, name)
    if name in ("BININT1", "BINPUT", "BINGET"):
        return op + bytes([arg % 256])
    if name in ("BININT", "LONG_BINPUT", "LONG_BINGET"):
        return op + struct.pack("<i" if name == "BININT" else "<I", arg)
    if name == "BINUNICODE":
        data = arg.encode("utf-8", "surrogatepass")
        return op + struct.pack("<I", len(data)) + data
    if name == "SHORT_BINBYTES":
        return op + bytes([len(arg)]) + arg
    if name == "GLOBAL":
        return op + arg.replace(" ", "\n").encode() + b"\n"   # "module name"
    return op
